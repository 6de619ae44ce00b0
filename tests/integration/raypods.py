"""Ray pods made by hand, as the KubeRay operator labels them, for the tests that play KubeRay."""

from __future__ import annotations

from typing import Any

from tests.objects import GATE
from ungater.testing import owner_ref

CONTAINER = {"name": "main", "image": "registry.invalid/trainer:1"}


def ray_pod(
    rc: dict[str, Any], name: str, labels: dict[str, str], owned: bool = True
) -> dict[str, Any]:
    base = {
        "ray.io/cluster": rc["metadata"]["name"],
        "app.kubernetes.io/created-by": "kuberay-operator",
        "app.kubernetes.io/name": "kuberay",
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {**base, **labels},
            "ownerReferences": [owner_ref(rc)] if owned else [],
        },
        "spec": {"schedulingGates": [{"name": GATE}], "containers": [CONTAINER]},
    }
