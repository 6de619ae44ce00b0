"""Turns cached views into the decision's input, asking the owner kind's plugin about each pod.

Shared by the controller and ``ungater explain`` so both reason identically: explain prints the
exact decision the controller would take on the same data.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ungater._decide.decision import Ownership, PodFacts
from ungater._decide.indexes import resolve_chain
from ungater._model.views import Kind, ObjectRef, ObjectView, PodView, WorkloadView
from ungater._plugins.registry import KindHandler
from ungater.plugin_api import VIA_FACTS

__all__ = ["FactsMemo", "owner_facts_of", "owner_of", "pod_facts", "pod_selectors", "via_objects"]


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


@dataclass(frozen=True, slots=True)
class _Asked:
    """What one owner's pods' facts were computed from, and the facts."""

    owner: ObjectRef
    owner_facts: Mapping[str, Any] | None
    objects_version: int
    facts: dict[str, PodFacts]


class FactsMemo:
    """Each pod's facts from the last time its owner's pods were asked about, for the last
    ``owners`` owners.

    The chain's proof and the plugin's answers are a function of the pod, the owner, the
    objects between and the owner's facts (plugins are pure). So while the owner, its facts
    and the objects index are the same, a pod whose view is the very same object (views are
    immutable: any change to a pod is a new view) has the same facts, and is not asked about
    again. A wave decides again on every change of its owner's objects; without this every
    decision asked the plugin about every pod of the owner, a thousand-pod Job's included.
    """

    def __init__(self, owners: int = 32) -> None:
        self._owners = owners
        self._asked: OrderedDict[tuple[Kind, str], _Asked] = OrderedDict()

    def recall(
        self,
        kind: Kind,
        owner: ObjectRef,
        owner_facts: Mapping[str, Any] | None,
        objects_version: int,
    ) -> dict[str, PodFacts]:
        """The facts kept for this owner by pod UID, if kept from the same inputs; else none."""
        got = self._asked.get((kind, owner.uid))
        if got is None or got.objects_version != objects_version or got.owner != owner:
            return {}
        if got.owner_facts != owner_facts:
            return {}
        self._asked.move_to_end((kind, owner.uid))
        return got.facts

    def keep(self, kind: Kind, asked: _Asked) -> None:
        self._asked[kind, asked.owner.uid] = asked
        self._asked.move_to_end((kind, asked.owner.uid))
        while len(self._asked) > self._owners:
            self._asked.popitem(last=False)

    def forget(self, uid: str) -> None:
        """An owner gone: its pods' facts are of no use any more."""
        for key in [k for k in self._asked if k[1] == uid]:
            del self._asked[key]


def pod_facts(
    handler: KindHandler,
    owner: ObjectRef,
    pods: Iterable[PodView],
    objects: Mapping[str, ObjectView],
    owner_facts: Mapping[str, Any] | None = None,
    memo: tuple[FactsMemo, int] | None = None,
) -> list[PodFacts]:
    """Ask the plugin about every candidate pod; the core proves the chain, the plugin its shape.
    ``memo``: the facts already asked for, and the version of ``objects`` (an
    ``ObjectIndex``'s): a pod whose view is the one they were asked for is not asked again.

    Raises ``PluginError`` when the plugin misbehaves; the caller skips the owner.
    """
    spec = handler.spec
    via = (spec.select_via,) if spec.select_via is not None else ()
    intermediate = frozenset(Kind(r.group, r.kind) for r in (*spec.intermediates, *via))
    known = memo[0].recall(handler.kind, owner, owner_facts, memo[1]) if memo else {}
    out: list[PodFacts] = []
    for pod in pods:
        facts = known.get(pod.uid)
        if facts is None or facts.pod is not pod:
            facts = _ask(handler, owner, pod, objects, owner_facts, intermediate)
        out.append(facts)
    if memo is not None:
        asked = _Asked(owner, owner_facts, memo[1], {f.pod.uid: f for f in out})
        memo[0].keep(handler.kind, asked)
    return out


def _ask(
    handler: KindHandler,
    owner: ObjectRef,
    pod: PodView,
    objects: Mapping[str, ObjectView],
    owner_facts: Mapping[str, Any] | None,
    intermediate: frozenset[Kind],
) -> PodFacts:
    result = resolve_chain(pod.controller, owner, objects, intermediate)
    ownership = result.ownership
    if ownership is Ownership.PROVEN and not handler.owns_pod(owner, pod, result.chain):
        ownership = Ownership.FOREIGN
    return PodFacts(
        pod=pod,
        pod_set=handler.pod_set(owner, pod),
        sort_key=handler.sort_key(owner, pod),
        group=handler.release_group(owner, pod, owner_facts),
        ownership=ownership,
    )
