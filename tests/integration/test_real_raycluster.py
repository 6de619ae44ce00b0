"""RayClusters under the real KubeRay operator v1.6.1 and the real Kueue v0.17.0.

Kueue admits a head pod set and one pod set per worker group (replicas x numOfHosts); the
operator creates and deletes the pods (on scale-down it deletes released workers first).
ungater releases ``UNGATER_GATE`` beside Kueue releasing its own gate (see ``realpeers``).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from tests.integration.k8s import RAYCLUSTERS, Kube
from tests.integration.realpeers import (
    UNGATER_GATE,
    controller_uid,
    elastic_raycluster,
    kueue_pod_set,
    ray_cluster_spec,
    released_by,
    slice_watch,
)
from tests.integration.support import config_for, running_controller
from tests.objects import PODS
from tests.polling import eventually

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


def ray_cluster(name: str, replicas: int, hosts: int = 1) -> dict[str, Any]:
    return elastic_raycluster(name, ray_cluster_spec(replicas, hosts=hosts))


def sizes(rc: dict[str, Any]) -> dict[str, int]:
    if rc["spec"].get("suspend"):
        return {"head": 0}
    out = {"head": 1}
    for g in rc["spec"].get("workerGroupSpecs") or ():
        out[g["groupName"].lower()] = int(g.get("replicas", 0)) * int(g.get("numOfHosts", 1))
    return out


async def scale(kube: Kube, ns: str, name: str, replicas: int) -> None:
    await kube.json_patch(
        RAYCLUSTERS,
        ns,
        name,
        [{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": replicas}],
    )


async def live_pods(kube: Kube, ns: str, rc: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        p
        for p in await kube.list(PODS, ns, f"ray.io/cluster={rc['metadata']['name']}")
        if not p["metadata"].get("deletionTimestamp")
    ]


async def n_workers(kube: Kube, ns: str, rc: dict[str, Any], n: int) -> bool:
    pods = await live_pods(kube, ns, rc)
    return sum(1 for p in pods if kueue_pod_set(p) == "workers") == n


def watch(kube: Kube, ns: str, rc: dict[str, Any]) -> Any:
    return slice_watch(
        kube,
        ns,
        RAYCLUSTERS,
        rc,
        size_of=sizes,
        pod_set_of=kueue_pod_set,
        owner_of_pod=controller_uid,
    )


@pytest.mark.kueue_quota(cpu=6)
async def test_raycluster_workers_scale_within_the_real_quota(
    kueue_cluster: Any, kueue_kube: Kube, kueue_namespace: str
) -> None:
    ns = kueue_namespace
    async with running_controller(kueue_cluster.kubeconfig_path, config_for(ns, gate=UNGATER_GATE)):
        rc = await kueue_kube.create(RAYCLUSTERS, ns, ray_cluster("rc", 2))
        assert rc["spec"].get("suspend") is True, "Kueue's webhook suspends a queued RayCluster"
        async with watch(kueue_kube, ns, rc) as w:
            await w.settle("head + 2 workers", expect={"head": 1, "workers": 2})
            await scale(kueue_kube, ns, "rc", 4)
            await w.settle("4 workers", expect={"head": 1, "workers": 4})
            # 1 + 8 CPUs > 6: the scale-up slice waits; the new workers stay gated
            await scale(kueue_kube, ns, "rc", 8)
            await eventually(
                lambda: n_workers(kueue_kube, ns, rc, 8), timeout=30, what="8 worker pods"
            )
            await w.settle("8 workers, beyond quota", expect={"head": 1, "workers": 4})
            # KubeRay deletes released workers first; the pending slice shrinks and is admitted
            await scale(kueue_kube, ns, "rc", 2)
            await eventually(
                lambda: n_workers(kueue_kube, ns, rc, 2), timeout=30, what="2 worker pods"
            )
            await w.settle("back to 2 workers", expect={"head": 1, "workers": 2})


@pytest.mark.kueue_quota(cpu=6)
async def test_multi_host_worker_replicas_are_released_whole(
    kueue_cluster: Any, kueue_kube: Kube, kueue_namespace: str
) -> None:
    ns = kueue_namespace
    async with running_controller(kueue_cluster.kubeconfig_path, config_for(ns, gate=UNGATER_GATE)):
        rc = await kueue_kube.create(RAYCLUSTERS, ns, ray_cluster("mh", 1, hosts=2))
        async with watch(kueue_kube, ns, rc) as w:
            await w.settle("1 replica x 2 hosts", expect={"head": 1, "workers": 2})
            await scale(kueue_kube, ns, "mh", 2)
            await w.settle("2 replicas x 2 hosts", expect={"head": 1, "workers": 4})
            # 1 + 6 > 6: a third replica waits, both of its hosts gated
            await scale(kueue_kube, ns, "mh", 3)
            await eventually(
                lambda: n_workers(kueue_kube, ns, rc, 6), timeout=30, what="6 worker pods"
            )
            await w.settle("3 replicas, beyond quota", expect={"head": 1, "workers": 4})
            released = released_by(await live_pods(kueue_kube, ns, rc), UNGATER_GATE)
            per_replica = Counter(
                p["metadata"]["labels"]["ray.io/worker-group-replica-name"]
                for p in released
                if kueue_pod_set(p) == "workers"
            )
            assert sorted(per_replica.values()) == [2, 2], per_replica
