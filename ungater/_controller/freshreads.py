"""Quorum reads that stand in for a cache that may lag: when a view may predate a shrink or a
new leader's term, read the owner, its slice or its pods from the API server before releasing.

``Reconciler`` asks; this module says whether a view may be stale (no I/O) and reads fresh
(I/O). A read also proves an owner: a quorum list of its pods that matches the cache shows the
cache holds what the last leader did.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial

import anyio

from ungater._controller.state import KindRuntime, State, resource_version_number
from ungater._decide.assess import pod_selectors, via_objects
from ungater._decide.decision import active_slice, live_slices
from ungater._decide.indexes import OwnerKey
from ungater._kube.client import PODS, Resource, selector_text
from ungater._kube.kueue import workload_resource
from ungater._model.views import (
    MalformedObject,
    ObjectRef,
    PodView,
    WorkloadView,
    parse_pod,
    parse_workload,
)

__all__ = ["FreshReads"]


class FreshReads:
    def __init__(self, state: State) -> None:
        self.s = state

    def owner_may_be_stale(self, key: OwnerKey, rt: KindRuntime, owner: ObjectRef) -> bool:
        fresh = self.s.freshness
        if key not in fresh.shrink_rv:
            return False
        if rt.handler.spec.select_via is not None:  # its size is that of the objects between
            vias = via_objects(rt.handler, owner, self.s.objects_controlled_by(owner.uid))
            return any(
                fresh.predates_shrink(key, resource_version_number(v.resource_version) or -1)
                for v in vias
            )
        if rt.handler.spec.owner_resource is None:
            return False
        return fresh.predates_shrink(key, fresh.owner_rv.get(owner.uid, -1))

    def unproven(self, key: OwnerKey) -> bool:
        return self.s.freshness.unproven(key)

    @staticmethod
    def owner_readable(rt: KindRuntime) -> bool:
        spec = rt.handler.spec
        return spec.owner_resource is not None or spec.select_via is not None

    def slice_may_be_stale(self, key: OwnerKey, slices: list[WorkloadView]) -> bool:
        active = active_slice(slices)
        if active is None:
            return False
        return self.s.freshness.predates_shrink(
            key, resource_version_number(active.resource_version)
        )

    async def refresh(
        self,
        key: OwnerKey,
        rt: KindRuntime,
        owner: ObjectRef,
        slices: list[WorkloadView],
        stale_owner: bool,
        stale_slice: bool,
    ) -> list[WorkloadView]:
        """The quorum reads the fence needs, at once (one round trip, not two): the owner's
        slices as they are now, or none when nothing may be released for it."""
        results: dict[str, object] = {}

        async def read(what: str, fn: Callable[[], Awaitable[object]]) -> None:
            try:
                results[what] = await fn()
            except Exception as exc:  # re-raised below as itself, not as an exception group
                results[what] = exc

        async with anyio.create_task_group() as tg:
            if stale_owner:
                tg.start_soon(read, "owner", partial(self.refresh_owner, rt, key.namespace, owner))
            if stale_slice:
                tg.start_soon(read, "slice", partial(self.refresh_slice, key, slices))
        for result in results.values():
            if isinstance(result, Exception):
                raise result
        if results.get("owner") is False:
            return []
        fresh = results.get("slice", slices)
        assert isinstance(fresh, list)
        return fresh

    async def refresh_slice(self, key: OwnerKey, slices: list[WorkloadView]) -> list[WorkloadView]:
        """Read the active slice from the API server (a quorum read) into the Workload cache;
        the owner's slices as they are now (none when it cannot be read as one of ours).

        A read that shows the slice finished or evicted makes another cached slice the active
        one: the decision must never rest on a slice the fence did not read. So every cached
        slice that may be the active one (admitted, neither finished nor evicted, as cached) is
        read at once, in one round trip rather than one per slice handed over; a slice that
        becomes active and was not read is read in a round of its own (at most one read per
        cached slice in all).
        """
        read: set[str] = set()
        for _ in range(len(slices)):
            cached = self.s.workloads.for_owner(key.uid)
            active = active_slice(cached)
            if active is None or active.uid in read:
                break
            batch = [w for w in live_slices(cached) if w.uid not in read]
            read.update(w.uid for w in batch)
            await self._read_slices(key, batch)
        now = self.s.workloads.for_owner(key.uid)
        active = active_slice(now)
        return now if active is not None and active.uid in read else []

    async def _read_slices(self, key: OwnerKey, batch: list[WorkloadView]) -> None:
        """Read each slice of ``batch`` at once into the cache; the first failure re-raised."""
        res = workload_resource(self.s.workload_version)
        failures: list[Exception] = []

        async def one(view: WorkloadView) -> None:
            if self.s.trace.on:
                self.s.trace.point("read_start", key, what="slice", name=view.name)
            try:
                obj = await self.s.client.get(res, view.namespace, view.name)
            except Exception as exc:  # re-raised below as itself, not as an exception group
                failures.append(exc)
                return
            if self.s.trace.on:
                self.s.trace.point("read_end", key, what="slice", name=view.name)
            fresh = parse_workload(obj) if obj is not None else None
            if fresh is None or fresh.uid != view.uid:
                self.s.workloads.on_change(view, None)  # gone, or another object now
            else:
                self.s.workloads.on_change(view, fresh)

        async with anyio.create_task_group() as tg:
            for view in batch:
                tg.start_soon(one, view)
        if failures:
            raise failures[0]

    async def refresh_owner(self, rt: KindRuntime, namespace: str, owner: ObjectRef) -> bool:
        """Read the owner from the API server (a quorum read) into the owner facts.

        False when it is gone or is another object now: nothing may be released for it.
        """
        if rt.handler.spec.select_via is not None:
            await self.refresh_vias(rt, namespace, owner)
            return True
        spec = rt.handler.spec.owner_resource
        assert spec is not None
        res = Resource(spec.group, spec.version, spec.plural, spec.kind)
        trace, key = self.s.trace, OwnerKey(namespace, owner.uid)
        if trace.on:
            trace.point("read_start", key, what="owner", name=owner.name)
        obj = await self.s.client.get(res, namespace, owner.name)
        if trace.on:
            trace.point("read_end", key, what="owner", name=owner.name)
        if obj is None or (obj.get("metadata") or {}).get("uid") != owner.uid:
            return False
        view = self.s.parse_owner(rt, obj)
        if resource_version_number(view.resource_version) is None:
            return False
        self.s.keep_owner(view)
        return True

    async def refresh_vias(self, rt: KindRuntime, namespace: str, owner: ObjectRef) -> None:
        """Read each object the owner's pods are selected through (a quorum read) into the
        cache; one gone, or another object now, leaves it (its pods then count, unreleased)."""
        spec = rt.handler.spec.select_via
        assert spec is not None
        res = Resource(spec.group, spec.version, spec.plural, spec.kind)
        trace, key = self.s.trace, OwnerKey(namespace, owner.uid)
        for view in via_objects(rt.handler, owner, self.s.objects_controlled_by(owner.uid)):
            if trace.on:
                trace.point("read_start", key, what="via", name=view.name)
            obj = await self.s.client.get(res, namespace, view.name)
            if trace.on:
                trace.point("read_end", key, what="via", name=view.name)
            if obj is None or (obj.get("metadata") or {}).get("uid") != view.uid:
                self.s.forget_object(view)
            else:
                self.s.keep_object(self.s.parse_via(rt, obj))

    async def read_pods(self, key: OwnerKey, rt: KindRuntime, owner: ObjectRef) -> list[PodView]:
        """The owner's pods as the API server has them now (a quorum list per selector): what a
        new leader decides on until its cache is shown to hold the same."""
        s = self.s
        vias = via_objects(rt.handler, owner, s.objects_controlled_by(owner.uid))
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
        # the cache holds what the server holds: it may decide alone (unless another worker
        # found, during our reads, that every cache is past the term's start: then all are)
        if fresh.keys() == cached.keys() and all(
            _not_older(cached[uid], view) for uid, view in fresh.items()
        ):
            s.freshness.prove(key)
        return list(fresh.values())


def _not_older(cached: PodView, fresh: PodView) -> bool:
    a, b = (resource_version_number(p.resource_version) for p in (cached, fresh))
    return a is not None and b is not None and a >= b
