"""JobSet (jobset.x-k8s.io): pods two hops below their owner, one pod set per replicatedJob.

A JobSet owns child Jobs and the Jobs own the pods, so ownership can only be proven through the
child Job: the plugin asks the core to cache Jobs that carry the JobSet name label, and accepts
a pod only when its controller chain is exactly Job, then this JobSet. Pods are released child
Job by child Job (``job-index``), and by completion index within one, lowest first. The
JobSet's own size per replicatedJob (``replicas x min(parallelism, completions)``, nothing while
suspended) bounds each pod set, since an owner shrinks before Kueue lowers the slice's count.
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
    "CHILD_JOBS",
    "COMPLETION_INDEX_KEY",
    "JOBSET",
    "JOBSETS",
    "JOBSET_NAME_LABEL",
    "JOBSET_UID_LABEL",
    "JOB_INDEX_KEY",
    "REPLICATED_JOB_LABEL",
]

JOBSET = Kind("jobset.x-k8s.io", "JobSet")
JOB = Kind("batch", "Job")
# Put by the JobSet controller on child Jobs and their pod templates (labels and annotations).
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
JOBSET_UID_LABEL = "jobset.sigs.k8s.io/jobset-uid"  # since JobSet v0.9.0
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX_KEY = "jobset.sigs.k8s.io/job-index"
# Put by the Job controller on pods of Indexed child Jobs.
COMPLETION_INDEX_KEY = "batch.kubernetes.io/job-completion-index"

# Only Jobs that belong to some JobSet are cached, not every Job of the cluster.
CHILD_JOBS = ResourceSpec(
    group="batch", version="v1", kind="Job", plural="jobs", label_selector=JOBSET_NAME_LABEL
)

# The JobSet objects themselves, for their size per replicatedJob.
JOBSETS = ResourceSpec(group="jobset.x-k8s.io", version="v1alpha2", kind="JobSet", plural="jobsets")
SIZES_FACT = "podsPerReplicatedJob"

_KNOWN = 0  # an index that is present sorts before one that is missing
_MISSING = 1
_MAX_DIGITS = 18


def _index(pod: PodView, key: str) -> int | None:
    # The JobSet and Job controllers write both keys as labels and as annotations; annotations
    # are free text, so accept ASCII digits only.
    for source in (pod.annotations, pod.labels):
        value = source.get(key)
        if value is not None and value.isascii() and len(value) <= _MAX_DIGITS:
            index = int_or_none(value)
            if index is not None:
                return index
    return None


@hookimpl
def ungater_kinds() -> Sequence[KindSpec]:
    return [
        KindSpec(
            group=JOBSET.group,
            kind=JOBSET.kind,
            pod_label=JOBSET_UID_LABEL,
            intermediates=(CHILD_JOBS,),
            owner_resource=JOBSETS,
        )
    ]


def _count(value: Any, default: int | None = None) -> int | None:
    if value is None:
        return default
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return value if ok else None


@hookimpl
def ungater_owner_facts(owner_object: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = owner_object.get("spec") or {}
    sizes: dict[str, int] = {}
    for rjob in spec.get("replicatedJobs") or ():
        if not isinstance(rjob, Mapping) or not isinstance(rjob.get("name"), str):
            continue
        job_spec = ((rjob.get("template") or {}).get("spec")) or {}
        replicas = _count(rjob.get("replicas"), 1)
        parallelism = _count(job_spec.get("parallelism"), 1)
        completions = _count(job_spec.get("completions"), parallelism)
        if replicas is None or parallelism is None or completions is None:
            continue
        sizes[rjob["name"]] = replicas * min(parallelism, completions)
    return {SIZES_FACT: sizes, "suspend": spec.get("suspend") is True}


@hookimpl
def ungater_desired_counts(owner_facts: Mapping[str, Any]) -> Mapping[str, int] | None:
    suspended = owner_facts.get("suspend") is True
    sizes = owner_facts.get(SIZES_FACT) or {}
    # Kueue names the pod set after the replicatedJob, lowercased
    return {name.lower(): 0 if suspended else n for name, n in sizes.items()}


@hookimpl
def ungater_pod_selector(owner: ObjectRef) -> Mapping[str, str]:
    return {JOBSET_UID_LABEL: owner.uid}


@hookimpl
def ungater_owns_pod(owner: ObjectRef, chain: Sequence[ObjectRef]) -> bool:
    # Pod -> child Job -> this JobSet; a Job owned by anything else (another JobSet, a CronJob,
    # nobody) breaks the proof whatever labels the pod carries.
    return chain_matches(owner, chain, [JOB, JOBSET])


@hookimpl
def ungater_pod_set(pod: PodView) -> str | None:
    kueue = kueue_pod_set(pod)
    if kueue:
        return kueue
    replicated_job = pod.labels.get(REPLICATED_JOB_LABEL)
    # Kueue names the pod set after the replicatedJob, lowercased.
    return replicated_job.lower() if replicated_job else None


@hookimpl
def ungater_sort_key(pod: PodView) -> tuple[int | str, ...]:
    job_index = _index(pod, JOB_INDEX_KEY)
    completion = _index(pod, COMPLETION_INDEX_KEY)
    return (
        _MISSING if job_index is None else _KNOWN,
        job_index or 0,
        _MISSING if completion is None else _KNOWN,
        completion or 0,
    )


@hookimpl
def ungater_release_group() -> ReleaseGroup | None:
    return None  # the pods of a child Job run independently
