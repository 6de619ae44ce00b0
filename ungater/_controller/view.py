"""The view a releasing decision rests on, gathered in one place (docs/safety.md, "The view").

A release is decided on three things taken in this order:

1. **the pods**, as the deciding pod cache holds them at one moment (a ``snapshot``, with our
   writes still in flight taken at the same moment), or, while a new term cannot yet trust its
   caches, as a quorum LIST of the API server returns them;
2. **the bounds**: the owner, every slice of its chain that may be the active one, and the
   objects a ``select_via`` kind is sized by, each read from the API server *after* step 1,
   all sent together: all as of one moment, the moment of step 1 when the reads agree with
   the caches as step 1 found them, else a later one, once two rounds of reads agree;
3. the write ledger for our own writes the pods of step 1 cannot show.

Any write that lowered a bound before that moment is in step 2's reads; any pod that a lowering
took away after step 1 is still counted by step 1 (counting a pod that went is safe); a pod
released after step 1 is ours (the ledger) or another writer's (docs/safety.md, "What is left
open"). No mark has to say when a cache may be stale. The reads are not written back into the
caches: the caches decide only whether a view is worth gathering.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio

from ungater._controller.state import KindRuntime, State
from ungater._decide.assess import pod_selectors, via_objects
from ungater._decide.decision import live_slices
from ungater._decide.freshness import version_number
from ungater._decide.indexes import OwnerKey
from ungater._kube.client import PODS, Resource, selector_text
from ungater._kube.kueue import workload_resource
from ungater._model.views import (
    MalformedObject,
    ObjectRef,
    ObjectView,
    PodView,
    WorkloadView,
    parse_pod,
    parse_workload,
)

__all__ = [
    "SNAPSHOT_ROUNDS",
    "Basis",
    "Bounds",
    "BoundsMoving",
    "PodSnapshot",
    "View",
    "ViewReader",
]

#: Rounds of bound reads after the first, at most, before a reconcile gives up on a moment
#: where they all held still (and backs off): each round is one round trip.
SNAPSHOT_ROUNDS = 4


class BoundsMoving(RuntimeError):
    """The bounds changed between every two rounds of reads: no moment to decide on yet."""


@dataclass(frozen=True, slots=True)
class PodSnapshot:
    """The owner's pods at one moment, and which of them our writes may have released by
    then although these views do not show it (taken together: no await between)."""

    pods: tuple[PodView, ...]
    in_flight: frozenset[str]
    quorum: bool  # read from the API server (a new term's first view), not from a cache
    #: the bounds as the caches held them at that moment, by (what, name): their uid and
    #: resourceVersion (``ViewReader.bounds`` needs one round of reads when these agree)
    cached: Mapping[tuple[str, str], tuple[str, str]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Bounds:
    """What caps the owner's pod sets, as the API server had it after the snapshot."""

    slices: tuple[WorkloadView, ...]
    owner_facts: Mapping[str, Any] | None  # the owner's own object's facts (None: no such read)
    owner_error: str  # why the owner's size cannot be known, if it cannot
    vias: tuple[ObjectView, ...]
    gone: bool  # the owner, or an object it is sized by, is gone or another object now


#: The caches' versions of what bounds an owner's pods (``ViewReader.basis``).
Basis = tuple[object, ...]


@dataclass(frozen=True, slots=True)
class View:
    """One decision's whole input from the cluster: the pods, their bounds, and the basis its
    patches must still find in the caches when they are sent (taken once the view is complete,
    with no await before the decision on it)."""

    pods: PodSnapshot
    bounds: Bounds
    basis: Basis


InFlight = Callable[[list[PodView]], frozenset[str]]


class ViewReader:
    def __init__(self, state: State) -> None:
        self.s = state

    def basis(self, key: OwnerKey) -> Basis:
        """The caches' versions of what bounds this owner's pods: the owner, its slices, the
        objects it is sized by. A release is sent (a refused one resent) only while this is as
        it was when its view was complete: one that waited for a patch slot while a cache
        showed a change is decided again instead."""
        s = self.s
        cached = s.owners.get(key.uid)
        return (
            cached.resource_version if cached is not None else None,
            tuple((w.uid, w.resource_version) for w in s.workloads.for_owner(key.uid)),
            tuple(sorted((o.uid, o.resource_version) for o in s.objects.controlled_by(key.uid))),
        )

    # -- 1. the pods -----------------------------------------------------------------------------

    def cached_pods(self, key: OwnerKey, rt: KindRuntime, owner: ObjectRef) -> list[PodView]:
        vias = via_objects(rt.handler, owner, self.s.objects.controlled_by(owner.uid))
        return [
            p
            for selector in pod_selectors(rt.handler, owner, vias)
            for p in rt.pods.select(key.namespace, selector)
        ]

    def snapshot(
        self, key: OwnerKey, rt: KindRuntime, owner: ObjectRef, in_flight: InFlight
    ) -> PodSnapshot:
        pods = self.cached_pods(key, rt, owner)
        return PodSnapshot(
            tuple(pods), in_flight(pods), quorum=False, cached=self.cached_bounds(key, rt, owner)
        )

    def cached_bounds(
        self, key: OwnerKey, rt: KindRuntime, owner: ObjectRef
    ) -> dict[tuple[str, str], tuple[str, str]]:
        """The uid and resourceVersion of each bound ``bounds`` would read, as the caches hold
        it now (a bound the caches do not hold is left out: its read can then never agree)."""
        s, spec = self.s, rt.handler.spec
        out: dict[tuple[str, str], tuple[str, str]] = {}
        held = s.owners.get(owner.uid)
        if spec.owner_resource is not None and held is not None:
            out[("owner", owner.name)] = (held.uid, held.resource_version)
        for w in live_slices(s.workloads.for_owner(key.uid)):
            out[("slice", w.name)] = (w.uid, w.resource_version)
        if spec.select_via is not None:
            for v in via_objects(rt.handler, owner, s.objects.controlled_by(owner.uid)):
                out[("via", v.name)] = (v.uid, v.resource_version)
        return out

    async def quorum_snapshot(
        self, key: OwnerKey, rt: KindRuntime, owner: ObjectRef, in_flight: InFlight
    ) -> PodSnapshot:
        """The owner's pods as the API server holds them (a quorum LIST per selector): what a
        new term decides on until its caches are shown to hold the previous leader's writes.

        Our writes in flight are taken before the LIST is sent and again once it is answered:
        one answered in between is in the list, or still counted.
        """
        s = self.s
        before = in_flight(self.cached_pods(key, rt, owner))
        vias = via_objects(rt.handler, owner, s.objects.controlled_by(owner.uid))
        fresh: dict[str, PodView] = {}
        cached: dict[str, PodView] = {}
        for selector in pod_selectors(rt.handler, owner, vias):
            text = selector_text(selector)
            if s.trace.on:
                s.trace.point("read_start", key, what="pods", name=text)
            items, _ = await s.client.list_objects(PODS, key.namespace, text)
            if s.trace.on:
                s.trace.point("read_end", key, what="pods", name=text, items=len(items))
            for obj in items:
                try:
                    view = parse_pod(obj)
                except MalformedObject:
                    continue
                fresh[view.uid] = view
            cached.update((p.uid, p) for p in rt.pods.select(key.namespace, selector))
        s.stats.proof_reads += 1
        # the cache holds exactly what the server holds: later decisions may use it
        if fresh.keys() == cached.keys() and all(
            _not_older(cached[uid], view) for uid, view in fresh.items()
        ):
            s.freshness.confirm(key)
        pods = list(fresh.values())
        # the caches as they are once the LIST was answered (no await since): a moment after it
        cached_now = self.cached_bounds(key, rt, owner)
        return PodSnapshot(tuple(pods), before | in_flight(pods), quorum=True, cached=cached_now)

    # -- 2. the bounds ---------------------------------------------------------------------------

    async def bounds(
        self,
        key: OwnerKey,
        rt: KindRuntime,
        owner: ObjectRef,
        slices: list[WorkloadView],
        snapshot: PodSnapshot,
    ) -> Bounds:
        """The bounds as they all were at one moment, no earlier than ``snapshot``'s: read them
        all at once; if every answer is the object the caches held at the snapshot, at that
        version, that moment is the snapshot's; else read again, until two rounds in a row show
        every object at the same version (or absent in both).

        One round's reads are answered at different moments, and bounds read at different
        moments can combine into a cap that was never true (a slice read before Kueue lowered
        it, beside an owner read after it grew back). A resourceVersion is never reused, so an
        object found at one version at two moments kept it in between. Read equal to the
        caches' copy at the snapshot: each object had that version when the caches got it
        (before the snapshot) and when read (after it), so at the snapshot every one was as
        read. Two equal rounds: each kept its version from its first read to its second, and
        the second round went out only after the first was answered, so at a moment between
        them every one was as read. A read that fails raises (the worker backs off);
        rounds that keep changing raise ``BoundsMoving`` (``SNAPSHOT_ROUNDS``).
        """
        live = live_slices(slices)
        vias = via_objects(rt.handler, owner, self.s.objects.controlled_by(owner.uid))
        first = await self._read_bounds(key, rt, owner, live, vias)
        read = _versions(first)
        if all(first.values()) and read == snapshot.cached:
            return self._shape(rt, owner, slices, live, vias, first)
        for _ in range(SNAPSHOT_ROUNDS):
            again = await self._read_bounds(key, rt, owner, live, vias)
            if _versions(again) == _versions(first):
                return self._shape(rt, owner, slices, live, vias, again)
            first = again
        raise BoundsMoving(f"{owner.kind} {key.namespace}/{owner.name}: its bounds kept moving")

    async def _read_bounds(
        self,
        key: OwnerKey,
        rt: KindRuntime,
        owner: ObjectRef,
        live: list[WorkloadView],
        vias: list[ObjectView],
    ) -> dict[tuple[str, str], Any]:
        """One round: every bound read at once; the raw answers by (what, name)."""
        s = self.s
        spec = rt.handler.spec
        results: dict[tuple[str, str], Any] = {}
        failures: list[BaseException] = []

        async def read(what: str, name: str, fn: Callable[[], Awaitable[Any]]) -> None:
            if s.trace.on:
                s.trace.point("read_start", key, what=what, name=name)
            try:
                results[(what, name)] = await fn()
            except Exception as exc:  # re-raised below as itself, not as an exception group
                failures.append(exc)
                return
            if s.trace.on:
                s.trace.point("read_end", key, what=what, name=name)

        wl_res = workload_resource(s.workload_version)
        async with anyio.create_task_group() as tg:
            if spec.owner_resource is not None:
                res = _resource(spec.owner_resource)
                tg.start_soon(read, "owner", owner.name, _get(s, res, key.namespace, owner.name))
            for w in live:
                tg.start_soon(read, "slice", w.name, _get(s, wl_res, w.namespace, w.name))
            if spec.select_via is not None:
                res = _resource(spec.select_via)
                for v in vias:
                    tg.start_soon(read, "via", v.name, _get(s, res, key.namespace, v.name))
        if failures:
            raise failures[0]
        return results

    def _shape(
        self,
        rt: KindRuntime,
        owner: ObjectRef,
        slices: list[WorkloadView],
        live: list[WorkloadView],
        vias: list[ObjectView],
        results: dict[tuple[str, str], Any],
    ) -> Bounds:
        """The answers of one round as the decision's bounds."""
        s = self.s
        spec = rt.handler.spec
        fresh_slices = [w for w in slices if w not in live]
        for w in live:
            obj = results[("slice", w.name)]
            view = _workload(obj)
            ours = view is not None and view.owner is not None and view.owner.uid == owner.uid
            if view is not None and view.uid == w.uid and ours:
                fresh_slices.append(view)  # gone, another object, re-owned: not in the chain

        owner_facts: Mapping[str, Any] | None = None
        owner_error = ""
        gone = False
        if spec.owner_resource is not None:
            obj = results[("owner", owner.name)]
            if obj is None or (obj.get("metadata") or {}).get("uid") != owner.uid:
                gone = True
            else:
                parsed = s.parse_owner(rt, obj)
                owner_facts, owner_error = parsed.facts, parsed.error

        fresh_vias: list[ObjectView] = []
        for v in vias:
            obj = results[("via", v.name)]
            if obj is None or (obj.get("metadata") or {}).get("uid") != v.uid:
                gone = True  # the owner's size is in an object that went: wait for the caches
            else:
                fresh_vias.append(s.parse_via(rt, obj))
        return Bounds(tuple(fresh_slices), owner_facts, owner_error, tuple(fresh_vias), gone)


def _versions(results: dict[tuple[str, str], Any]) -> dict[tuple[str, str], tuple[str, str]]:
    """Each answer's identity and version (absent: empty), to tell two rounds apart."""
    out: dict[tuple[str, str], tuple[str, str]] = {}
    for k, obj in results.items():
        meta = (obj or {}).get("metadata") or {}
        out[k] = (str(meta.get("uid", "")), str(meta.get("resourceVersion", "")))
    return out


def _resource(spec: Any) -> Resource:
    return Resource(spec.group, spec.version, spec.plural, spec.kind)


def _get(s: State, res: Resource, namespace: str, name: str) -> Callable[[], Awaitable[Any]]:
    return lambda: s.client.get(res, namespace, name)


def _workload(obj: Mapping[str, Any] | None) -> WorkloadView | None:
    if obj is None:
        return None
    try:
        return parse_workload(obj)
    except MalformedObject:
        return None


def _not_older(cached: PodView, fresh: PodView) -> bool:
    a, b = (version_number(p.resource_version) for p in (cached, fresh))
    return a is not None and b is not None and a >= b
