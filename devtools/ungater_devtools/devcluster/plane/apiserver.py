"""kube-apiserver for the local control plane: its command line (the flags follow what
controller-runtime's envtest uses)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

__all__ = ["SERVICE_CLUSTER_IP_RANGE", "args"]

SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"


def args(
    binary: Path,
    *,
    etcd_url: str,
    port: int,
    pki: Path,
    server_url: str,
    extra: Sequence[str] = (),
) -> list[str]:
    """An RBAC-authorizing API server on 127.0.0.1:``port`` with the certificates in ``pki``."""
    return [
        str(binary),
        f"--etcd-servers={etcd_url}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={pki}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        "--authorization-mode=RBAC",
        f"--service-account-issuer={server_url}/",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
        "--disable-admission-plugins=ServiceAccount",
        "--allow-privileged=true",
        "--profiling=false",
        *extra,
    ]
