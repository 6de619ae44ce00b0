"""Turns cached views into the decision's input, asking the owner kind's plugin about each pod.

Shared by the controller and ``ungater explain`` so both reason identically: explain prints the
exact decision the controller would take on the same data.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ungater._decide.decision import Ownership, PodFacts
from ungater._decide.indexes import resolve_chain
from ungater._model.views import Kind, ObjectRef, ObjectView, PodView, WorkloadView
from ungater._plugins.registry import KindHandler
from ungater.plugin_api import VIA_FACTS

__all__ = ["owner_facts_of", "owner_of", "pod_facts", "pod_selectors", "via_objects"]


def owner_of(slices: Sequence[WorkloadView]) -> ObjectRef | None:
    """The controller ownerReference shared by a chain of slices (newest slice's, if they differ)."""
    owners = [
        w.owner for w in sorted(slices, key=lambda w: (w.creation_timestamp, w.uid)) if w.owner
    ]
    return owners[-1] if owners else None


def via_objects(
    handler: KindHandler, owner: ObjectRef, objects: Iterable[ObjectView]
) -> list[ObjectView]:
    """The cached objects a ``select_via`` kind's pods are selected through: those of the
    declared kind whose controller reference carries the owner's UID (a name proves nothing)."""
    via = handler.spec.select_via
    if via is None:
        return []
    return sorted(
        (
            o
            for o in objects
            if o.group_kind == via.group_kind
            and o.controller is not None
            and o.controller.uid == owner.uid
        ),
        key=lambda o: (o.name, o.uid),
    )


def pod_selectors(
    handler: KindHandler, owner: ObjectRef, vias: Sequence[ObjectView]
) -> list[dict[str, str]]:
    """The label selectors of an owner's candidate pods: its own, or one per object between."""
    if handler.spec.select_via is None:
        return [handler.pod_selector(owner)]
    return [handler.pod_selector(o.ref) for o in vias]


def owner_facts_of(
    handler: KindHandler, own: Mapping[str, Any] | None, vias: Sequence[ObjectView]
) -> Mapping[str, Any] | None:
    """The facts the hooks get for an owner: its own object's, plus, for a ``select_via``
    kind, each object's between by name; None while nothing is known."""
    if handler.spec.select_via is None:
        return own
    if not vias and not own:
        return None
    return {**(own or {}), VIA_FACTS: {o.name: dict(o.facts) for o in vias}}


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
    spec = handler.spec
    via = (spec.select_via,) if spec.select_via is not None else ()
    intermediate = frozenset(Kind(r.group, r.kind) for r in (*spec.intermediates, *via))
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
