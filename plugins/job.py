"""batch/v1 Job: which pods are a Job's, which pod set they fill, and in which order to release.

A Job owns its pods directly and labels each with its own UID, so finding them is one indexed
lookup and proving them is one ownerReference hop. What this plugin adds over release in name
order is index order for Indexed Jobs: index 0 is released before index 7, as the Job controller
itself would start them. The Job's own size (parallelism, bounded by the completions still to
go; none while suspended) also bounds its pod set: on scale-down the Job shrinks and its
controller deletes pods before Kueue lowers the slice's count.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ungater.plugin_api import (
    Kind,
    KindSpec,
    ObjectRef,
    PodView,
    ReleaseGroup,
    ResourceSpec,
    chain_matches,
    hookimpl,
    int_or_none,
    kueue_pod_set,
)

__all__ = [
    "COMPLETION_INDEX_KEY",
    "CONTROLLER_UID_LABEL",
    "DEFAULT_POD_SET",
    "JOB",
    "JOBS",
    "completion_index",
]

JOB = Kind("batch", "Job")
# Set on the pod template by the API server (the Job's generated selector), so on every pod.
CONTROLLER_UID_LABEL = "batch.kubernetes.io/controller-uid"
# Indexed Jobs: always an annotation; also a label where the PodIndexLabel feature is on.
COMPLETION_INDEX_KEY = "batch.kubernetes.io/job-completion-index"
# Kueue's single pod set of a Job.
DEFAULT_POD_SET = "main"

# The Job objects, for their size; every Job, since Kueue may manage Jobs without a queue label.
JOBS = ResourceSpec(group="batch", version="v1", kind="Job", plural="jobs")

_INDEXED = 0  # first element of the sort key: Indexed pods before any pod without an index
_UNINDEXED = 1
_MAX_DIGITS = 18  # far above any real index, far below what int() refuses to parse


def _non_negative(value: str | None) -> int | None:
    # Annotations are free text: accept ASCII digits only, and not absurdly many.
    if value is None or not value.isascii() or len(value) > _MAX_DIGITS:
        return None
    return int_or_none(value)


def completion_index(pod: PodView) -> int | None:
    """The pod's completion index, from the annotation (authoritative) or else the label."""
    index = _non_negative(pod.annotations.get(COMPLETION_INDEX_KEY))
    if index is None:
        index = _non_negative(pod.labels.get(COMPLETION_INDEX_KEY))
    return index


@hookimpl
def ungater_kinds() -> Sequence[KindSpec]:
    return [
        KindSpec(
            group=JOB.group, kind=JOB.kind, pod_label=CONTROLLER_UID_LABEL, owner_resource=JOBS
        )
    ]


def _count(value: Any) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return value if ok else None


@hookimpl
def ungater_owner_facts(owner_object: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = owner_object.get("spec") or {}
    status = owner_object.get("status") or {}
    parallelism = spec.get("parallelism", 1)  # the API server defaults it to 1
    return {
        "parallelism": _count(parallelism),
        "completions": _count(spec.get("completions")),
        "succeeded": _count(status.get("succeeded")) or 0,
        "suspend": spec.get("suspend") is True,
    }


@hookimpl
def ungater_desired_counts(owner_facts: Mapping[str, Any]) -> Mapping[str, int] | None:
    # The Job controller keeps min(parallelism, completions - succeeded) pods active.
    parallelism = _count(owner_facts.get("parallelism"))
    if parallelism is None:
        return None
    if owner_facts.get("suspend") is True:
        return {DEFAULT_POD_SET: 0}
    completions = _count(owner_facts.get("completions"))
    if completions is not None:
        succeeded = _count(owner_facts.get("succeeded")) or 0
        parallelism = min(parallelism, max(0, completions - succeeded))
    return {DEFAULT_POD_SET: parallelism}


@hookimpl
def ungater_pod_selector(owner: ObjectRef) -> Mapping[str, str]:
    return {CONTROLLER_UID_LABEL: owner.uid}


@hookimpl
def ungater_owns_pod(owner: ObjectRef, chain: Sequence[ObjectRef]) -> bool:
    # The pod's controller must be the Job itself: nothing in between.
    return chain_matches(owner, chain, [JOB])


@hookimpl
def ungater_pod_set(pod: PodView) -> str | None:
    return kueue_pod_set(pod) or DEFAULT_POD_SET


@hookimpl
def ungater_sort_key(pod: PodView) -> tuple[int | str, ...]:
    index = completion_index(pod)
    if index is None:
        return (_UNINDEXED, 0)  # NonIndexed: the core orders by creation time, then name
    return (_INDEXED, index)


@hookimpl
def ungater_release_group() -> ReleaseGroup | None:
    return None  # every pod of a Job can run on its own
