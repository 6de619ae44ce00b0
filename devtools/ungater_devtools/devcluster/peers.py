"""Runs the real peers beside the local control plane: Kueue, the KubeRay operator and the
JobSet controller, each as it is deployed (its own namespace, service account and RBAC from its
module's manifests, its webhooks registered with the API server), but on loopback.

Everything is read from the peers' Go modules in the module cache and rendered the way their
kustomizations would render it (name prefix, namespace, the webhook patches), except that each
webhook's ``clientConfig`` points at ``https://127.0.0.1:<port><path>`` with a CA made for this
cluster.  Each peer authenticates with a token of its own service account, so its RBAC is the
upstream one and an admission policy can target it by name.  Everything lands in the control
plane's state directory; the processes are the control plane's, stopped with it by pid.

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
import copy
import http.client
import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ungater_devtools.devcluster import versions
from ungater_devtools.devcluster.peerbuild import PeerBinary, ensure_peers, select_peers

if TYPE_CHECKING:
    from ungater_devtools.devcluster.cluster import LocalControlPlane

__all__ = [
    "DEFAULT_FLAVOR",
    "JOBSET_NAMESPACE",
    "KUBERAY_NAMESPACE",
    "KUEUE_INTEGRATIONS",
    "KUEUE_NAMESPACE",
    "PEER_NAMES",
    "Peers",
    "create_default_flavor",
    "create_queues",
    "delete_queues",
    "queued_job",
    "service_account_user",
    "set_quota",
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
_POLL_S = 0.2

Log = Callable[[str], None]


def service_account_user(namespace: str, name: str) -> str:
    """The user name the API server gives a service account's tokens."""
    return f"system:serviceaccount:{namespace}:{name}"


def _load_all(path: Path) -> list[dict[str, Any]]:
    import yaml

    return [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]


def _kustomization(directory: Path) -> dict[str, Any]:
    import yaml

    data = yaml.safe_load((directory / "kustomization.yaml").read_text())
    return data if isinstance(data, dict) else {}


_NAMESPACED = {"ServiceAccount", "Role", "RoleBinding", "Secret", "Service"}


def render_rbac(
    directory: Path,
    *,
    prefix: str,
    namespace: str,
    renamed: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """The RBAC objects of a kustomization directory, with its name prefix and namespace.

    Only what ``resources`` lists is read, the way kustomize would; names, role references and
    service-account subjects get the prefix, namespaced objects and subjects the namespace.
    ``renamed`` maps other objects' old names to their rendered ones in the rules'
    ``resourceNames`` (Kueue v0.19's ``config/default`` teaches kustomize that for its webhook
    configurations, which its cert rotator may update only by name).
    """
    objects: list[dict[str, Any]] = []
    for resource in _kustomization(directory).get("resources") or ():
        for doc in _load_all(directory / str(resource)):
            obj = copy.deepcopy(doc)
            meta = obj.setdefault("metadata", {})
            meta["name"] = prefix + meta["name"]
            if obj.get("kind") in _NAMESPACED:
                meta["namespace"] = namespace
            ref = obj.get("roleRef")
            if isinstance(ref, dict):
                ref["name"] = prefix + ref["name"]
            for subject in obj.get("subjects") or ():
                if subject.get("kind") == "ServiceAccount":
                    subject["name"] = prefix + subject["name"]
                    subject["namespace"] = namespace
            for rule in obj.get("rules") or ():
                if rule.get("resourceNames") and renamed:
                    rule["resourceNames"] = [renamed.get(n, n) for n in rule["resourceNames"]]
            objects.append(obj)
    return objects


def _apply_webhook_patch(configs: dict[str, dict[str, Any]], patch: dict[str, Any]) -> None:
    """A strategic-merge patch of a webhook configuration: webhooks merged by name."""
    target = configs.get(patch.get("metadata", {}).get("name", ""))
    if target is None:
        return
    by_name = {w["name"]: w for w in target.get("webhooks") or ()}
    for change in patch.get("webhooks") or ():
        hook = by_name.get(change.get("name"))
        if hook is not None:
            hook.update({k: v for k, v in change.items() if k != "name"})


def _apply_json6902(config: dict[str, Any], ops: Iterable[dict[str, Any]]) -> None:
    """The ``replace``/``add`` operations on ``/webhooks/<i>`` that the peers' patches use."""
    for op in ops:
        parts = str(op["path"]).strip("/").split("/")
        if len(parts) != 2 or parts[0] != "webhooks" or op["op"] not in ("replace", "add"):
            raise ValueError(f"unsupported webhook patch operation {op}")
        hooks = config.setdefault("webhooks", [])
        index = len(hooks) if parts[1] == "-" else int(parts[1])
        if op["op"] == "replace":
            hooks[index] = copy.deepcopy(op["value"])
        else:
            hooks.insert(index, copy.deepcopy(op["value"]))


def _webhook_field(config: dict[str, Any], field_path: str) -> tuple[Any, str]:
    """The webhook and key a ``webhooks.[name=<hook>].<key>`` field path names."""
    head, _, rest = field_path.partition(".[name=")
    hook_name, _, key = rest.partition("].")
    if head != "webhooks" or not hook_name or not key or "." in key:
        raise ValueError(f"unsupported replacement field path {field_path!r}")
    for hook in config.get("webhooks") or ():
        if hook.get("name") == hook_name:
            return hook, key
    raise ValueError(f"{config['metadata']['name']} has no webhook {hook_name} ({field_path})")


def _apply_replacements(
    configs: dict[str, dict[str, Any]], replacements: Iterable[dict[str, Any]]
) -> None:
    """Kustomize ``replacements`` between webhook configurations: copy one webhook's field
    (e.g. Kueue v0.19's pod webhook ``namespaceSelector``) onto the named webhooks."""

    def config_of(ref: dict[str, Any]) -> dict[str, Any]:
        config = configs.get(str(ref.get("name")))
        if config is None or config.get("kind") != ref.get("kind"):
            raise ValueError(f"replacement names no webhook configuration here: {ref}")
        return config

    for replacement in replacements:
        source = replacement["source"]
        hook, key = _webhook_field(config_of(source), source["fieldPath"])
        if key not in hook:
            raise ValueError(f"replacement source {source} has no value")
        for target in replacement.get("targets") or ():
            config = config_of(target["select"])
            for field_path in target.get("fieldPaths") or ():
                create = bool((target.get("options") or {}).get("create"))
                dest, dest_key = _webhook_field(config, field_path)
                if dest_key in dest or create:
                    dest[dest_key] = copy.deepcopy(hook[key])


def render_webhooks(
    directory: Path, *, prefix: str, port: int, ca_bundle: bytes
) -> list[dict[str, Any]]:
    """A peer's webhook configurations as its kustomization renders them, served by URL.

    Each webhook's ``clientConfig.service`` (name, namespace, path) becomes
    ``url: https://127.0.0.1:<port><path>`` with the given CA bundle.
    """
    import yaml

    configs = {d["metadata"]["name"]: d for d in _load_all(directory / "manifests.yaml")}
    kustomization = _kustomization(directory)
    for entry in kustomization.get("patches") or ():
        if "patch" in entry:
            _apply_webhook_patch(configs, yaml.safe_load(entry["patch"]))
        elif "path" in entry:
            data = yaml.safe_load((directory / entry["path"]).read_text())
            target = (entry.get("target") or {}).get("name")
            if isinstance(data, list) and target in configs:
                _apply_json6902(configs[target], data)
            elif isinstance(data, dict):
                _apply_webhook_patch(configs, data)
    _apply_replacements(configs, kustomization.get("replacements") or ())
    bundle = base64.b64encode(ca_bundle).decode()
    rendered = []
    for name, config in configs.items():
        config["metadata"] = {"name": prefix + name}
        for hook in config.get("webhooks") or ():
            path = ((hook.get("clientConfig") or {}).get("service") or {}).get("path", "/")
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": bundle}
        rendered.append(config)
    return rendered


def _crd_conversion_targets(crd_dir: Path) -> set[str]:
    """The CRDs whose kustomization turns on a conversion webhook (``webhook_in_*`` patches)."""
    names: set[str] = set()
    for entry in _kustomization(crd_dir).get("patches") or ():
        path = str(entry.get("path", "")) if isinstance(entry, dict) else ""
        if "webhook_in_" in path:
            for doc in _load_all(crd_dir / path):
                names.add(doc["metadata"]["name"])
    return names


class Peers:
    """Kueue, the KubeRay operator and the JobSet controller on one :class:`LocalControlPlane`.

    Made and started by the control plane (``LocalControlPlane(peers=...)``); the processes are
    the plane's own (``plane.processes``), so its ``stop()`` ends them, newest first.
    """

    def __init__(
        self,
        plane: LocalControlPlane,
        names: Sequence[str] = PEER_NAMES,
        *,
        binaries: dict[str, PeerBinary] | None = None,
        kueue_version: str | None = None,
        kueue_feature_gates: dict[str, bool] | None = None,
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
            converted = _crd_conversion_targets(
                self.binaries["kueue"].module_dir / "config/components/crd"
            )
        bundle = base64.b64encode(self._authority.ca_pem).decode()
        out = self.directory / "crds"
        out.mkdir(parents=True, exist_ok=True)
        rendered: list[Path] = []
        for path in self.crd_paths():
            docs = _load_all(path)
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
        self.plane.install_crds(rendered)

    # ----------------------------------------------------------------- API helpers
    def _apply(self, obj: dict[str, Any]) -> None:
        """Create ``obj`` (or replace it when it exists) as the admin."""
        from ungater_devtools.devcluster.cluster import ControlPlaneStartError

        path = _collection_path(obj)
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
        from ungater_devtools.devcluster import pki
        from ungater_devtools.devcluster.cluster import ControlPlaneStartError

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
        from ungater_devtools.devcluster import pki

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
        from ungater_devtools.devcluster.cluster import free_port

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
        webhook_configs = _load_all(root / "webhook" / "manifests.yaml")
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
            "clientConnection": {"qps": 50, "burst": 100},
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


def _collection_path(obj: dict[str, Any]) -> str:
    api_version = str(obj["apiVersion"])
    kind = str(obj["kind"])
    plural = {
        "ServiceAccount": "serviceaccounts",
        "Secret": "secrets",
        "Namespace": "namespaces",
        "ClusterRole": "clusterroles",
        "ClusterRoleBinding": "clusterrolebindings",
        "Role": "roles",
        "RoleBinding": "rolebindings",
        "MutatingWebhookConfiguration": "mutatingwebhookconfigurations",
        "ValidatingWebhookConfiguration": "validatingwebhookconfigurations",
        "ResourceFlavor": "resourceflavors",
        "ClusterQueue": "clusterqueues",
        "LocalQueue": "localqueues",
    }[kind]
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    ns = obj["metadata"].get("namespace")
    if ns and kind not in ("Namespace", "ClusterRole", "ClusterRoleBinding"):
        return f"{prefix}/namespaces/{ns}/{plural}"
    return f"{prefix}/{plural}"


KUEUE_API = "/apis/kueue.x-k8s.io/v1beta2"
DEFAULT_FLAVOR = "default-flavor"


def create_default_flavor(plane: LocalControlPlane) -> None:
    """The one ResourceFlavor every test ClusterQueue uses (no node labels: nothing to match)."""
    status, body = plane.request(
        "POST",
        f"{KUEUE_API}/resourceflavors",
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": DEFAULT_FLAVOR},
        },
    )
    if status not in (201, 409):
        raise RuntimeError(f"creating ResourceFlavor {DEFAULT_FLAVOR}: HTTP {status}: {body}")


#: memory is covered too, far beyond any test's need: from v0.19 Kueue counts the Ray
#: autoscaler sidecar (500m CPU, 512Mi) in a RayJob's or RayService's head pod set, and a
#: queue without memory leaves that inadmissible ("resource memory unavailable")
QUEUE_MEMORY = "1Ti"


def cluster_queue_object(name: str, cpu: int, namespace: str | None = None) -> dict[str, Any]:
    """A ClusterQueue with ``cpu`` CPUs (and :data:`QUEUE_MEMORY`) of the default flavor, open
    to every namespace or, with ``namespace``, to that one alone."""
    selector = {"matchLabels": {"kubernetes.io/metadata.name": namespace}} if namespace else {}
    resources = [
        {"name": "cpu", "nominalQuota": str(cpu)},  # first: set_quota changes it
        {"name": "memory", "nominalQuota": QUEUE_MEMORY},
    ]
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": selector,
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "memory"],
                    "flavors": [{"name": DEFAULT_FLAVOR, "resources": resources}],
                }
            ],
        },
    }


def local_queue_object(namespace: str, name: str, cluster_queue: str) -> dict[str, Any]:
    """A LocalQueue ``name`` in ``namespace`` onto ``cluster_queue``."""
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterQueue": cluster_queue},
    }


def create_queues(
    plane: LocalControlPlane,
    namespace: str,
    *,
    cluster_queue: str,
    cpu: int,
    local_queue: str = "user-queue",
) -> None:
    """A ClusterQueue with ``cpu`` CPUs of the default flavor and a LocalQueue onto it."""
    for path, obj in (
        (f"{KUEUE_API}/clusterqueues", cluster_queue_object(cluster_queue, cpu)),
        (
            f"{KUEUE_API}/namespaces/{namespace}/localqueues",
            local_queue_object(namespace, local_queue, cluster_queue),
        ),
    ):
        status, body = plane.request("POST", path, obj)
        if status != 201:
            raise RuntimeError(f"creating {obj['kind']} {cluster_queue}: HTTP {status}: {body}")


def queued_job(
    name: str,
    parallelism: int,
    completions: int | None = None,
    *,
    gate: str | None = None,
    elastic: bool = True,
    queue: str = "user-queue",
) -> dict[str, Any]:
    """An Indexed Job in ``queue`` (the LocalQueue of ``create_queues``), 1 CPU per pod,
    ``completions`` defaulting to ``parallelism``. Elastic marks it for Kueue's workload
    slices; ``gate`` is put in its pod template (with none, only Kueue's webhook gates its
    pods). The image is never pulled: the local control plane has no nodes."""
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [
            {
                "name": "main",
                "image": "registry.invalid/trainer:1",
                "resources": {"requests": {"cpu": "1"}},
            }
        ],
    }
    if gate is not None:
        pod = {"schedulingGates": [{"name": gate}], **pod}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "labels": {"kueue.x-k8s.io/queue-name": queue},
            "annotations": {"kueue.x-k8s.io/elastic-job": "true"} if elastic else {},
        },
        "spec": {
            "parallelism": parallelism,
            "completions": parallelism if completions is None else completions,
            "completionMode": "Indexed",
            "template": {"spec": pod},
        },
    }


def set_quota(plane: LocalControlPlane, cluster_queue: str, cpu: int) -> None:
    """Change a ClusterQueue's CPU quota (to free or take away capacity mid-test)."""
    status, body = plane.request(
        "PATCH",
        f"{KUEUE_API}/clusterqueues/{cluster_queue}",
        [
            {
                "op": "replace",
                "path": "/spec/resourceGroups/0/flavors/0/resources/0/nominalQuota",
                "value": str(cpu),
            }
        ],
        content_type="application/json-patch+json",
    )
    if status != 200:
        raise RuntimeError(f"setting quota of {cluster_queue}: HTTP {status}: {body}")


def delete_queues(plane: LocalControlPlane, namespace: str, *, cluster_queue: str) -> None:
    """Delete the ClusterQueue (its LocalQueue goes with the namespace)."""
    plane.request("DELETE", f"{KUEUE_API}/clusterqueues/{cluster_queue}")
