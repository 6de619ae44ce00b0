"""What the Kueue benchmark sets up on a cluster running the real Kueue: a ResourceFlavor, one
ClusterQueue and LocalQueue per namespace, real elastic Indexed Jobs (the real Job controller
creates their pods, Kueue's webhook adds its gate beside ours), elastic RayClusters (the real
KubeRay operator creates their pods), and the controller's config.
"""

from __future__ import annotations

from typing import Any

from bench.api import BenchApi
from bench.objects import JOBS
from ungater._kube.client import ApiError, Resource
from ungater_devtools.kueue_objects import (
    DEFAULT_FLAVOR,
    cluster_queue_object,
    local_queue_object,
    queued_job,
)

__all__ = [
    "KUEUE_GATE",
    "RAYCLUSTERS",
    "UNGATER_GATE",
    "create_queues",
    "create_raycluster",
    "kueue_controller_config",
    "scale_raycluster",
    "set_quota",
]

KUEUE_GATE = "kueue.x-k8s.io/elastic-job"
#: ungater's own gate in the templates: every Kueue the dev cluster runs releases its gate itself
#: (v0.17.0 from every admitted pod, from v0.17.1 its ElasticJobUngater up to the admitted
#: count), so each releaser has one gate of its own on the same pods, timed on its own.
UNGATER_GATE = "bench.ungater.example/release"
_API = ("kueue.x-k8s.io", "v1beta2")
FLAVORS = Resource(*_API, "resourceflavors", "ResourceFlavor", namespaced=False)
CLUSTER_QUEUES = Resource(*_API, "clusterqueues", "ClusterQueue", namespaced=False)
LOCAL_QUEUES = Resource(*_API, "localqueues", "LocalQueue")
RAYCLUSTERS = Resource("ray.io", "v1", "rayclusters", "RayCluster")


async def _create(api: BenchApi, res: Resource, ns: str | None, body: dict[str, Any]) -> None:
    try:
        await api.kube.create(res, ns, {"apiVersion": res.api_version, "kind": res.kind} | body)
    except ApiError as exc:
        if exc.status != 409:
            raise


async def create_queues(api: BenchApi, ns: str, cpu: int) -> str:
    """A ClusterQueue of ``cpu`` CPUs for ``ns`` alone and its LocalQueue ``user-queue``."""
    await _create(api, FLAVORS, None, {"metadata": {"name": DEFAULT_FLAVOR}})
    cq = f"cq-{ns}"
    await _create(api, CLUSTER_QUEUES, None, cluster_queue_object(cq, cpu, namespace=ns))
    await _create(api, LOCAL_QUEUES, ns, local_queue_object(ns, "user-queue", cq))
    return cq


async def set_quota(api: BenchApi, cluster_queue: str, cpu: int) -> None:
    """The ClusterQueue's CPU quota (the first resource of ``cluster_queue_object``)."""
    path = "/spec/resourceGroups/0/flavors/0/resources/0/nominalQuota"
    await api.kube.json_patch(
        CLUSTER_QUEUES, None, cluster_queue, [{"op": "replace", "path": path, "value": str(cpu)}]
    )


async def delete_queues(api: BenchApi, cluster_queue: str) -> None:
    await api.kube.delete(CLUSTER_QUEUES, None, cluster_queue)


async def create_job(
    api: BenchApi, ns: str, name: str, parallelism: int, completions: int, gate: str | None
) -> str:
    """Create the Job, ``gate`` in its template beside the one Kueue's webhook adds (None: only
    Kueue's); its UID (the pods' controller-uid label)."""
    job = await api.kube.create(JOBS, ns, queued_job(name, parallelism, completions, gate=gate))
    return str(job["metadata"]["uid"])


async def scale_job(api: BenchApi, ns: str, name: str, parallelism: int) -> None:
    await api.kube.merge_patch(JOBS, ns, name, {"spec": {"parallelism": parallelism}})


def _ray_template(gate: str | None) -> dict[str, Any]:
    ray = {
        "name": "ray",
        "image": "registry.invalid/ray:2",
        "resources": {"requests": {"cpu": "1"}},
    }
    gates = [{"name": gate}] if gate is not None else []
    return {"spec": {"schedulingGates": gates, "containers": [ray]}}


async def create_raycluster(
    api: BenchApi, ns: str, name: str, workers: int, gate: str | None
) -> str:
    """An elastic RayCluster (a head, one worker group ``workers``, 1 CPU per pod, ``gate`` in
    both templates when given; Kueue's webhook adds its own); its UID (its pods' controller)."""
    group = {
        "groupName": "workers",
        "replicas": workers,
        "minReplicas": 0,
        "maxReplicas": 1000,
        "rayStartParams": {},
        "template": _ray_template(gate),
    }
    body = {
        "apiVersion": RAYCLUSTERS.api_version,
        "kind": RAYCLUSTERS.kind,
        "metadata": {
            "name": name,
            "labels": {"kueue.x-k8s.io/queue-name": "user-queue"},
            "annotations": {"kueue.x-k8s.io/elastic-job": "true"},
        },
        "spec": {
            "headGroupSpec": {"rayStartParams": {}, "template": _ray_template(gate)},
            "workerGroupSpecs": [group],
        },
    }
    rc = await api.kube.create(RAYCLUSTERS, ns, body)
    return str(rc["metadata"]["uid"])


async def scale_raycluster(api: BenchApi, ns: str, name: str, workers: int) -> None:
    path = "/spec/workerGroupSpecs/0/replicas"
    await api.kube.json_patch(
        RAYCLUSTERS, ns, name, [{"op": "replace", "path": path, "value": workers}]
    )


def kueue_controller_config(namespaces: list[str], gate: str = UNGATER_GATE) -> dict[str, Any]:
    """The controller as shipped (default client limits), on ``gate``, for these namespaces.

    On our own gate (head to head) ``mode: release`` is what ``auto`` picks for a gate Kueue
    does not release, written out so that the benchmark never measures a controller that
    audits instead. On Kueue's gate (each releaser alone) it is ``auto``, as a user runs it
    behind the shipped admission policy: it releases because the policy guards the gate."""
    return {
        "gate": gate,
        "mode": "release" if gate == UNGATER_GATE else "auto",
        "namespaces": namespaces,
        "kinds": [{"group": "batch", "kind": "Job"}, {"group": "ray.io", "kind": "RayCluster"}],
        "server": {"address": "127.0.0.1:0"},
        "leaderElection": {"leaseName": "ungater-bench-kueue"},
    }
