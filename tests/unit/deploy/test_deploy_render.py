"""The deploy files without a cluster or helm: the committed plain manifests (deploy/manifests),
the chart's values (deploy/helm/ungater) and the image recipe (deploy/Dockerfile).

The least-privilege and production checks live in deploy_checks.py, shared with
tests/integration/test_deploy.py, which applies them to the chart as `helm template` renders it
and to the real API server.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from tests.unit.deploy.deploy_checks import (
    CHART,
    CLUSTER_RULES,
    DEPLOY,
    MANIFESTS,
    NAMESPACE,
    ROOT,
    UID,
    assert_least_privilege,
    check_deployment,
    check_rbac,
    flatten_rules,
    lease_name,
    lease_namespace,
    load_documents,
    one,
    plain_objects,
    rendered_config,
    validated_config,
)
from ungater._model.config import DEFAULT_GATE, DEFAULT_LEASE_NAMESPACE, Config, default_lease_name

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
