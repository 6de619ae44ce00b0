"""Builders of raw API objects shaped as Kubernetes and Kueue write them (for the fake and
the real API server alike)."""

from __future__ import annotations

import copy
from typing import Any

from ungater._kube.client import PODS, Resource
from ungater.testing import owner_ref

GATE = "kueue.x-k8s.io/elastic-job"
WORKLOADS = Resource("kueue.x-k8s.io", "v1beta2", "workloads", "Workload")
JOBS = Resource("batch", "v1", "jobs", "Job")
RAYCLUSTERS = Resource("ray.io", "v1", "rayclusters", "RayCluster")


def job_pod(
    owner: dict[str, Any],
    index: int,
    gates: list[str] | None = None,
    phase: str = "Pending",
    *,
    uid: str | None = None,
) -> dict[str, Any]:
    """A pod as the Job controller creates it for completion ``index`` of an Indexed Job
    (``uid``: the pod's own, for tests that hand it to no API server, which would set one)."""
    name = owner["metadata"]["name"]
    uid_label = owner["metadata"]["uid"]
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{name}-{index}-x{index:03d}",
            "generateName": f"{name}-{index}-",
            "namespace": owner["metadata"]["namespace"],
            "labels": {
                "batch.kubernetes.io/controller-uid": uid_label,
                "controller-uid": uid_label,
                "batch.kubernetes.io/job-name": name,
                "job-name": name,
                "batch.kubernetes.io/job-completion-index": str(index),
                "kueue.x-k8s.io/podset": "main",
            },
            "annotations": {"batch.kubernetes.io/job-completion-index": str(index)},
            "ownerReferences": [owner_ref(owner)],
        },
        "spec": {
            "schedulingGates": [{"name": g} for g in ([GATE] if gates is None else gates)],
            "containers": [{"name": "main", "image": "registry.invalid/busy:1"}],
        },
        "status": {"phase": phase},
    }
    if uid is not None:
        pod["metadata"]["uid"] = uid
    return pod


def workload(
    owner: dict[str, Any],
    name: str,
    count: int,
    admitted: int | None = None,
    *,
    replaces: str | None = None,
    finished: bool = False,
    evicted: bool = False,
    pod_set: str = "main",
    slice_name: str | None = None,
) -> dict[str, Any]:
    """A slice Workload owned by ``owner``; ``admitted`` sets an Admitted admission."""
    ns = owner["metadata"]["namespace"]
    annotations = {
        "kueue.x-k8s.io/elastic-job": "true",
        "kueue.x-k8s.io/workload-slice-name": slice_name or name,
    }
    if replaces:
        annotations["kueue.x-k8s.io/workload-slice-replacement-for"] = f"{ns}/{replaces}"
    wl: dict[str, Any] = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": name,
            "namespace": ns,
            "annotations": annotations,
            "labels": {"kueue.x-k8s.io/job-uid": owner["metadata"]["uid"]},
            "ownerReferences": [owner_ref(owner)],
        },
        "spec": {
            "queueName": "user-queue",
            "podSets": [
                {"name": pod_set, "count": count, "template": {"spec": {"containers": []}}}
            ],
        },
    }
    conditions = []
    if admitted is not None:
        wl["status"] = {
            "admission": {
                "clusterQueue": "cq",
                "podSetAssignments": [{"name": pod_set, "count": admitted, "flavors": {}}],
            }
        }
        for t in ("QuotaReserved", "Admitted"):
            conditions.append(condition(t, "True", t))
    if finished:
        conditions.append(condition("Finished", "True", "WorkloadSliceReplaced"))
    if evicted:
        conditions.append(condition("Evicted", "True", "Preempted"))
    if conditions:
        wl.setdefault("status", {})["conditions"] = conditions
    return wl


def condition(kind: str, status: str, reason: str) -> dict[str, Any]:
    """A Workload condition as Kueue writes it."""
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": "",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }


def gates_of(pod: dict[str, Any]) -> list[str]:
    return [g["name"] for g in (pod.get("spec") or {}).get("schedulingGates") or ()]


def controller_uid(pod: dict[str, Any]) -> str:
    """The UID of the pod's controller owner ("" when it has none)."""
    for ref in pod["metadata"].get("ownerReferences") or ():
        if ref.get("controller"):
            return str(ref["uid"])
    return ""


def ungated(pods: list[dict[str, Any]], gate: str = GATE) -> list[dict[str, Any]]:
    return [p for p in pods if gate not in gates_of(p)]


def with_phase(pod: dict[str, Any], phase: str) -> dict[str, Any]:
    out = copy.deepcopy(pod)
    out["status"] = {"phase": phase}
    return out


__all__ = [
    "GATE",
    "JOBS",
    "PODS",
    "WORKLOADS",
    "condition",
    "controller_uid",
    "gates_of",
    "job_pod",
    "owner_ref",
    "ungated",
    "workload",
]
