"""Elastic Indexed Jobs under the real Kueue and the real Job controller: a Job's pods, its size
as Kueue counts it, a pending slice, the kubelet's part, and the slice watch of a Job (see
``realpeers``). A Job's completion index and scaling are in ``jobs``."""

from __future__ import annotations

from typing import Any

from tests.integration.k8s import Kube
from tests.integration.realpeers import controller_uid, slice_watch
from tests.objects import JOBS, PODS, WORKLOADS


def job_size(job: dict[str, Any]) -> dict[str, int]:
    spec = job["spec"]
    return {"main": min(int(spec.get("parallelism", 1)), int(spec.get("completions", 1)))}


async def pods_of(kube: Kube, ns: str, job: dict[str, Any]) -> list[dict[str, Any]]:
    sel = f"batch.kubernetes.io/controller-uid={job['metadata']['uid']}"
    return [p for p in await kube.list(PODS, ns, sel) if not p["metadata"].get("deletionTimestamp")]


async def pending_slice(kube: Kube, ns: str) -> bool:
    for w in await kube.list(WORKLOADS, ns):
        conds = {c["type"]: c for c in (w.get("status") or {}).get("conditions") or ()}
        if conds.get("QuotaReserved", {}).get("status") == "False":
            return True
    return False


async def set_phase(kube: Kube, ns: str, pod: dict[str, Any], phase: str) -> None:
    """Play the kubelet: the pod ran and ended."""
    await kube.merge_patch(
        PODS, ns, pod["metadata"]["name"], {"status": {"phase": phase}}, "status"
    )


def watch(kube: Kube, ns: str, job: dict[str, Any]) -> Any:
    return slice_watch(
        kube,
        ns,
        JOBS,
        job,
        size_of=job_size,
        pod_set_of=lambda p: "main",
        owner_of_pod=controller_uid,
    )
