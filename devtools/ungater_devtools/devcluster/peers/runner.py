"""Runs the real peers on a running plane: Kueue, the KubeRay operator and the JobSet
controller, each as it is deployed (its own namespace, service account and RBAC from its
module's manifests, its webhooks registered with the API server), but on loopback.

The manifests come from the peers' Go modules in the module cache, rendered by
:mod:`.render`.  Each peer authenticates with a token of its own service account, so its RBAC
is the upstream one and an admission policy can target it by name.  Everything lands in the
plane's state directory; the processes are the plane's, stopped with it by pid.

Which Kueue runs is a choice (:data:`versions.KUEUE_PINS`, ``kueue_version``); the manifests
are always those of the same tree as the binary (for v0.19.2 built from its source archive, the
``config/`` kept beside it), rendered with the kustomizations' patches and ``replacements``.

Kueue runs with internal certificate management on (its default).  With it off, v0.17.0 insists
on a metrics certificate at the fixed path ``/etc/kueue/metrics/certs``; with it on, the metrics
server uses a self-signed certificate in memory, and the certificate rotator adopts the Secret
this module writes (see :class:`ungater_devtools.devcluster.pki.WebhookAuthority`) instead of making a
certificate for a Service name the API server cannot reach here.
"""

from __future__ import annotations

import base64
import http.client
import json
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from ungater_devtools.devcluster import pki, versions
from ungater_devtools.devcluster.crds import install_crds
from ungater_devtools.devcluster.peerbuild import PeerBinary, ensure_peers, select_peers
from ungater_devtools.devcluster.peers.render import (
    collection_path,
    crd_conversion_targets,
    load_all,
    render_rbac,
    render_webhooks,
)
from ungater_devtools.devcluster.plane.plane import ControlPlane
from ungater_devtools.devcluster.ports import free_port
from ungater_devtools.devcluster.process import ControlPlaneStartError

__all__ = [
    "JOBSET_NAMESPACE",
    "KUBERAY_NAMESPACE",
    "KUEUE_INTEGRATIONS",
    "KUEUE_NAMESPACE",
    "PEER_NAMES",
    "Peers",
    "service_account_user",
]

PEER_NAMES: tuple[str, ...] = tuple(p.name for p in versions.PEERS)
KUEUE_NAMESPACE = "kueue-system"
JOBSET_NAMESPACE = "jobset-system"
KUBERAY_NAMESPACE = "kuberay-system"
KUEUE_INTEGRATIONS: tuple[str, ...] = (
    "batch/job",
    "ray.io/raycluster",
    "ray.io/rayjob",
    "ray.io/rayservice",
    "jobset.x-k8s.io/jobset",
)
#: which peer's CRDs an integration needs (Kueue waits for the CRDs of the integrations it has)
_INTEGRATION_PEER = {"ray.io": "kuberay", "jobset.x-k8s.io": "jobset"}
#: Kueue's defaults for these (kustomize prefix "kueue-" on "webhook-service" and the Secret of
#: its internalcert component); the certificate rotator derives the webhook configuration names
#: from the service name.
_KUEUE_SERVICE = "kueue-webhook-service"
_KUEUE_SECRET = "kueue-webhook-server-cert"
_TOKEN_SECONDS = 7 * 24 * 3600
#: Kueue's client limits (qps, burst) here unless the caller names others (``kueue_client``);
#: Kueue's shipped manager config has 300/500 (the benchmark's big wave runs those).
KUEUE_CLIENT: tuple[float, int] = (50, 100)

Log = Callable[[str], None]


def service_account_user(namespace: str, name: str) -> str:
    """The user name the API server gives a service account's tokens."""
    return f"system:serviceaccount:{namespace}:{name}"


class Peers:
    """Kueue, the KubeRay operator and the JobSet controller on one running plane.

    Made and started by :class:`~ungater_devtools.devcluster.environment.LocalControlPlane`
    (``LocalControlPlane(peers=...)``); the processes are the plane's own (``plane.processes``),
    so its ``stop()`` ends them, newest first.
    """

    def __init__(
        self,
        plane: ControlPlane,
        names: Sequence[str] = PEER_NAMES,
        *,
        binaries: dict[str, PeerBinary] | None = None,
        kueue_version: str | None = None,
        kueue_feature_gates: dict[str, bool] | None = None,
        kueue_client: tuple[float, int] = KUEUE_CLIENT,
        log: Log | None = None,
    ) -> None:
        unknown = set(names) - set(PEER_NAMES)
        if unknown:
            raise ValueError(f"unknown peers {sorted(unknown)}; known: {list(PEER_NAMES)}")
        self.plane = plane
        self.names = tuple(n for n in PEER_NAMES if n in names)
        self._binaries = binaries
        self._kueue_version = kueue_version
        self._gates = {
            "ElasticJobsViaWorkloadSlices": True,
            "VisibilityOnDemand": False,
            **(kueue_feature_gates or {}),
        }
        self._kueue_client = kueue_client
        self._log = log or (lambda _: None)
        #: Kueue's integrations: batch/job, and those of the owner controllers that run here
        self.integrations = tuple(
            i
            for i in KUEUE_INTEGRATIONS
            if _INTEGRATION_PEER.get(i.split("/")[0], "kueue") in (*self.names, "kueue")
        )
        self.kubeconfigs: dict[str, Path] = {}
        self.users: dict[str, str] = {}
        self.health_ports: dict[str, int] = {}
        self.metrics_ports: dict[str, int] = {}
        self.webhook_ports: dict[str, int] = {}
        self.seconds: dict[str, float] = {}

    @property
    def directory(self) -> Path:
        return self.plane.state_dir / "peers"

    @property
    def binaries(self) -> dict[str, PeerBinary]:
        if self._binaries is None:
            chosen = select_peers(self._kueue_version, log=self._log)
            wanted = [p for p in chosen if p.name in self.names]
            self._binaries = ensure_peers(wanted, log=self._log)
        return self._binaries

    @property
    def kueue_version(self) -> str:
        """The version of the Kueue that runs here (after any fallback)."""
        return self.binaries["kueue"].peer.version

    # ----------------------------------------------------------------- manifests
    def crd_paths(self) -> list[Path]:
        """Every CRD of the peers that run: all of Kueue's, KubeRay's and JobSet's."""
        paths: list[Path] = []
        bins = self.binaries
        if "kueue" in bins:
            paths += sorted(
                (bins["kueue"].module_dir / "config/components/crd/bases").glob("*.yaml")
            )
        if "kuberay" in bins:
            # not RayCronJob's: its controller is behind an alpha gate that is off by default
            paths += sorted(
                p
                for p in (bins["kuberay"].module_dir / "config/crd/bases").glob("*.yaml")
                if "raycronjobs" not in p.name
            )
        if "jobset" in bins:
            paths += sorted(
                (bins["jobset"].module_dir / "config/components/crd/bases").glob("*.yaml")
            )
        return paths

    def _install_crds(self) -> None:
        """Install the CRDs; Kueue's get the conversion webhooks its kustomization adds."""
        converted: set[str] = set()
        if "kueue" in self.names:
            converted = crd_conversion_targets(
                self.binaries["kueue"].module_dir / "config/components/crd"
            )
        bundle = base64.b64encode(self._authority.ca_pem).decode()
        out = self.directory / "crds"
        out.mkdir(parents=True, exist_ok=True)
        rendered: list[Path] = []
        for path in self.crd_paths():
            docs = load_all(path)
            for doc in docs:
                if doc.get("kind") == "CustomResourceDefinition" and (
                    doc["metadata"]["name"] in converted
                ):
                    doc["spec"]["conversion"] = {
                        "strategy": "Webhook",
                        "webhook": {
                            "conversionReviewVersions": ["v1"],
                            "clientConfig": {
                                "url": f"https://127.0.0.1:{self.webhook_ports['kueue']}/convert",
                                "caBundle": bundle,
                            },
                        },
                    }
            target = out / path.name
            target.write_text("\n---\n".join(json.dumps(d) for d in docs))
            rendered.append(target)
        install_crds(self.plane, rendered)

    # ----------------------------------------------------------------- API helpers
    def _apply(self, obj: dict[str, Any]) -> None:
        """Create ``obj`` (or replace it when it exists) as the admin."""
        path = collection_path(obj)
        status, body = self.plane.request("POST", path, obj, timeout=30)
        if status == 409:
            name = obj["metadata"]["name"]
            status, current = self.plane.request("GET", f"{path}/{name}")
            if status == 200:
                obj = {**obj, "metadata": {**obj["metadata"]}}
                obj["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                status, body = self.plane.request("PUT", f"{path}/{name}", obj, timeout=30)
        if status not in (200, 201):
            raise ControlPlaneStartError(
                f"creating {obj.get('kind')} {obj['metadata'].get('name')}: HTTP {status}: {body}"
            )

    def _namespace(self, name: str) -> None:
        self._apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    def _token_kubeconfig(self, peer: str, namespace: str, account: str) -> Path:
        status, body = self.plane.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": _TOKEN_SECONDS},
            },
        )
        if status != 201:
            raise ControlPlaneStartError(f"token for {namespace}/{account}: HTTP {status}: {body}")
        user = service_account_user(namespace, account)
        self.users[peer] = user
        path = pki.write_token_kubeconfig(
            self.directory / peer / "kubeconfig",
            server=self.plane.server_url,
            ca_path=self.plane.ca_path,
            token=str(body["status"]["token"]),
            user=user,
        )
        self.kubeconfigs[peer] = path
        return path

    # ----------------------------------------------------------------- start
    def start(self) -> None:
        """Install everything, start the peers and wait until each is ready (bounded)."""
        started = time.monotonic()
        self.directory.mkdir(parents=True, exist_ok=True)
        self._authority = pki.WebhookAuthority()
        for name in self.names:
            self._new_ports(name)
        self._install_crds()
        self.seconds["crds"] = round(time.monotonic() - started, 1)
        for name in self.names:
            self._setup(name)
        for name in self.names:
            self.plane.retry_port_race(
                name, partial(self._wait_ready, name), partial(self._restart_on_new_ports, name)
            )
            self.seconds[f"{name} ready"] = round(time.monotonic() - started, 1)
        self.seconds["start"] = round(time.monotonic() - started, 1)

    def _new_ports(self, name: str) -> None:
        self.health_ports[name] = free_port()
        self.metrics_ports[name] = free_port()
        if name != "kuberay":  # its webhooks are optional and off by default
            self.webhook_ports[name] = free_port()

    def _restart_on_new_ports(self, name: str) -> None:
        self._new_ports(name)
        self._setup(name)

    def _setup(self, name: str) -> None:
        setup = {
            "kueue": self._setup_kueue,
            "jobset": self._setup_jobset,
            "kuberay": self._setup_kuberay,
        }[name]
        setup(self.binaries[name])

    def _setup_kueue(self, binary: PeerBinary) -> None:
        import yaml

        root = binary.module_dir / "config/components"
        ns = KUEUE_NAMESPACE
        self._namespace(ns)
        webhook_configs = load_all(root / "webhook" / "manifests.yaml")
        renamed = {d["metadata"]["name"]: "kueue-" + d["metadata"]["name"] for d in webhook_configs}
        for obj in render_rbac(root / "rbac", prefix="kueue-", namespace=ns, renamed=renamed):
            self._apply(obj)
        kubeconfig = self._token_kubeconfig("kueue", ns, "kueue-controller-manager")
        port = self.webhook_ports["kueue"]
        certs = self._authority.serve([f"{_KUEUE_SERVICE}.{ns}.svc", f"{_KUEUE_SERVICE}.{ns}"])
        cert_dir = self._authority.write(certs, self.directory / "kueue" / "certs")
        self._apply(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": _KUEUE_SECRET, "namespace": ns},
                "data": {
                    "ca.crt": base64.b64encode(certs.ca_cert).decode(),
                    "ca.key": base64.b64encode(certs.ca_key).decode(),
                    "tls.crt": base64.b64encode(certs.cert).decode(),
                    "tls.key": base64.b64encode(certs.key).decode(),
                },
            }
        )
        for config in render_webhooks(
            root / "webhook", prefix="kueue-", port=port, ca_bundle=certs.ca_cert
        ):
            self._apply(config)
        configuration = {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "namespace": ns,
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.health_ports['kueue']}"},
            "metrics": {"bindAddress": f"127.0.0.1:{self.metrics_ports['kueue']}"},
            "webhook": {"host": "127.0.0.1", "port": port, "certDir": str(cert_dir)},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {
                "enable": True,
                "webhookServiceName": _KUEUE_SERVICE,
                "webhookSecretName": _KUEUE_SECRET,
            },
            "clientConnection": {"qps": self._kueue_client[0], "burst": self._kueue_client[1]},
            "integrations": {"frameworks": list(self.integrations)},
            "featureGates": dict(self._gates),
        }
        config_path = self.directory / "kueue" / "config.yaml"
        config_path.write_text(yaml.safe_dump(configuration, sort_keys=False))
        self.plane.spawn(
            "kueue",
            [str(binary.path), f"--config={config_path}", "--zap-log-level=2"],
            env={"KUBECONFIG": str(kubeconfig)},
        )

    def _setup_jobset(self, binary: PeerBinary) -> None:
        import yaml

        root = binary.module_dir / "config/components"
        ns = JOBSET_NAMESPACE
        self._namespace(ns)
        for obj in render_rbac(root / "rbac", prefix="jobset-", namespace=ns):
            self._apply(obj)
        kubeconfig = self._token_kubeconfig("jobset", ns, "jobset-controller-manager")
        port = self.webhook_ports["jobset"]
        certs = self._authority.serve([f"jobset-webhook-service.{ns}.svc"])
        cert_dir = self._authority.write(certs, self.directory / "jobset" / "certs")
        for config in render_webhooks(
            root / "webhook", prefix="jobset-", port=port, ca_bundle=certs.ca_cert
        ):
            self._apply(config)
        configuration = {
            "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
            "kind": "Configuration",
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.health_ports['jobset']}"},
            "metrics": {"bindAddress": f"127.0.0.1:{self.metrics_ports['jobset']}"},
            "webhook": {"host": "127.0.0.1", "port": port, "certDir": str(cert_dir)},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "clientConnection": {"qps": 500, "burst": 500},
            "featureGates": {"ElasticJobSet": True},
        }
        config_path = self.directory / "jobset" / "config.yaml"
        config_path.write_text(yaml.safe_dump(configuration, sort_keys=False))
        self.plane.spawn(
            "jobset",
            [str(binary.path), f"--config={config_path}"],
            env={"KUBECONFIG": str(kubeconfig)},
        )

    def _setup_kuberay(self, binary: PeerBinary) -> None:
        ns = KUBERAY_NAMESPACE
        self._namespace(ns)
        for obj in render_rbac(binary.module_dir / "config/rbac", prefix="", namespace=ns):
            self._apply(obj)
        kubeconfig = self._token_kubeconfig("kuberay", ns, "kuberay-operator")
        self.plane.spawn(
            "kuberay",
            [
                str(binary.path),
                f"--metrics-addr=127.0.0.1:{self.metrics_ports['kuberay']}",
                f"--health-probe-bind-address=127.0.0.1:{self.health_ports['kuberay']}",
                "--enable-leader-election=false",
                "--log-stdout-encoder=console",
            ],
            env={"KUBECONFIG": str(kubeconfig)},
        )

    def _wait_ready(self, name: str) -> None:
        port = self.health_ports[name]

        def ready() -> bool:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            try:
                conn.request("GET", "/readyz")
                response = conn.getresponse()
                response.read()
                return response.status == 200
            finally:
                conn.close()

        self.plane.wait_for(name, ready, f"{name} /readyz")
