"""Raw API objects as the Job controller and Kueue shape them: a Job, its pods, its slices.

The Jobs carry ``spec.managedBy`` set to a name no controller serves, so the real Job
controller leaves them (and their pods) alone: the harness creates each pod itself, exactly as
the Job controller would (same labels, annotations, controller ownerReference by UID), at a
rate and moment it controls. Without it the Job controller adopts, creates and deletes pods at
its own pace (20 QPS in kube-controller-manager), which would be measured instead of ungater.
"""

from __future__ import annotations

from typing import Any

from ungater._kube.client import PODS, Resource
from ungater.testing import owner_ref

__all__ = [
    "BENCH_LABEL",
    "CONTROLLER_UID",
    "GATE",
    "JOBS",
    "PODS",
    "WORKLOADS",
    "admission_status",
    "condition",
    "finished_status",
    "job_body",
    "owner_ref",
    "pod_body",
    "workload_body",
]

GATE = "kueue.x-k8s.io/elastic-job"
JOBS = Resource("batch", "v1", "jobs", "Job")
WORKLOADS = Resource("kueue.x-k8s.io", "v1beta2", "workloads", "Workload")
CONTROLLER_UID = "batch.kubernetes.io/controller-uid"
BENCH_LABEL = "ungater.bench/run"
_INDEX = "batch.kubernetes.io/job-completion-index"
_MANAGED_BY = "ungater.bench/no-controller"
_IMAGE = "registry.invalid/trainer:1"


def job_body(name: str, parallelism: int, run: str) -> dict[str, Any]:
    """An elastic Indexed Job whose pods the harness creates (``managedBy``: see above)."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "labels": {BENCH_LABEL: run, "kueue.x-k8s.io/queue-name": "user-queue"},
            "annotations": {"kueue.x-k8s.io/elastic-job": "true"},
        },
        "spec": {
            "managedBy": _MANAGED_BY,
            "parallelism": parallelism,
            "completions": parallelism,
            "completionMode": "Indexed",
            "template": {
                "spec": {
                    "schedulingGates": [{"name": GATE}],
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": _IMAGE}],
                }
            },
        },
    }


def pod_body(job: dict[str, Any], index: int, run: str, gated: bool = True) -> dict[str, Any]:
    """Pod ``index`` of an Indexed Job, labelled and owned as the Job controller makes it."""
    name = job["metadata"]["name"]
    uid = job["metadata"]["uid"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{name}-{index}-b{run}",
            "labels": {
                CONTROLLER_UID: uid,
                "controller-uid": uid,
                "batch.kubernetes.io/job-name": name,
                "job-name": name,
                _INDEX: str(index),
                "kueue.x-k8s.io/podset": "main",
                BENCH_LABEL: run,
            },
            "annotations": {_INDEX: str(index)},
            "ownerReferences": [owner_ref(job)],
        },
        "spec": {
            "schedulingGates": [{"name": GATE}] if gated else [],
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": _IMAGE}],
        },
    }


def workload_body(
    job: dict[str, Any], name: str, count: int, run: str, replaces: str | None = None
) -> dict[str, Any]:
    """A Workload slice of ``job`` asking for ``count`` pods (Kueue's shape, v1beta2)."""
    ns = job["metadata"]["namespace"]
    annotations = {
        "kueue.x-k8s.io/elastic-job": "true",
        "kueue.x-k8s.io/workload-slice-name": name,
    }
    if replaces:
        annotations["kueue.x-k8s.io/workload-slice-replacement-for"] = f"{ns}/{replaces}"
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": name,
            "annotations": annotations,
            "labels": {"kueue.x-k8s.io/job-uid": job["metadata"]["uid"], BENCH_LABEL: run},
            "ownerReferences": [owner_ref(job)],
        },
        "spec": {
            "queueName": "user-queue",
            "podSets": [
                {
                    "name": "main",
                    "count": count,
                    "template": {"spec": {"containers": [{"name": "main", "image": _IMAGE}]}},
                }
            ],
        },
    }


def condition(kind: str, reason: str) -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True",
        "reason": reason,
        "message": "",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }


def admission_status(count: int) -> dict[str, Any]:
    """The status Kueue's scheduler writes on admission: quota reserved, then Admitted."""
    return {
        "status": {
            "admission": {
                "clusterQueue": "cluster-queue",
                "podSetAssignments": [
                    {"name": "main", "count": count, "flavors": {"cpu": "default"}}
                ],
            },
            "conditions": [
                condition("QuotaReserved", "QuotaReserved"),
                condition("Admitted", "Admitted"),
            ],
        }
    }


def finished_status() -> dict[str, Any]:
    """Conditions of a slice Kueue replaced: still admitted, now Finished (merge patch body)."""
    return {
        "status": {
            "conditions": [
                condition("QuotaReserved", "QuotaReserved"),
                condition("Admitted", "Admitted"),
                condition("Finished", "WorkloadSliceReplaced"),
            ]
        }
    }
