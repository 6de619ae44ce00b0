"""What the Kueue benchmark sets up on a cluster running the real Kueue: a ResourceFlavor, one
ClusterQueue and LocalQueue per namespace, real elastic Indexed Jobs (the real Job controller
creates their pods, Kueue's webhook adds its gate beside ours), and the controller's config.
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
    "UNGATER_GATE",
    "create_queues",
    "kueue_controller_config",
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


async def delete_queues(api: BenchApi, cluster_queue: str) -> None:
    await api.kube.delete(CLUSTER_QUEUES, None, cluster_queue)


async def create_job(api: BenchApi, ns: str, name: str, parallelism: int, completions: int) -> str:
    """Create the Job; its UID (the pods' controller-uid label)."""
    job = await api.kube.create(
        JOBS, ns, queued_job(name, parallelism, completions, gate=UNGATER_GATE)
    )
    return str(job["metadata"]["uid"])


async def scale_job(api: BenchApi, ns: str, name: str, parallelism: int) -> None:
    await api.kube.merge_patch(JOBS, ns, name, {"spec": {"parallelism": parallelism}})


def kueue_controller_config(namespaces: list[str]) -> dict[str, Any]:
    """The controller as shipped (default client limits), on our gate, for these namespaces."""
    return {
        "gate": UNGATER_GATE,
        "namespaces": namespaces,
        "kinds": [{"group": "batch", "kind": "Job"}],
        "server": {"address": "127.0.0.1:0"},
        "leaderElection": {"leaseName": "ungater-bench-kueue"},
    }
