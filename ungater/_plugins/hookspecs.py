"""The hook specifications: the contract between the core and every plugin.

All hooks are synchronous and pure: they receive plain data (owner references, pod views) and
return plain data. A hook never sees a client and never does I/O. The core calls the per-owner
hooks only on the plugin chosen for that owner's kind, so an implementation never needs to
check whether an owner is "its" kind.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pluggy

from ungater.plugin_api import PROJECT, KindSpec, ObjectRef, PodView, ReleaseGroup

hookspec = pluggy.HookspecMarker(PROJECT)

SortKey = tuple[int | str, ...]


@hookspec
def ungater_kinds() -> Sequence[KindSpec]:  # type: ignore[empty-body]
    """Return the owner kinds this plugin serves.

    Called once at start-up on every plugin. Two plugins may serve the same kind; the config
    then names which one is used.
    """


@hookspec(firstresult=True)
def ungater_pod_selector(owner: ObjectRef) -> Mapping[str, str]:  # type: ignore[empty-body]
    """Return the equality label selector that finds ``owner``'s candidate pods.

    It must contain the kind's ``pod_label``. Matching it is not proof of ownership: anyone
    who may create pods can copy labels. ``ungater_owns_pod`` decides that.
    """


@hookspec(firstresult=True)
def ungater_owns_pod(  # type: ignore[empty-body]
    owner: ObjectRef, pod: PodView, chain: Sequence[ObjectRef]
) -> bool:
    """Return True when the controller chain proves ``pod`` belongs to ``owner``.

    ``chain`` holds the controller ownerReferences from the pod upwards, resolved by UID from
    the core's caches (``chain[0]`` is the pod's controller). The core has already checked that
    each hop exists and stops the chain at the owner's UID; the plugin checks its shape (for a
    JobSet: Job, then JobSet).
    """


@hookspec(firstresult=True)
def ungater_pod_set(owner: ObjectRef, pod: PodView) -> str | None:
    """Return the name of the Workload pod set ``pod`` belongs to, or None if unknown.

    Prefer Kueue's ``kueue.x-k8s.io/podset`` label (``plugin_api.kueue_pod_set``) and fall back
    to the kind's own labels.
    """


@hookspec(firstresult=True)
def ungater_sort_key(owner: ObjectRef, pod: PodView) -> SortKey:  # type: ignore[empty-body]
    """Return the key that orders the pods of one pod set for release, lowest first.

    Use only ints and strs, and the same shape for every pod of a pod set. The core breaks
    ties by creation time and then name.
    """


@hookspec(firstresult=True)
def ungater_owner_facts(owner_object: Mapping[str, Any]) -> Mapping[str, Any]:  # type: ignore[empty-body]
    """Extract the few facts the plugin needs from a raw owner object (JSON as served).

    Called only for kinds whose ``KindSpec.owner_resource`` is set, on every change of such an
    object; the core keeps the result (not the object) and hands it to
    ``ungater_release_group``. Return plain, small data: ints, strs, and mappings of them.
    """


@hookspec(firstresult=True)
def ungater_release_group(
    owner: ObjectRef, pod: PodView, owner_facts: Mapping[str, Any]
) -> ReleaseGroup | None:
    """Return the group ``pod`` must be released with (all or none), or None for a lone pod.

    ``owner_facts`` is what ``ungater_owner_facts`` extracted from the owner object, or an empty
    mapping when the kind has no ``owner_resource`` or the owner is not cached yet.
    """


@hookspec(firstresult=True)
def ungater_desired_counts(owner_facts: Mapping[str, Any]) -> Mapping[str, int] | None:
    """Return the owner's own desired pod count per pod set, or None when it cannot tell.

    ``owner_facts`` is what ``ungater_owner_facts`` extracted from the owner object (never
    empty: the hook is not called before the owner is cached). The core caps each named pod
    set at min(slice spec count, admitted count, this count): an owner shrinks, and its
    controller deletes pods, before Kueue lowers the slice's count, and the freed slots must
    not be refilled in between. A pod set left out is bounded by the slice alone.
    """
