"""RayCluster (ray.io): a head pod set and one per worker group, multi-host replicas kept whole.

KubeRay labels pods with the cluster's *name*, not its UID, so the selector alone proves
nothing: ownership rests on the pod's controller reference pointing at this RayCluster's UID.
Workers of a group with ``numOfHosts > 1`` form replicas (one TPU slice, say) that are useful
only complete; each replica is a release group, released whole or not at all. The cluster's own
size (head 1, a worker group ``replicas x numOfHosts``, nothing while suspended) bounds each pod
set: on scale-down KubeRay deletes workers, the released ones first, before Kueue lowers the
slice's count.
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
    "CLUSTER_LABEL",
    "GROUP_LABEL",
    "HEAD_POD_SET",
    "HOSTS_FACT",
    "HOST_INDEX_LABEL",
    "NODE_TYPE_LABEL",
    "RAYCLUSTER",
    "RAYCLUSTERS",
    "REPLICAS_FACT",
    "REPLICA_INDEX_LABEL",
    "REPLICA_NAME_LABEL",
    "SUSPEND_FACT",
    "cluster_facts",
    "cluster_size",
    "pod_selector",
    "pod_set",
    "release_group",
    "sort_key",
]

RAYCLUSTER = Kind("ray.io", "RayCluster")
CLUSTER_LABEL = "ray.io/cluster"  # value: the RayCluster's name
NODE_TYPE_LABEL = "ray.io/node-type"  # "head" or "worker"
GROUP_LABEL = "ray.io/group"  # worker group name; "headgroup" on the head
# KubeRay feature gate RayMultiHostIndexing (alpha, off, in v1.5; beta, on, since v1.6):
# every worker gets the replica index; multi-host workers also the replica name and host index.
REPLICA_INDEX_LABEL = "ray.io/worker-group-replica-index"
REPLICA_NAME_LABEL = "ray.io/worker-group-replica-name"
HOST_INDEX_LABEL = "ray.io/replica-host-index"
HEAD_POD_SET = "head"  # Kueue's name for the head's pod set

_HEAD = 0
_WORKER = 1
_KNOWN = 0
_MISSING = 1


def _index(pod: PodView, label: str) -> int | None:
    # Label values are ASCII by API validation; the check only keeps int_or_none total.
    value = pod.labels.get(label)
    return int_or_none(value) if value is not None and value.isascii() else None


def _is_head(pod: PodView) -> bool:
    return pod.labels.get(NODE_TYPE_LABEL) == "head"


# numOfHosts lives only in the RayCluster spec, so the core watches RayClusters for it.
RAYCLUSTERS = ResourceSpec(group="ray.io", version="v1", kind="RayCluster", plural="rayclusters")
HOSTS_FACT = "numOfHosts"  # owner fact: {group name: numOfHosts}
REPLICAS_FACT = "replicas"  # owner fact: {group name: replicas}
SUSPEND_FACT = "suspend"


@hookimpl
def ungater_kinds() -> Sequence[KindSpec]:
    return [
        KindSpec(
            group=RAYCLUSTER.group,
            kind=RAYCLUSTER.kind,
            pod_label=CLUSTER_LABEL,
            owner_resource=RAYCLUSTERS,
        )
    ]


@hookimpl
def ungater_owner_facts(owner_object: Mapping[str, Any]) -> Mapping[str, Any]:
    return cluster_facts(owner_object)


def cluster_facts(owner_object: Mapping[str, Any]) -> dict[str, Any]:
    """numOfHosts and desired replicas per worker group, and suspend, of a RayCluster."""
    hosts: dict[str, int] = {}
    replicas: dict[str, int] = {}
    spec = owner_object.get("spec") or {}
    for group in spec.get("workerGroupSpecs") or ():
        if not isinstance(group, Mapping) or not isinstance(group.get("groupName"), str):
            continue
        name = group["groupName"]
        n = group.get("numOfHosts", 1)
        if _is_count(n) and n >= 1:
            hosts[name] = n
        r = _desired_replicas(group)
        if r is not None:
            replicas[name] = r
    return {HOSTS_FACT: hosts, REPLICAS_FACT: replicas, SUSPEND_FACT: spec.get("suspend") is True}


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _desired_replicas(group: Mapping[str, Any]) -> int | None:
    """The replicas KubeRay keeps for a worker group: 0 when the group is suspended, else
    ``replicas`` clamped to [minReplicas, maxReplicas] (as the operator does)."""
    if group.get("suspend") is True:
        return 0
    low, high, wanted = group.get("minReplicas", 0), group.get("maxReplicas"), group.get("replicas")
    if not _is_count(low) or (high is not None and not _is_count(high)):
        return None
    if wanted is None or (_is_count(wanted) and wanted < low):
        return int(low)
    if not _is_count(wanted):
        return None
    return min(wanted, high) if high is not None else int(wanted)


@hookimpl
def ungater_desired_counts(owner_facts: Mapping[str, Any]) -> Mapping[str, int] | None:
    return cluster_size(owner_facts)


def cluster_size(owner_facts: Mapping[str, Any]) -> dict[str, int]:
    """The pods a RayCluster's facts ask for, per Kueue pod set name."""
    suspended = owner_facts.get(SUSPEND_FACT) is True
    counts = {HEAD_POD_SET: 0 if suspended else 1}
    hosts = owner_facts.get(HOSTS_FACT) or {}
    for name, replicas in (owner_facts.get(REPLICAS_FACT) or {}).items():
        n = hosts.get(name, 1)
        if _is_count(replicas) and _is_count(n):
            # Kueue names a worker group's pod set after groupName, lowercased
            counts[name.lower()] = 0 if suspended else replicas * n
    return counts


@hookimpl
def ungater_pod_selector(owner: ObjectRef) -> Mapping[str, str]:
    return pod_selector(owner)


def pod_selector(cluster: ObjectRef) -> dict[str, str]:
    """A RayCluster's pods by name label (a selector only: the proof is the controller UID)."""
    return {CLUSTER_LABEL: cluster.name}


@hookimpl
def ungater_owns_pod(owner: ObjectRef, chain: Sequence[ObjectRef]) -> bool:
    # A RayCluster created by a RayJob or RayService still owns its pods directly.
    return chain_matches(owner, chain, [RAYCLUSTER])


@hookimpl
def ungater_pod_set(pod: PodView) -> str | None:
    return pod_set(pod)


def pod_set(pod: PodView) -> str | None:
    """Kueue's pod set of a Ray pod: its label, else head or the lowercased worker group."""
    kueue = kueue_pod_set(pod)
    if kueue:
        return kueue
    if _is_head(pod):
        return HEAD_POD_SET
    if pod.labels.get(NODE_TYPE_LABEL) != "worker":
        return None
    group = pod.labels.get(GROUP_LABEL)
    # Kueue names a worker group's pod set after groupName, lowercased.
    return group.lower() if group else None


@hookimpl
def ungater_sort_key(pod: PodView) -> tuple[int | str, ...]:
    return sort_key(pod)


def sort_key(pod: PodView) -> tuple[int | str, ...]:
    """Head first, then workers by replica index, replica name and host index."""
    if _is_head(pod):
        return (_HEAD, _KNOWN, 0, "", 0)
    replica = _index(pod, REPLICA_INDEX_LABEL)
    host = _index(pod, HOST_INDEX_LABEL)
    return (
        _WORKER,
        _MISSING if replica is None else _KNOWN,
        replica or 0,
        pod.labels.get(REPLICA_NAME_LABEL, ""),
        host or 0,
    )


@hookimpl
def ungater_release_group(pod: PodView, owner_facts: Mapping[str, Any]) -> ReleaseGroup | None:
    return release_group(pod, owner_facts)


def release_group(pod: PodView, owner_facts: Mapping[str, Any]) -> ReleaseGroup | None:
    """A multi-host replica, sized by its group's numOfHosts in ``owner_facts``."""
    if _is_head(pod):
        return None
    replica_name = pod.labels.get(REPLICA_NAME_LABEL)
    if not replica_name:
        return None  # a single-host worker (or KubeRay without multi-host indexing)
    # numOfHosts is in the RayCluster spec only (no label or annotation carries it): with the
    # owner's facts a replica that is not yet complete waits; without them (the RayCluster is
    # not cached yet) the group is "whatever members exist".
    hosts = (owner_facts.get(HOSTS_FACT) or {}).get(pod.labels.get(GROUP_LABEL, ""))
    return ReleaseGroup(key=replica_name, size=hosts if isinstance(hosts, int) else None)
