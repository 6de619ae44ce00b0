"""Admission checks' pod set updates on the real API server: applied in the same patch as the
gate removal (the API server must accept adding node selector entries to a gated pod), never
on gated pods, and a conflicting pod stays gated with its reason shown by `ungater explain`."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import anyio
import pytest

from tests.integration.k8s import RAYCLUSTERS, Kube
from tests.integration.raypods import CONTAINER, ray_pod
from tests.integration.support import admit, create_workload
from tests.objects import GATE, PODS, WORKLOADS, gates_of
from tests.polling import eventually, holds_for

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

PROVREQ = {
    "autoscaling.x-k8s.io/consume-provisioning-request": "ray-prov-1",
    "autoscaling.x-k8s.io/provisioning-class-name": "queued-provisioning.gke.io",
}
POOL = "cloud.google.com/gke-nodepool"


async def test_updates_ride_with_the_release_and_conflicts_stay_gated(
    kube: Kube, kube_namespace: str, controller: Any, control_plane: Any
) -> None:
    ns = kube_namespace
    rc = await kube.create(
        RAYCLUSTERS,
        ns,
        {
            "apiVersion": "ray.io/v1",
            "kind": "RayCluster",
            "metadata": {"name": "prov", "annotations": {"kueue.x-k8s.io/elastic-job": "true"}},
            "spec": {
                "headGroupSpec": {
                    "rayStartParams": {},
                    "template": {"spec": {"containers": [CONTAINER]}},
                },
                "workerGroupSpecs": [
                    {
                        "groupName": "gpu",
                        "replicas": 3,
                        "minReplicas": 0,
                        "maxReplicas": 3,
                        "rayStartParams": {},
                        "template": {"spec": {"containers": [CONTAINER]}},
                    }
                ],
            },
        },
    )
    for i in range(3):
        body = ray_pod(
            rc,
            f"prov-gpu-worker-{i}",
            {
                "ray.io/node-type": "worker",
                "ray.io/group": "gpu",
                "ray.io/worker-group-replica-index": str(i),
            },
        )
        if i == 0:
            body["spec"]["nodeSelector"] = {POOL: "some-other-pool"}
        await kube.create(PODS, ns, body)
    await create_workload(kube, rc, "raycluster-prov-a", {"head": 0, "gpu": 3})
    await admit(kube, ns, "raycluster-prov-a", {"head": 0, "gpu": 2})
    update = {
        "name": "gpu",
        "annotations": PROVREQ,
        "nodeSelector": {POOL: "prov-pool"},
        "labels": {"provisioned-by": "prov-check"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }
    await kube.merge_patch(
        WORKLOADS,
        ns,
        "raycluster-prov-a",
        {
            "status": {
                "admissionChecks": [
                    {
                        "name": "prov-check",
                        "state": "Ready",
                        "message": "provisioned",
                        "lastTransitionTime": "2026-01-01T00:00:00Z",
                        "podSetUpdates": [update],
                    }
                ]
            }
        },
        "status",
    )

    async def pod(name: str) -> dict[str, Any]:
        p = await kube.get(PODS, ns, name)
        assert p is not None
        return p

    async with controller():

        async def both_released() -> bool:
            pods = [await pod(f"prov-gpu-worker-{i}") for i in (1, 2)]
            return all(GATE not in gates_of(p) for p in pods)

        await eventually(both_released, what="workers 1 and 2 released")
        for i in (1, 2):
            p = await pod(f"prov-gpu-worker-{i}")
            assert p["spec"]["nodeSelector"] == {POOL: "prov-pool"}
            assert all(p["metadata"]["annotations"][k] == v for k, v in PROVREQ.items())
            assert p["metadata"]["labels"]["provisioned-by"] == "prov-check"
            assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in p[
                "spec"
            ]["tolerations"]

        async def untouched() -> bool:
            p = await pod("prov-gpu-worker-0")
            return (
                GATE in gates_of(p)
                and p["spec"]["nodeSelector"] == {POOL: "some-other-pool"}
                and "autoscaling.x-k8s.io/consume-provisioning-request"
                not in (p["metadata"].get("annotations") or {})
            )

        await holds_for(untouched, 1.0, what="the conflicting pod stays gated and untouched")

    proc = await anyio.to_thread.run_sync(
        lambda: subprocess.run(
            [
                sys.executable,
                "-m",
                "ungater",
                "explain",
                f"{ns}/raycluster-prov-a",
                "--json",
                "--kubeconfig",
                str(control_plane.kubeconfig_path),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    gpu = next(ps for ps in report["podSets"] if ps["name"] == "gpu")
    reasons = {w["pod"]: w["reason"] for w in gpu["waiting"]}
    assert "prov-gpu-worker-0" in reasons
    assert (
        "node selector" in reasons["prov-gpu-worker-0"]
        and "cannot change" in reasons["prov-gpu-worker-0"]
    )
    assert gpu["cap"] == 2 and gpu["liveUngated"] == 2
