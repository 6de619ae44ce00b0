"""RayJob and RayService (ray.io): the Workload is the RayJob's or RayService's, the pods the
RayCluster's it created.

Kueue (v0.17.0 to v0.19.2, read in their sources) puts the slices on the RayJob (RayService), while KubeRay v1.6.1 makes the pods
children of a RayCluster it creates with a generated name and a controller reference to the
RayJob. No label of the pods names the RayJob (``ray.io/cluster`` names the RayCluster;
``ray.io/originated-from-*`` are on the RayCluster only), so the core selects the pods through
each cached RayCluster whose controller reference carries the owner's UID (``select_via``) and
proves every pod by the UID chain Pod -> RayCluster -> RayJob. The size lives in those
RayClusters too: KubeRay disregards later changes of the RayJob's ``rayClusterSpec`` (and a
RayService's replica changes), the autoscaler scales the RayCluster, and Kueue reads the
worker counts of the new slice from it. Pod sets, order and multi-host replicas are the
RayCluster plugin's. A RayService upgrade runs two RayClusters at once: the pods of both belong
to the RayService and share its one slice's caps (their sizes add up).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ungater.plugin_api import (
    VIA_FACTS,
    Kind,
    KindSpec,
    ObjectRef,
    PodView,
    ReleaseGroup,
    chain_matches,
    hookimpl,
)

from . import raycluster

__all__ = ["RAYJOB", "RAYSERVICE"]

RAYJOB = Kind("ray.io", "RayJob")
RAYSERVICE = Kind("ray.io", "RayService")


@hookimpl
def ungater_kinds() -> Sequence[KindSpec]:
    return [
        KindSpec(
            group=kind.group,
            kind=kind.kind,
            pod_label=raycluster.CLUSTER_LABEL,
            select_via=raycluster.RAYCLUSTERS,
        )
        for kind in (RAYJOB, RAYSERVICE)
    ]


@hookimpl
def ungater_owner_facts(owner_object: Mapping[str, Any]) -> Mapping[str, Any]:
    # called on the RayClusters in between (this kind has no owner_resource)
    return raycluster.cluster_facts(owner_object)


def _clusters(owner_facts: Mapping[str, Any]) -> Mapping[str, Mapping[str, Any]]:
    clusters = owner_facts.get(VIA_FACTS)
    return clusters if isinstance(clusters, Mapping) else {}


@hookimpl
def ungater_desired_counts(owner_facts: Mapping[str, Any]) -> Mapping[str, int] | None:
    """The sum over the owner's RayClusters: what its controllers keep, per pod set."""
    clusters = _clusters(owner_facts)
    if not clusters:
        return None
    total: dict[str, int] = {}
    for facts in clusters.values():
        for name, n in (raycluster.cluster_size(facts)).items():
            total[name] = total.get(name, 0) + n
    return total


@hookimpl
def ungater_pod_selector(owner: ObjectRef) -> Mapping[str, str]:
    # called with each RayCluster the owner controls (select_via), never with the owner
    return raycluster.pod_selector(owner)


@hookimpl
def ungater_owns_pod(owner: ObjectRef, chain: Sequence[ObjectRef]) -> bool:
    return chain_matches(owner, chain, [raycluster.RAYCLUSTER, owner.group_kind])


@hookimpl
def ungater_pod_set(pod: PodView) -> str | None:
    return raycluster.pod_set(pod)


@hookimpl
def ungater_sort_key(pod: PodView) -> tuple[int | str, ...]:
    return raycluster.sort_key(pod)


@hookimpl
def ungater_release_group(pod: PodView, owner_facts: Mapping[str, Any]) -> ReleaseGroup | None:
    cluster = pod.labels.get(raycluster.CLUSTER_LABEL, "")
    group = raycluster.release_group(pod, _clusters(owner_facts).get(cluster) or {})
    # replica names are KubeRay's per RayCluster; two clusters of one RayService stay apart
    return ReleaseGroup(f"{cluster}/{group.key}", group.size) if group is not None else None
