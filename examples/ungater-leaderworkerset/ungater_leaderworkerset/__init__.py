"""An ungater plugin for LeaderWorkerSet (leaderworkerset.x-k8s.io/v1), shipped on its own.

It is the worked example of a third-party plugin: a separate distribution that registers one
module under the ``ungater.plugins`` entry point group and imports only ``ungater.plugin_api``.
LeaderWorkerSet is a good test of the API because its pods sit at two depths below the owner
and only make sense in groups:

- a group's leader is created by the leader StatefulSet (named after the LWS, owned by it);
- its workers by a per-group StatefulSet named after the leader pod and owned *by the leader
  pod*; so a worker's controller chain is StatefulSet, Pod, StatefulSet, LeaderWorkerSet;
- a group (one leader and ``size - 1`` workers) is released whole or not at all;
- the LWS's own size (``replicas`` groups of ``size`` pods) bounds its pod sets.
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
    "GROUP_INDEX_LABEL",
    "LEADER_NAME_ANNOTATION",
    "LEADER_POD_SET",
    "LWS",
    "NAME_LABEL",
    "SHARED_POD_SET",
    "SIZE_ANNOTATION",
    "WORKER_INDEX_LABEL",
    "WORKER_POD_SET",
]

LWS = Kind("leaderworkerset.x-k8s.io", "LeaderWorkerSet")
STATEFULSET = Kind("apps", "StatefulSet")
POD = Kind("", "Pod")

_PREFIX = "leaderworkerset.sigs.k8s.io/"
NAME_LABEL = _PREFIX + "name"  # the LWS name: on both StatefulSets and on every pod
GROUP_INDEX_LABEL = _PREFIX + "group-index"  # which group (the leader's StatefulSet ordinal)
WORKER_INDEX_LABEL = _PREFIX + "worker-index"  # "0" on the leader, 1..size-1 on workers
SIZE_ANNOTATION = _PREFIX + "size"  # pods per group, leader included
LEADER_NAME_ANNOTATION = _PREFIX + "leader-name"  # on workers: their leader pod's name
# With exclusive placement the LWS controller creates a group's worker StatefulSet only once
# the leader pod is scheduled, so the leader cannot wait for its workers.
EXCLUSIVE_ANNOTATION = _PREFIX + "exclusive-topology"
# Kueue's LWS integration writes the pod set name here on every pod of a managed LWS.
KUEUE_ROLE_ANNOTATION = "kueue.x-k8s.io/role-hash"

# Kueue's pod set names for a LWS group: "leader" (count 1) and "worker" (size - 1) when the
# LWS has a leaderTemplate, else a single "main" (size) holding the leader and the workers.
LEADER_POD_SET = "leader"
WORKER_POD_SET = "worker"
SHARED_POD_SET = "main"
_KUEUE_NAMES = frozenset({LEADER_POD_SET, WORKER_POD_SET, SHARED_POD_SET})

# The LWS objects, for their size (replicas, pods per group, whether there is a leader template).
LWS_RESOURCE = ResourceSpec(group=LWS.group, version="v1", kind=LWS.kind, plural="leaderworkersets")

_LEADER_CHAIN = (STATEFULSET, LWS)
_WORKER_CHAIN = (STATEFULSET, POD, STATEFULSET, LWS)

# What the core must cache to walk both chains: the StatefulSets of any LWS, and leader pods.
INTERMEDIATES = (
    ResourceSpec(
        group="apps",
        version="v1",
        kind="StatefulSet",
        plural="statefulsets",
        label_selector=NAME_LABEL,
    ),
    ResourceSpec(
        group="",
        version="v1",
        kind="Pod",
        plural="pods",
        label_selector=f"{NAME_LABEL},{WORKER_INDEX_LABEL}=0",
    ),
)

_KNOWN = 0
_MISSING = 1
_MAX_DIGITS = 9


def _number(value: str | None) -> int | None:
    # annotations are free text: ASCII digits only, and not absurdly many
    if value is None or not value.isascii() or len(value) > _MAX_DIGITS:
        return None
    return int_or_none(value)


def is_leader(pod: PodView) -> bool:
    index = pod.labels.get(WORKER_INDEX_LABEL)
    if index is not None:
        return index == "0"
    return LEADER_NAME_ANNOTATION not in pod.annotations


def group_key(pod: PodView) -> str | None:
    """The group's identity: its leader pod's name (stable across restarts of the group)."""
    if is_leader(pod):
        return pod.name
    return pod.annotations.get(LEADER_NAME_ANNOTATION) or None


def _pod_set(pod: PodView) -> str:
    kueue = kueue_pod_set(pod)
    if kueue:
        return kueue
    role = pod.annotations.get(KUEUE_ROLE_ANNOTATION, "")
    if role in _KUEUE_NAMES:
        return role
    # Not stamped by Kueue: assume the LWS has a leaderTemplate (Kueue would then say "main"
    # for an LWS without one; only Kueue's stamps can tell the two apart on a pod).
    return LEADER_POD_SET if is_leader(pod) else WORKER_POD_SET


@hookimpl
def ungater_kinds() -> Sequence[KindSpec]:
    return [
        KindSpec(
            group=LWS.group,
            kind=LWS.kind,
            pod_label=NAME_LABEL,
            intermediates=INTERMEDIATES,
            owner_resource=LWS_RESOURCE,
        )
    ]


def _count(value: Any, default: int) -> int | None:
    if value is None:
        return default
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


@hookimpl
def ungater_owner_facts(owner_object: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = owner_object.get("spec") or {}
    template = spec.get("leaderWorkerTemplate") or {}
    return {
        "replicas": _count(spec.get("replicas"), 1),
        "size": _count(template.get("size"), 1),
        "leaderTemplate": bool(template.get("leaderTemplate")),
    }


@hookimpl
def ungater_desired_counts(owner_facts: Mapping[str, Any]) -> Mapping[str, int] | None:
    replicas, size = owner_facts.get("replicas"), owner_facts.get("size")
    if not isinstance(replicas, int) or not isinstance(size, int) or size < 1:
        return None
    # An upper bound whether Kueue makes one Workload per group or one for the whole LWS.
    if owner_facts.get("leaderTemplate"):
        return {LEADER_POD_SET: replicas, WORKER_POD_SET: replicas * (size - 1)}
    return {SHARED_POD_SET: replicas * size}


@hookimpl
def ungater_pod_selector(owner: ObjectRef) -> Mapping[str, str]:
    # The label holds the LWS *name*: anyone can copy it, so ownership is proven separately.
    return {NAME_LABEL: owner.name}


@hookimpl
def ungater_owns_pod(owner: ObjectRef, pod: PodView, chain: Sequence[ObjectRef]) -> bool:
    if chain_matches(owner, chain, _LEADER_CHAIN):
        return True
    if chain_matches(owner, chain, _WORKER_CHAIN):
        # The group a worker claims (by annotation) must be the leader that really owns it.
        return pod.annotations.get(LEADER_NAME_ANNOTATION) == chain[1].name
    return False


@hookimpl
def ungater_pod_set(pod: PodView) -> str | None:
    return _pod_set(pod)


@hookimpl
def ungater_sort_key(pod: PodView) -> tuple[int | str, ...]:
    group = _number(pod.labels.get(GROUP_INDEX_LABEL))
    worker = _number(pod.labels.get(WORKER_INDEX_LABEL))
    return (
        _MISSING if group is None else _KNOWN,
        group or 0,
        _MISSING if worker is None else _KNOWN,
        worker or 0,
    )


@hookimpl
def ungater_release_group(pod: PodView) -> ReleaseGroup | None:
    key = group_key(pod)
    if key is None:
        return None
    size = _number(pod.annotations.get(SIZE_ANNOTATION))
    if size is not None and size < 1:
        size = None
    # Release groups live inside one pod set. In "main" the leader and its workers are one
    # group; with a separate leader pod set (or exclusive placement, where the workers appear
    # only after the leader is scheduled) the leader goes alone and its workers form the group.
    together = _pod_set(pod) == SHARED_POD_SET and EXCLUSIVE_ANNOTATION not in pod.annotations
    if together:
        return ReleaseGroup(key=key, size=size)
    if is_leader(pod):
        return None
    return ReleaseGroup(key=key, size=None if size is None else size - 1)
