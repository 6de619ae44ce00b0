"""The deploy objects as the tests read and judge them, with or without a cluster: where the
chart and the plain manifests are, loading and picking objects, the config a ConfigMap carries,
and the least-privilege and production checks that tests/unit/deploy/test_deploy_render.py runs
on the committed manifests and tests/integration/test_deploy.py on the chart as rendered."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from ungater._model.config import DEFAULT_LEASE_NAMESPACE, Config

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
