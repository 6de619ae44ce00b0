"""Turns cached views into the decision's input, asking the owner kind's plugin about each pod.

Shared by the controller and ``ungater explain`` so both reason identically: explain prints the
exact decision the controller would take on the same data.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ungater._cache import resolve_chain
from ungater._decision import Ownership, PodFacts
from ungater._model import Kind, ObjectRef, ObjectView, PodView, WorkloadView
from ungater._registry import KindHandler

__all__ = ["owner_of", "pod_facts"]


def owner_of(slices: Sequence[WorkloadView]) -> ObjectRef | None:
    """The controller ownerReference shared by a chain of slices (newest slice's, if they differ)."""
    owners = [
        w.owner for w in sorted(slices, key=lambda w: (w.creation_timestamp, w.uid)) if w.owner
    ]
    return owners[-1] if owners else None


def pod_facts(
    handler: KindHandler,
    owner: ObjectRef,
    pods: Iterable[PodView],
    objects: Mapping[str, ObjectView],
    owner_facts: Mapping[str, Any] | None = None,
) -> list[PodFacts]:
    """Ask the plugin about every candidate pod; the core proves the chain, the plugin its shape.

    Raises ``PluginError`` when the plugin misbehaves; the caller skips the owner.
    """
    intermediate = frozenset(Kind(r.group, r.kind) for r in handler.spec.intermediates)
    out: list[PodFacts] = []
    for pod in pods:
        result = resolve_chain(pod.controller, owner, objects, intermediate)
        ownership = result.ownership
        if ownership is Ownership.PROVEN and not handler.owns_pod(owner, pod, result.chain):
            ownership = Ownership.FOREIGN
        out.append(
            PodFacts(
                pod=pod,
                pod_set=handler.pod_set(owner, pod),
                sort_key=handler.sort_key(owner, pod),
                group=handler.release_group(owner, pod, owner_facts),
                ownership=ownership,
            )
        )
    return out
