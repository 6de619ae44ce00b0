"""One owner key to the patches it needs: expectations, then decide, then refresh the owner,
then release.

``Reconciler.reconcile`` is the whole path, read top to bottom. It never decides on a cache
that has not seen its own writes (expectations, settled from the API server when they expire),
refills no freed slot from an owner view that may predate a scale-down (a quorum read first),
and in audit mode compares instead of patching. Patch requests and their outcomes are
``patcher.py``'s; what the operator is told, ``notices.py``'s.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from functools import partial

import anyio

from ungater._assess import owner_facts_of, owner_of, pod_facts, pod_selectors, via_objects
from ungater._cache import OwnerKey
from ungater._decision import Decision, PodFacts, Release, active_slice, decide
from ungater._events import NORMAL, RELEASED, InvolvedObject, released_message
from ungater._kube import PODS, Resource
from ungater._kueue import workload_resource
from ungater._metrics import seconds_since
from ungater._model import (
    ADMITTED,
    MalformedObject,
    ObjectRef,
    PodView,
    WorkloadView,
    parse_pod,
    parse_workload,
)
from ungater._notices import Notices
from ungater._patcher import BLOCKED, CONFLICT, DELETING, ERROR, GONE, SKIPPED, Patcher
from ungater._patcher import RELEASED as PATCH_RELEASED
from ungater._state import KindRuntime, State, resource_version_number

__all__ = ["Changed", "Reconciler"]

log = logging.getLogger("ungater.controller")  # the controller's voice, as before the split


class Changed(Exception):
    """Pods changed under our patches (gone, or our guarded patch refused): retry later."""


class Reconciler:
    def __init__(self, state: State, notices: Notices, patcher: Patcher) -> None:
        self.s = state
        self.notices = notices
        self.patcher = patcher

    async def reconcile(self, key: OwnerKey) -> Decision | None:
        """Decide for one owner and release what the decision chose."""
        s = self.s
        s.stats.reconciles += 1
        slices = s.workloads.for_owner(key.uid)
        if not slices:
            s.expectations.forget_key(key)
            s.decisions.pop(key, None)
            s.auditor.forget(key)
            self.notices.forget(key)
            return None
        owner = owner_of(slices)
        rt = s.kinds.get(owner.group_kind) if owner else None
        if owner is None or rt is None:
            return None
        if rt.mode == "audit":
            return self._audit(key, rt, owner, slices)
        if s.expectations.pending(key):
            expired = s.expectations.expired(key)
            if not expired:
                wait = s.expectations.next_deadline(key) or 0.0
                s.queue.add_after(key, max(wait, 0.01))
                return None
            await self._settle_expired(key, rt, expired)
        decision = self._decide(key, rt, owner, slices)
        if decision.releases:
            # a released pod ended after our last view of the owner or of its slice: the owner
            # may have shrunk first (scale-down), and Kueue lowers a shrunk owner's slice in
            # place after its pods went; refill nothing until fresh reads say how big both are
            stale_owner = self._owner_may_be_stale(key, rt, owner)
            stale_slice = self._slice_may_be_stale(key, slices)
            if stale_owner or stale_slice:
                fresh = await self._refresh(key, rt, owner, slices, stale_owner, stale_slice)
                if not fresh:
                    return None
                slices = fresh
                decision = self._decide(key, rt, owner, slices)
        self.notices.stuck(key, decision)
        s.decisions[key] = decision
        if decision.releases:
            await self._release(key, rt, owner.name, decision, active_slice(slices))
        return decision

    # -- deciding --------------------------------------------------------------------------------

    def _inputs(
        self, key: OwnerKey, rt: KindRuntime, owner: ObjectRef
    ) -> tuple[list[PodFacts], Mapping[str, int] | None]:
        """The decision's input from what the caches hold now: pod facts, the owner's size."""
        vias = via_objects(rt.handler, owner, self.s.objects_controlled_by(owner.uid))
        owner_facts = owner_facts_of(rt.handler, self.s.owner_facts.get(owner.uid), vias)
        pods = [
            p
            for selector in pod_selectors(rt.handler, owner, vias)
            for p in rt.pods.select(key.namespace, selector)
        ]
        facts = pod_facts(rt.handler, owner, pods, self.s.objects, owner_facts)
        desired = rt.handler.desired_counts(owner_facts) if owner_facts is not None else None
        return facts, desired

    def _audit(
        self, key: OwnerKey, rt: KindRuntime, owner: ObjectRef, slices: list[WorkloadView]
    ) -> Decision:
        """Audit mode: the same decision, compared with the pods as they are; nothing patched."""
        s = self.s
        facts, desired = self._inputs(key, rt, owner)
        decision, wait = s.auditor.observe(
            key,
            str(rt.kind),
            owner,
            key.namespace,
            slices,
            facts,
            rt.gate,
            desired,
            s.workload_version,
        )
        s.decisions[key] = decision
        if wait is not None:
            s.queue.add_after(key, wait)
        return decision

    def _decide(
        self, key: OwnerKey, rt: KindRuntime, owner: ObjectRef, slices: list[WorkloadView]
    ) -> Decision:
        """The pure decision on what the caches hold now for this owner."""
        facts, desired = self._inputs(key, rt, owner)
        pods = [f.pod for f in facts]
        return decide(
            slices,
            facts,
            rt.gate,
            self.s.expectations.pending(key) | self._behind_our_writes(pods),
            apply_pod_set_updates=self.s.config.apply_pod_set_updates,
            desired=desired,
            blocked=self.s.blocked.waiting(p.uid for p in pods),
        )

    # -- views that may be stale -----------------------------------------------------------------

    def _behind_our_writes(self, pods: list[PodView]) -> frozenset[str]:
        """Pods whose view predates our own release of them: in flight, whatever the view says.

        Expectations cover the usual wait for the deciding watch; this covers the rest (an
        expectation expired and settled while this view still lags), with no clock involved.
        """
        written = self.s.written
        return frozenset(
            p.uid
            for p in pods
            if p.uid in written
            and (resource_version_number(p.resource_version) or -1) < written[p.uid]
        )

    def _owner_may_be_stale(self, key: OwnerKey, rt: KindRuntime, owner: ObjectRef) -> bool:
        freed = self.s.freed_rv.get(key)
        if freed is None:
            return False
        if rt.handler.spec.select_via is not None:  # its size is that of the objects between
            vias = via_objects(rt.handler, owner, self.s.objects_controlled_by(owner.uid))
            return any((resource_version_number(v.resource_version) or -1) < freed for v in vias)
        if rt.handler.spec.owner_resource is None:
            return False
        return self.s.owner_rv.get(owner.uid, -1) < freed

    def _slice_may_be_stale(self, key: OwnerKey, slices: list[WorkloadView]) -> bool:
        freed = self.s.freed_rv.get(key)
        active = active_slice(slices)
        if freed is None or active is None:
            return False
        rv = resource_version_number(active.resource_version)
        return rv is None or rv < freed

    async def _refresh(
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
                tg.start_soon(read, "owner", partial(self._refresh_owner, rt, key.namespace, owner))
            if stale_slice:
                tg.start_soon(read, "slice", partial(self._refresh_slice, key, slices))
        for result in results.values():
            if isinstance(result, Exception):
                raise result
        if results.get("owner") is False:
            return []
        fresh = results.get("slice", slices)
        assert isinstance(fresh, list)
        return fresh

    async def _refresh_slice(self, key: OwnerKey, slices: list[WorkloadView]) -> list[WorkloadView]:
        """Read the active slice from the API server (a quorum read) into the Workload cache;
        the owner's slices as they are now (none when it cannot be read as one of ours)."""
        active = active_slice(slices)
        assert active is not None
        res = workload_resource(self.s.workload_version)
        obj = await self.s.client.get(res, active.namespace, active.name)
        fresh = parse_workload(obj) if obj is not None else None
        if fresh is None or fresh.uid != active.uid:
            self.s.workloads.on_change(active, None)  # gone, or another object now
            return []
        self.s.workloads.on_change(active, fresh)
        return self.s.workloads.for_owner(key.uid)

    async def _refresh_owner(self, rt: KindRuntime, namespace: str, owner: ObjectRef) -> bool:
        """Read the owner from the API server (a quorum read) into the owner facts.

        False when it is gone or is another object now: nothing may be released for it.
        """
        if rt.handler.spec.select_via is not None:
            await self._refresh_vias(rt, namespace, owner)
            return True
        spec = rt.handler.spec.owner_resource
        assert spec is not None
        res = Resource(spec.group, spec.version, spec.plural, spec.kind)
        obj = await self.s.client.get(res, namespace, owner.name)
        if obj is None or (obj.get("metadata") or {}).get("uid") != owner.uid:
            return False
        view = self.s.parse_owner(rt, obj)
        if resource_version_number(view.resource_version) is None:
            return False
        self.s.keep_owner(view)
        return True

    async def _refresh_vias(self, rt: KindRuntime, namespace: str, owner: ObjectRef) -> None:
        """Read each object the owner's pods are selected through (a quorum read) into the
        cache; one gone, or another object now, leaves it (its pods then count, unreleased)."""
        spec = rt.handler.spec.select_via
        assert spec is not None
        res = Resource(spec.group, spec.version, spec.plural, spec.kind)
        for view in via_objects(rt.handler, owner, self.s.objects_controlled_by(owner.uid)):
            obj = await self.s.client.get(res, namespace, view.name)
            if obj is None or (obj.get("metadata") or {}).get("uid") != view.uid:
                self.s.forget_object(view)
            else:
                self.s.keep_object(self.s.parse_via(rt, obj))

    async def _settle_expired(self, key: OwnerKey, rt: KindRuntime, uids: frozenset[str]) -> None:
        """The watch has not shown our patches in time: ask the API server for the truth.

        A pod that is released keeps counting as in flight (re-armed) until the cache catches up;
        one that is gone or still gated no longer does.
        """
        s = self.s
        s.expectations.expired_total += len(uids)
        for uid in uids:
            pod = rt.pods.by_uid.get(uid)
            s.expectations.observe(uid)
            if pod is None:
                continue
            fresh = await s.client.get(PODS, pod.namespace, pod.name)
            if fresh is None or (fresh.get("metadata") or {}).get("uid") != uid:
                continue
            try:
                view = parse_pod(fresh)
            except MalformedObject:
                continue
            if not view.has_gate(rt.gate) and not view.terminal and not view.deleting:
                s.expectations.expect(key, [uid], rt.kind)
        log.warning(
            "%s: %d expectation(s) expired; settled from the API server",
            s.describe(key),
            len(uids),
        )

    # -- releasing -------------------------------------------------------------------------------

    async def _release(
        self,
        key: OwnerKey,
        rt: KindRuntime,
        owner_name: str,
        decision: Decision,
        active: WorkloadView | None,
    ) -> None:
        """Expect the chosen pods, patch them, and act on each outcome."""
        s = self.s
        releases = decision.releases
        s.expectations.expect(key, [r.pod.uid for r in releases], rt.kind)
        s.ours.update(r.pod.uid for r in releases)
        outcomes = await self.patcher.release_all(releases, rt)  # none once rt audits
        retry = False
        failed = 0
        released: list[Release] = []
        waits: list[float] = []  # since each released pod became releasable
        refused: list[Release] = []
        for r in releases:
            outcome = outcomes.get(r.pod.uid, ERROR)
            if outcome == PATCH_RELEASED:
                s.stats.released += 1
                s.blocked.clear(r.pod.uid)
                released.append(r)
                waited = s.releasable.waited(key, r.pod.uid)
                if waited is not None:
                    waits.append(waited)
            elif outcome == DELETING:
                # ours, but no release: keep it among our pods (its watch event must not look
                # like someone else's release) and re-decide; the expectation stays until the
                # deciding view shows the pod terminating, or a re-decision on the older view
                # (still gated, live) patches it again and reads its own write as foreign
                retry = True
            elif outcome == BLOCKED:
                s.expectations.observe(r.pod.uid)  # refused: nothing of ours in flight
                s.ours.discard(r.pod.uid)
                refused.append(r)
            elif outcome in (GONE, CONFLICT, SKIPPED):
                s.expectations.observe(r.pod.uid)  # nothing of ours is in flight there
                s.ours.discard(r.pod.uid)
                if outcome == CONFLICT:
                    await self.patcher.check_foreign_release(r, rt)
                retry = retry or outcome != SKIPPED
            else:
                failed += 1  # unknown outcome: the patch may have landed; keep expecting it
        self._announce(key, rt, owner_name, decision, active, released, waits)
        if refused:
            self.notices.blocked(key, rt, refused)
        if failed:
            raise RuntimeError(f"{failed} patch(es) failed for {key}")
        if retry:
            # the cache was behind the server: re-decide, but back off per key, so that a
            # lagging watch cannot turn into a hot loop of refused patches
            raise Changed(key)

    def _announce(
        self,
        key: OwnerKey,
        rt: KindRuntime,
        owner_name: str,
        decision: Decision,
        active: WorkloadView | None,
        released: list[Release],
        waits: list[float],
    ) -> None:
        """Metrics, a ``Released`` Event and a log line per pod set released."""
        s = self.s
        by_set: dict[str, int] = {}
        for r in released:
            by_set[r.pod_set] = by_set.get(r.pod_set, 0) + 1
        admitted = active.conditions.get(ADMITTED) if active is not None else None
        latency = seconds_since(admitted.transition_time) if admitted is not None else None
        if s.metrics is not None:
            for waited in waits:
                s.metrics.observe_release_wait(str(rt.kind), waited)
        for pod_set, n in by_set.items():
            if s.metrics is not None:
                for _ in range(n):
                    s.metrics.observe_release(str(rt.kind), pod_set, latency)
            if s.events is not None and active is not None:
                s.events.record(
                    InvolvedObject.workload(active, s.workload_version),
                    NORMAL,
                    RELEASED,
                    released_message(n, pod_set),
                )
            log.info(
                "released %d pod(s) of pod set %s of %s %s/%s (slice %s)",
                n,
                pod_set,
                rt.kind,
                key.namespace,
                owner_name,
                decision.active_slice,
                extra={
                    "workload": decision.active_slice,
                    "owner": f"{rt.kind} {key.namespace}/{owner_name}",
                    "pod_set": pod_set,
                },
            )
