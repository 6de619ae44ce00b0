"""Certificates and kubeconfigs for the local control plane, made with ``cryptography``.

kube-apiserver needs a serving certificate, a CA to verify client certificates against, and a
service-account signing key pair; tests need client certificates for the admin
(``system:masters``) and, for RBAC tests, for arbitrary users and groups.  Everything here is
throw-away material for a loopback-only cluster, valid for a few days.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "CertificateAuthority",
    "IssuedCert",
    "WebhookAuthority",
    "WebhookCertificates",
    "write_kubeconfig",
    "write_service_account_keys",
    "write_token_kubeconfig",
]

_VALIDITY = datetime.timedelta(days=7)
_BACKDATE = datetime.timedelta(minutes=5)


@dataclass(frozen=True)
class IssuedCert:
    """A certificate and its private key, written as PEM files."""

    cert_path: Path
    key_path: Path


def _write_private(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


class CertificateAuthority:
    """A self-signed CA that signs serving and client certificates."""

    def __init__(self, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate, directory: Path):
        self._key = key
        self._cert = cert
        self.directory = directory
        self.cert_path = directory / "ca.crt"
        self.key_path = directory / "ca.key"

    @classmethod
    def create(
        cls, directory: Path, common_name: str = "ungater-devcluster-ca"
    ) -> CertificateAuthority:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
            )
            .sign(key, hashes.SHA256())
        )
        ca = cls(key, cert, directory)
        directory.mkdir(parents=True, exist_ok=True)
        ca.cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_private(ca.key_path, _key_pem(key))
        return ca

    @classmethod
    def load(cls, directory: Path) -> CertificateAuthority:
        cert = x509.load_pem_x509_certificate((directory / "ca.crt").read_bytes())
        key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"unexpected CA key type in {directory}")
        return cls(key, cert, directory)

    @property
    def cert_pem(self) -> bytes:
        return self._cert.public_bytes(serialization.Encoding.PEM)

    def issue(
        self,
        stem: str,
        *,
        common_name: str,
        organizations: Sequence[str] = (),
        dns_names: Sequence[str] = (),
        ip_addresses: Sequence[str] = (),
        server: bool = False,
        client: bool = False,
    ) -> IssuedCert:
        """Sign a fresh key; write ``<stem>.crt`` and ``<stem>.key`` into the CA's directory."""
        key = ec.generate_private_key(ec.SECP256R1())
        attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
        attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        now = datetime.datetime.now(datetime.UTC)
        usages = []
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attributes))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                critical=False,
            )
        )
        if usages:
            builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
        sans.extend(x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses)
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        issued = IssuedCert(self.directory / f"{stem}.crt", self.directory / f"{stem}.key")
        issued.cert_path.parent.mkdir(parents=True, exist_ok=True)
        issued.cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_private(issued.key_path, _key_pem(key))
        return issued


def write_service_account_keys(directory: Path) -> tuple[Path, Path]:
    """An RSA key pair for signing and verifying service-account tokens: (private, public)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = directory / "sa.key"
    public = directory / "sa.pub"
    _write_private(private, _key_pem(key))
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return private, public


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode("ascii")


def write_kubeconfig(
    path: Path,
    *,
    server: str,
    ca_path: Path,
    client: IssuedCert,
    user: str,
    cluster_name: str = "ungater-devcluster",
    namespace: str | None = None,
) -> Path:
    """Write a kubeconfig with every credential embedded (``*-data`` fields)."""
    context: dict[str, Any] = {"cluster": cluster_name, "user": user}
    if namespace:
        context["namespace"] = namespace
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": cluster_name,
                "cluster": {"server": server, "certificate-authority-data": _b64(ca_path)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": _b64(client.cert_path),
                    "client-key-data": _b64(client.key_path),
                },
            }
        ],
        "contexts": [{"name": f"{user}@{cluster_name}", "context": context}],
        "current-context": f"{user}@{cluster_name}",
        "preferences": {},
    }
    import yaml  # a project dependency; imported here to keep module import cheap

    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        yaml.safe_dump(config, handle, sort_keys=False)
    return path


@dataclass(frozen=True)
class WebhookCertificates:
    """PEM material of a webhook server: its CA (RSA, PKCS#1) and its serving pair."""

    ca_cert: bytes
    ca_key: bytes
    cert: bytes
    key: bytes


def _rsa_pkcs1(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


class WebhookAuthority:
    """A CA for the peers' webhook servers, shaped as cert-controller's rotator accepts it.

    Kueue with internal certificate management (its default) adopts the certificates it finds
    in its Secret only if the CA is RSA in PKCS#1, names itself in a DNS SAN and, like the
    serving certificate, is still valid 90 days from now; otherwise it makes its own (for a
    Service DNS name only, which the API server cannot reach here).  Hence RSA and ~1 year,
    unlike the 7-day EC certificates of the control plane itself.
    """

    def __init__(self, name: str = "kueue-ca", validity_days: int = 400) -> None:
        self._validity = datetime.timedelta(days=validity_days)
        self._key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        subject = x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "ungater-devcluster"),
                x509.NameAttribute(NameOID.COMMON_NAME, name),
            ]
        )
        now = datetime.datetime.now(datetime.UTC)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + self._validity + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=True,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .sign(self._key, hashes.SHA256())
        )

    @property
    def ca_pem(self) -> bytes:
        return self._cert.public_bytes(serialization.Encoding.PEM)

    def serve(
        self, dns_names: Sequence[str], ip_addresses: Sequence[str] = ("127.0.0.1",)
    ) -> WebhookCertificates:
        """A serving certificate for the given names (and loopback), signed by this CA."""
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        now = datetime.datetime.now(datetime.UTC)
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
        sans.extend(x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns_names[0])]))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + self._validity)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        return WebhookCertificates(
            ca_cert=self.ca_pem,
            ca_key=_rsa_pkcs1(self._key),
            cert=cert.public_bytes(serialization.Encoding.PEM),
            key=_rsa_pkcs1(key),
        )

    def write(self, certs: WebhookCertificates, directory: Path) -> Path:
        """``tls.crt``, ``tls.key`` and ``ca.crt`` in ``directory`` (a manager's cert dir)."""
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "tls.crt").write_bytes(certs.cert)
        _write_private(directory / "tls.key", certs.key)
        (directory / "ca.crt").write_bytes(certs.ca_cert)
        return directory


def write_token_kubeconfig(
    path: Path, *, server: str, ca_path: Path, token: str, user: str
) -> Path:
    """A kubeconfig authenticating with a bearer token (a service account's)."""
    import yaml

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "ungater-devcluster",
                "cluster": {"server": server, "certificate-authority-data": _b64(ca_path)},
            }
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": user, "context": {"cluster": "ungater-devcluster", "user": user}}],
        "current-context": user,
        "preferences": {},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        yaml.safe_dump(config, handle, sort_keys=False)
    return path
