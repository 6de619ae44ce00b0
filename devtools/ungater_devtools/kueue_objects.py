"""Kueue's queue objects for tests, benchmarks and the demo: the ResourceFlavor every test
ClusterQueue uses, ClusterQueue and LocalQueue builders, quota changes, and the elastic Indexed
Job those queues admit.  Beside the other test objects rather than in the dev cluster: they
need only something that sends an admin request (the local plane, or a stand-in)."""

from __future__ import annotations

from typing import Any, Protocol

__all__ = [
    "DEFAULT_FLAVOR",
    "KUEUE_API",
    "QUEUE_MEMORY",
    "Requester",
    "cluster_queue_object",
    "create_default_flavor",
    "create_queues",
    "delete_queues",
    "local_queue_object",
    "queued_job",
    "set_quota",
]


class Requester(Protocol):
    """What sends one admin request: :meth:`ControlPlane.request`'s shape."""

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = ...,
        timeout: float = ...,
    ) -> tuple[int, Any]: ...


KUEUE_API = "/apis/kueue.x-k8s.io/v1beta2"
DEFAULT_FLAVOR = "default-flavor"


def create_default_flavor(plane: Requester) -> None:
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
    plane: Requester,
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


def set_quota(plane: Requester, cluster_queue: str, cpu: int) -> None:
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


def delete_queues(plane: Requester, namespace: str, *, cluster_queue: str) -> None:
    """Delete the ClusterQueue (its LocalQueue goes with the namespace)."""
    plane.request("DELETE", f"{KUEUE_API}/clusterqueues/{cluster_queue}")
