"""Small builders of raw (camelCase JSON) Workload and pod dicts for the unit tests.

They build what the API server would serve, so the tests go through ``parse_workload`` /
``parse_pod`` exactly like the controller does. ``*_view`` helpers parse right away.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ungater._decide.decision import Ownership, PodFacts
from ungater._model.views import (
    SLICE_NAME_ANNOTATION,
    SLICE_REPLACEMENT_ANNOTATION,
    PodView,
    WorkloadView,
    parse_pod,
    parse_workload,
)
from ungater.plugin_api import ReleaseGroup
from ungater.testing import owner_ref as ref_to

GATE = "kueue.x-k8s.io/elastic-job"
TOPOLOGY_GATE = "kueue.x-k8s.io/topology"
NS = "team-a"
OWNER_UID = "job-uid-1"

_ABSENT = object()


def ts(second: int) -> str:
    """An RFC 3339 creationTimestamp, second precision like the API server serves it."""
    minute, sec = divmod(second, 60)
    hour, minute = divmod(minute, 60)
    return f"2025-01-01T{hour:02d}:{minute:02d}:{sec:02d}Z"


def condition(kind: str, status: str = "True", reason: str = "") -> dict[str, Any]:
    return {
        "type": kind,
        "status": status,
        "reason": reason or kind,
        "message": "",
        "lastTransitionTime": ts(0),
    }


def owner_ref(
    name: str = "job", uid: str = OWNER_UID, kind: str = "Job", api_version: str = "batch/v1"
) -> dict[str, Any]:
    """The controller reference to an owner given by its fields (default: the Job every
    builder here belongs to)."""
    owner = {"apiVersion": api_version, "kind": kind, "metadata": {"name": name, "uid": uid}}
    return ref_to(owner)


def workload(
    name: str = "wl-1",
    *,
    uid: str | None = None,
    created: int = 0,
    pod_sets: Mapping[str, Any] | Sequence[tuple[str, Any]] = (("main", 4),),
    admitted: Mapping[str, Any] | Sequence[tuple[str, Any]] | object | None = _ABSENT,
    conditions: Iterable[str | tuple[str, str] | dict[str, Any]] = ("QuotaReserved", "Admitted"),
    replacement_for: str | None = None,
    slice_name: str | None = None,
    namespace: str = NS,
    api_version: str = "kueue.x-k8s.io/v1beta2",
) -> dict[str, Any]:
    """A Workload dict. ``admitted`` maps pod set -> admitted count (``None``: count absent);
    left out it admits every pod set at its spec count; ``None`` means no ``status.admission``.
    Values may be anything (to build malformed input)."""
    ps_items = list(pod_sets.items()) if isinstance(pod_sets, Mapping) else list(pod_sets)
    annotations = {
        "kueue.x-k8s.io/elastic-job": "true",
        SLICE_NAME_ANNOTATION: slice_name or "wl-1",
    }
    if replacement_for is not None:
        annotations[SLICE_REPLACEMENT_ANNOTATION] = (
            replacement_for if "/" in replacement_for else f"{namespace}/{replacement_for}"
        )
    spec_sets = []
    for ps_name, count in ps_items:
        entry: dict[str, Any] = {
            "name": ps_name,
            "template": {"spec": {"containers": [{"name": "c", "image": "busybox"}]}},
        }
        if count is not _ABSENT:
            entry["count"] = count
        spec_sets.append(entry)
    status: dict[str, Any] = {}
    if admitted is _ABSENT:
        admitted = {n: c for n, c in ps_items}
    if admitted is not None:
        items = list(admitted.items()) if isinstance(admitted, Mapping) else list(admitted)  # type: ignore[union-attr]
        assignments = []
        for ps_name, count in items:
            a: dict[str, Any] = {"name": ps_name, "flavors": {"cpu": "default"}}
            if count is not None:
                a["count"] = count
            assignments.append(a)
        status["admission"] = {"clusterQueue": "cq", "podSetAssignments": assignments}
    conds = []
    for c in conditions:
        if isinstance(c, dict):
            conds.append(c)
        elif isinstance(c, tuple):
            conds.append(condition(*c))
        else:
            conds.append(condition(c))
    status["conditions"] = conds
    return {
        "apiVersion": api_version,
        "kind": "Workload",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or f"uid-{name}",
            "creationTimestamp": ts(created),
            "resourceVersion": "100",
            "labels": {"kueue.x-k8s.io/job-uid": OWNER_UID},
            "annotations": annotations,
            "ownerReferences": [owner_ref()],
        },
        "spec": {"podSets": spec_sets, "queueName": "lq"},
        "status": status,
    }


def wl_view(name: str = "wl-1", **kw: Any) -> WorkloadView:
    return parse_workload(workload(name, **kw))


def pod(
    name: str,
    *,
    uid: str | None = None,
    gates: Sequence[str] = (GATE,),
    phase: str = "Pending",
    deleting: bool = False,
    created: int = 10,
    pod_set: str | None = "main",
    labels: Mapping[str, str] | None = None,
    namespace: str = NS,
) -> dict[str, Any]:
    lab = {"batch.kubernetes.io/job-name": "job", "batch.kubernetes.io/controller-uid": OWNER_UID}
    if pod_set is not None:
        lab["kueue.x-k8s.io/podset"] = pod_set
    lab.update(labels or {})
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": uid or f"uid-{name}",
        "creationTimestamp": ts(created),
        "resourceVersion": "7",
        "labels": lab,
        "annotations": {"kueue.x-k8s.io/workload-slice-name": "wl-1"},
        "ownerReferences": [owner_ref()],
    }
    if deleting:
        meta["deletionTimestamp"] = ts(99)
        meta["deletionGracePeriodSeconds"] = 30
    status: dict[str, Any] = {"phase": phase}
    if gates:
        status["conditions"] = [
            {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "schedulingGates": [{"name": g} for g in gates],
            "containers": [{"name": "c", "image": "busybox"}],
        },
        "status": status,
    }


def pod_view(name: str, **kw: Any) -> PodView:
    return parse_pod(pod(name, **kw))


def facts(
    name: str,
    *,
    pod_set: str | None = "main",
    sort_key: tuple[int | str, ...] = (),
    group: ReleaseGroup | str | None = None,
    size: int | None = None,
    ownership: Ownership = Ownership.PROVEN,
    **pod_kw: Any,
) -> PodFacts:
    """A PodFacts for a pod built by ``pod``; ``group`` may be a key (with ``size``)."""
    if isinstance(group, str):
        group = ReleaseGroup(group, size)
    view = pod_view(name, pod_set=pod_set, **pod_kw)
    return PodFacts(view, pod_set, sort_key, group, ownership)
