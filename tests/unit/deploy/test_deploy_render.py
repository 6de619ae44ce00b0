"""The deploy files without a cluster or helm: the committed plain manifests (deploy/manifests),
the chart's values (deploy/helm/ungater) and the image recipe (deploy/Dockerfile).

The least-privilege checks here are shared with tests/integration/test_deploy.py, which applies
them to the chart as `helm template` renders it and to the real API server.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from ungater._model.config import DEFAULT_GATE, DEFAULT_LEASE_NAMESPACE, Config, default_lease_name

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "ungater"
MANIFESTS = DEPLOY / "manifests"
NAMESPACE = "ungater-system"
UID = 65532

#: Config keys the manifests already use but ungater._model.config may not know yet (leader
#: election and the HTTP server are being integrated). A key leaves this set's exemption by
#: itself: once Config has the field, the manifests' values are validated like any other.

Rule = tuple[str, str, str, str | None]  # (apiGroup, resource, verb, resourceName or None)

#: Exactly what the controller needs cluster-wide (or in each watched namespace).
CLUSTER_RULES: frozenset[Rule] = frozenset(
    {("", "pods", v, None) for v in ("get", "list", "watch", "patch")}
    | {("kueue.x-k8s.io", "workloads", v, None) for v in ("get", "list", "watch")}
    | {("batch", "jobs", v, None) for v in ("get", "list", "watch")}
    | {("jobset.x-k8s.io", "jobsets", v, None) for v in ("get", "list", "watch")}
    | {("ray.io", "rayclusters", v, None) for v in ("get", "list", "watch")}
    | {("", "events", v, None) for v in ("create", "patch")}
    | {
        ("admissionregistration.k8s.io", r, v, None)
        for r in ("validatingadmissionpolicies", "validatingadmissionpolicybindings")
        for v in ("get", "list")
    }
)
FORBIDDEN_VERBS = frozenset(
    {"delete", "deletecollection", "update", "escalate", "bind", "impersonate"}
)


def leader_election_rules(lease_name: str) -> frozenset[Rule]:
    """Exactly what the controller needs in its own namespace."""
    return frozenset(
        {("coordination.k8s.io", "leases", "create", None)}
        | {("coordination.k8s.io", "leases", v, lease_name) for v in ("get", "update", "patch")}
        | {("", "events", v, None) for v in ("create", "patch")}
    )


# -- loading --------------------------------------------------------------------------------


def load_documents(texts: Iterable[str]) -> list[dict[str, Any]]:
    return [d for text in texts for d in yaml.safe_load_all(text) if d]


def plain_objects() -> list[dict[str, Any]]:
    files = sorted(MANIFESTS.glob("*.yaml"))
    assert files, f"no manifests in {MANIFESTS}"
    return load_documents(p.read_text() for p in files)


def by_kind(objects: Iterable[Mapping[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [dict(o) for o in objects if o.get("kind") == kind]


def one(objects: Iterable[Mapping[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def rendered_config(objects: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The config file the ConfigMap carries."""
    cm = one(objects, "ConfigMap")
    raw = yaml.safe_load(cm["data"]["config.yaml"])
    assert isinstance(raw, dict)
    return raw


def config_keys(model: type[BaseModel] = Config) -> set[str]:
    return {f.alias or name for name, f in model.model_fields.items()}


def validated_config(raw: Mapping[str, Any]) -> Config:
    return Config.model_validate(raw)


# -- RBAC checks (shared with the integration tests) ------------------------------------------


def flatten_rules(rules: Iterable[Mapping[str, Any]]) -> set[Rule]:
    out: set[Rule] = set()
    for rule in rules:
        assert not rule.get("nonResourceURLs"), f"nonResourceURLs granted: {rule}"
        names = rule.get("resourceNames") or [None]
        for group in rule.get("apiGroups") or []:
            for resource in rule.get("resources") or []:
                for verb in rule.get("verbs") or []:
                    for name in names:
                        out.add((group, resource, verb, name))
    return out


def assert_least_privilege(role: Mapping[str, Any], expected: frozenset[Rule]) -> None:
    """No wildcard, no secrets, no delete, and exactly the expected (group, resource, verb)."""
    rules = role.get("rules") or []
    flat = flatten_rules(rules)
    where = f"{role.get('kind')} {role['metadata']['name']}"
    wild = sorted(r for r in flat if "*" in (r[0], r[1], r[2]))
    assert not wild, f"{where} grants wildcards: {wild}"
    secrets = sorted(r for r in flat if r[1].startswith("secrets") or r[1] == "configmaps")
    assert not secrets, f"{where} grants secrets or configmaps: {secrets}"
    deletes = sorted(r for r in flat if r[2] in FORBIDDEN_VERBS and r[1] != "leases")
    assert not deletes, f"{where} grants forbidden verbs: {deletes}"
    assert not any(r[2] in {"delete", "deletecollection"} for r in flat), f"{where} can delete"
    assert flat == set(expected), (
        f"{where}: extra {sorted(flat - expected, key=str)}, "
        f"missing {sorted(expected - flat, key=str)}"
    )
    assert not role.get("aggregationRule"), f"{where} aggregates other roles"


def lease_name(objects: Iterable[Mapping[str, Any]]) -> str:
    le = rendered_config(objects).get("leaderElection") or {}
    return str(le.get("leaseName") or "")


def lease_namespace(objects: Iterable[Mapping[str, Any]]) -> str:
    le = rendered_config(objects).get("leaderElection") or {}
    return str(le.get("namespace") or "")


def check_rbac(objects: list[dict[str, Any]], namespace: str = NAMESPACE) -> None:
    """The ClusterRole and the leader-election Role are least privilege and bound to the
    controller's ServiceAccount; nothing else grants anything."""
    sa = one(objects, "ServiceAccount")
    subject = {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": namespace}
    cluster_role = one(objects, "ClusterRole")
    assert_least_privilege(cluster_role, CLUSTER_RULES)
    role = one(objects, "Role")
    assert role["metadata"]["namespace"] == lease_namespace(objects)
    assert_least_privilege(role, leader_election_rules(lease_name(objects)))
    bindings = by_kind(objects, "ClusterRoleBinding") + by_kind(objects, "RoleBinding")
    assert bindings
    for b in bindings:
        assert b["subjects"] == [subject], b
        ref = b["roleRef"]
        assert ref["apiGroup"] == "rbac.authorization.k8s.io"
        if ref["kind"] == "Role":
            assert b["kind"] == "RoleBinding"
            assert b["metadata"]["namespace"] == role["metadata"]["namespace"]
            assert ref["name"] == role["metadata"]["name"]
        else:
            assert ref == {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": cluster_role["metadata"]["name"],
            }
    watched = rendered_config(objects).get("namespaces") or []
    crbs = by_kind(objects, "ClusterRoleBinding")
    if watched:
        assert not crbs, "config.namespaces is set: no ClusterRoleBinding"
        bound = sorted(
            b["metadata"]["namespace"]
            for b in by_kind(objects, "RoleBinding")
            if b["roleRef"]["kind"] == "ClusterRole"
        )
        assert bound == sorted(watched)
    else:
        assert len(crbs) == 1, "all namespaces are watched: one ClusterRoleBinding"


def check_deployment(objects: list[dict[str, Any]], namespace: str = NAMESPACE) -> None:
    """The production settings the issue asks for."""
    dep = one(objects, "Deployment")
    assert dep["metadata"]["namespace"] == namespace
    spec = dep["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pod = spec["template"]["spec"]
    labels = spec["template"]["metadata"]["labels"]
    assert all(labels[k] == v for k, v in spec["selector"]["matchLabels"].items())
    assert pod["serviceAccountName"] == one(objects, "ServiceAccount")["metadata"]["name"]
    psc = pod["securityContext"]
    assert psc["runAsNonRoot"] is True
    assert psc["runAsUser"] == UID
    assert psc["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc.get("privileged") in (None, False)
    assert container["args"] == ["run", "--config", "/etc/ungater/config.yaml"]
    res = container["resources"]
    assert res["requests"]["cpu"] and res["requests"]["memory"] and res["limits"]["memory"]
    assert "cpu" not in res.get("limits", {}), "no CPU limit: throttling only delays releases"
    config = rendered_config(objects)
    port = int(str(config["server"]["address"]).rsplit(":", 1)[1])
    (cport,) = container["ports"]
    assert cport["containerPort"] == port
    for probe, path in (
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
        ("startupProbe", "/healthz"),
    ):
        get = container[probe]["httpGet"]
        assert get["path"] == path
        assert get["port"] in (port, cport["name"])
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]["name"]], "/tmp must be an emptyDir"
    cfg_vol = volumes[mounts["/etc/ungater"]["name"]]
    assert cfg_vol["configMap"]["name"] == one(objects, "ConfigMap")["metadata"]["name"]
    writable = [p for p, m in mounts.items() if not m.get("readOnly") and p != "/tmp"]
    assert not writable, f"writable mounts besides /tmp: {writable}"
    anti = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert pod["topologySpreadConstraints"]
    env = {e["name"] for e in container.get("env") or ()}
    assert {"POD_NAME", "POD_NAMESPACE"} <= env
    # two replicas need leader election, or both would release the same gate
    le = config["leaderElection"]
    assert le["enabled"] is True
    assert le["namespace"] == DEFAULT_LEASE_NAMESPACE  # not the release's: one Lease per cluster
    svc = one(objects, "Service")
    assert [p["port"] for p in svc["spec"]["ports"]] == [port]
    assert all(labels[k] == v for k, v in svc["spec"]["selector"].items())
    pdb = one(objects, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == spec["selector"]["matchLabels"]


# -- the plain manifests ---------------------------------------------------------------------


def test_plain_manifests_hold_every_object_once() -> None:
    objects = plain_objects()
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == sorted(
        [
            "Namespace",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "ConfigMap",
            "Deployment",
            "Service",
            "PodDisruptionBudget",
        ]
    )
    assert one(objects, "Namespace")["metadata"]["name"] == NAMESPACE
    for o in objects:
        if o["kind"] in ("Role", "RoleBinding"):  # the Lease's, where every instance finds it
            assert o["metadata"]["namespace"] == DEFAULT_LEASE_NAMESPACE, o["metadata"]
        elif o["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding"):
            assert o["metadata"]["namespace"] == NAMESPACE, o["metadata"]
    # `kubectl apply -f deploy/manifests` reads files in name order: the namespace comes first
    first = sorted(MANIFESTS.glob("*.yaml"))[0]
    assert [d["kind"] for d in load_documents([first.read_text()])] == ["Namespace"]


def test_plain_cluster_role_is_least_privilege() -> None:
    """Exactly pods get/list/watch/patch, workloads get/list/watch, jobs list/watch,
    rayclusters get/list/watch and events create/patch: no wildcards, no secrets, no delete."""
    assert_least_privilege(one(plain_objects(), "ClusterRole"), CLUSTER_RULES)


def test_cluster_role_covers_what_the_built_in_plugins_watch() -> None:
    """Every resource the controller lists and watches for the default kinds (pods, the
    plugins' intermediates and owner resources, Workloads) is granted: a plugin that starts
    watching something new fails here, not with a controller that never syncs on a cluster."""
    from ungater._model.views import Kind
    from ungater._plugins.registry import PluginRegistry

    registry = PluginRegistry.discover()
    needed: set[tuple[str, str]] = {("", "pods"), ("kueue.x-k8s.io", "workloads")}
    for kc in Config().kinds:
        spec = registry.handler(Kind(kc.group, kc.kind), kc.plugin).spec
        for res in (*spec.intermediates, *([spec.owner_resource] if spec.owner_resource else [])):
            needed.add((res.group, res.plural))
    granted = {
        (g, r, v) for g, r, v, _ in flatten_rules(one(plain_objects(), "ClusterRole")["rules"])
    }
    missing = sorted(
        (g, r, v) for g, r in needed for v in ("list", "watch") if (g, r, v) not in granted
    )
    assert not missing, f"the ClusterRole lacks {missing}; add them to the chart's clusterrole.yaml"


def test_plain_rbac_is_bound_to_the_service_account_only() -> None:
    check_rbac(plain_objects())


def test_plain_deployment_is_production_ready() -> None:
    check_deployment(plain_objects())


def test_plain_config_map_is_a_valid_config_file() -> None:
    objects = plain_objects()
    raw = rendered_config(objects)
    config = validated_config(raw)
    assert config.namespaces == []
    # the Lease where `ungater run` anywhere looks for it: one leader per cluster
    assert lease_name(objects) == default_lease_name([DEFAULT_GATE]) == config.lease_name
    assert lease_namespace(objects) == DEFAULT_LEASE_NAMESPACE == config.lease_namespace


def test_config_map_passes_check_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`ungater check-config` accepts the file the ConfigMap mounts."""
    from ungater._cli.main import main

    path = tmp_path / "config.yaml"
    path.write_text(one(plain_objects(), "ConfigMap")["data"]["config.yaml"])
    assert main(["check-config", str(path)]) == 0, capsys.readouterr().err


def test_least_privilege_check_catches_what_it_must() -> None:
    base = one(plain_objects(), "ClusterRole")

    def with_rule(rule: dict[str, Any]) -> dict[str, Any]:
        return {**base, "rules": [*base["rules"], rule]}

    for bad in (
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]},
        {"apiGroups": ["*"], "resources": ["workloads"], "verbs": ["get"]},
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["*"]},
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["update"]},
    ):
        with pytest.raises(AssertionError):
            assert_least_privilege(with_rule(bad), CLUSTER_RULES)


# -- the chart's values ----------------------------------------------------------------------


def chart_values() -> dict[str, Any]:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert isinstance(values, dict)
    return values


def _nested_keys(model: type[BaseModel], prefix: str = "") -> set[str]:
    out: set[str] = set()
    for name, field in model.model_fields.items():
        key = prefix + (field.alias or name)
        out.add(key)
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out |= _nested_keys(ann, key + ".")
    return out


def _value_keys(value: Mapping[str, Any], prefix: str = "") -> set[str]:
    out: set[str] = set()
    for k, v in value.items():
        out.add(prefix + k)
        if isinstance(v, Mapping):
            out |= _value_keys(v, f"{prefix}{k}.")
    return out


def test_values_config_maps_one_to_one_onto_the_config_file() -> None:
    """values.yaml's `config:` spells out every config key, with the config file's names."""
    config = chart_values()["config"]
    known = _nested_keys(Config)
    given = _value_keys(config)
    assert not (given - known), f"not config keys: {sorted(given - known)}"
    assert not (known - given), f"config keys missing from values.yaml: {sorted(known - given)}"
    # the chart fills an empty Lease namespace and name with the controller's own defaults
    le = config["leaderElection"]
    assert (le["namespace"], le["leaseName"]) == ("", "")
    config = {**config, "leaderElection": {**le, "namespace": None, "leaseName": None}}
    # the chart's defaults are the controller's defaults, but for the log format (json)
    dumped = validated_config(config).dump()
    defaults = Config().dump()
    differ = sorted(k for k in defaults if dumped[k] != defaults[k])
    assert differ == ["logging"], differ
    assert dumped["logging"] == {**defaults["logging"], "format": "json"}


def test_values_schema_knows_exactly_the_config_keys() -> None:
    """values.schema.json rejects unknown config keys, like the config file does."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    cfg = schema["definitions"]["config"]
    assert cfg["additionalProperties"] is False
    assert set(cfg["properties"]) == set(chart_values()["config"])

    def strict(node: Mapping[str, Any], path: str) -> None:
        if node.get("type") == "object" and "properties" in node:
            assert node.get("additionalProperties") is False, path
            for k, sub in node["properties"].items():
                strict(sub, f"{path}.{k}")

    strict(cfg, "config")
    assert set(schema["properties"]) == set(chart_values())


# -- the image -------------------------------------------------------------------------------


def test_dockerfile_is_slim_non_root_and_read_only_ready() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    froms = [ln for ln in lines if ln.startswith("FROM ")]
    assert len(froms) >= 2, "multi-stage: build the wheel, copy the venv"
    default_base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.MULTILINE)
    assert default_base and default_base.group(1).startswith("python:3.11-slim")
    images = [default_base.group(1), *(ln.split()[1] for ln in froms)]
    # no registry host in the file: an image is named by repository only
    assert not any("." in img.split("/")[0] and "/" in img for img in images), images
    assert [ln for ln in lines if ln.startswith("USER ")][-1] == f"USER {UID}:{UID}"
    assert 'ENTRYPOINT ["ungater"]' in lines
    assert 'CMD ["run", "--config", "/etc/ungater/config.yaml"]' in lines
    assert "PYTHONDONTWRITEBYTECODE=1" in text
    assert re.search(r"HOME=/tmp", text), "HOME must be writable with a read-only root"
    assert "--invalidation-mode unchecked-hash" in text, "bytecode compiled at build time"
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().split()
    assert "*" in ignore and "!ungater/" in ignore, "the build context is allow-listed"


def test_image_constraints_pin_every_runtime_dependency_exactly() -> None:
    """deploy/constraints.txt pins, with ==, each package `pip install .` brings (followed
    through the installed distributions' metadata), each within what its requirer allows, and
    the Dockerfile installs with it and leaves no build tooling in the runtime stage."""
    import importlib.metadata as md

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pins: dict[str, str] = {}
    for line in (DEPLOY / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep and version.strip(), f"not an exact pin: {line!r}"
            pins[canonicalize_name(name)] = version.strip()
    seen: set[str] = set()
    todo = [Requirement(r) for r in md.requires("ungater") or () if "extra ==" not in r]
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} (needed by the runtime) is not pinned"
        assert req.specifier.contains(pins[name], prereleases=True), (req, pins[name])
        if name not in seen:
            seen.add(name)
            todo += [Requirement(r) for r in md.requires(req.name) or ()]
    assert not set(pins) - seen, f"pinned but not needed: {sorted(set(pins) - seen)}"
    text = (DEPLOY / "Dockerfile").read_text()
    assert "--constraint constraints.txt" in text
    runtime = text.split("# ---- runtime")[1]
    for tool in ("pip", "setuptools", "wheel"):
        assert re.search(rf"rm -rf .*\b{tool}\b", runtime, re.S), f"{tool} left in the runtime"
    assert "!deploy/constraints.txt" in (DEPLOY / "Dockerfile.dockerignore").read_text().split()


def test_operations_doc_covers_install_metrics_and_troubleshooting() -> None:
    text = (ROOT / "docs" / "operations.md").read_text()
    for needle in (
        "kubectl apply -f deploy/manifests",
        "helm install",
        "helm upgrade",
        "ungater explain",
        "/healthz",
        "/readyz",
        "ungater_leader",
        "ungater_pods_released_total",
        "patchConcurrency",
        "expectationsTimeoutSeconds",
        "One releaser per gate",
    ):
        assert needle in text, needle
