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

from ungater._controller.notices import Notices
from ungater._controller.patcher import BLOCKED, CONFLICT, DELETING, ERROR, GONE, SKIPPED, Patcher
from ungater._controller.patcher import RELEASED as PATCH_RELEASED
from ungater._controller.state import KindRuntime, State, Uncertain, resource_version_number
from ungater._decide.assess import owner_facts_of, owner_of, pod_facts, pod_selectors, via_objects
from ungater._decide.decision import Decision, PodFacts, Release, active_slice, decide
from ungater._decide.indexes import OwnerKey
from ungater._decide.patches import fence_patch
from ungater._kube.client import PODS, ApiError, Resource
from ungater._kube.kueue import workload_resource
from ungater._model.views import (
    ADMITTED,
    MalformedObject,
    ObjectRef,
    ObjectView,
    PodView,
    WorkloadView,
    parse_pod,
    parse_workload,
)
from ungater._observe.events import NORMAL, RELEASED, InvolvedObject, released_message
from ungater._observe.metrics import seconds_since

__all__ = ["Changed", "Reconciler"]

log = logging.getLogger("ungater.controller")  # the controller's voice, as before the split


#: How soon an owner comes back when one of its unanswered releases could not be settled.
UNSETTLED_RETRY_SECONDS = 1.0


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
        if any(u.key == key for u in s.uncertain.values()):
            await self._settle_uncertain(key, rt)
        if s.expectations.pending(key):
            expired = s.expectations.expired(key)
            if not expired:
                wait = s.expectations.next_deadline(key) or 0.0
                s.queue.add_after(key, max(wait, 0.01))
                return None
            await self._settle_expired(key, rt, expired)
        if rt.handler.spec.owner_resource is not None and owner.uid not in s.owner_facts:
            # its size bounds the cap, and a size unknown releases nothing: read it now
            # rather than wait for a lagging owner watch (gone: it stays unknown)
            await self._refresh_owner(rt, key.namespace, owner)
        decision = self._decide(key, rt, owner, slices)
        if decision.releases:
            # a pod ended or went, or the owner changed, after our last view of the owner or
            # of its slice: the owner may have shrunk first (scale-down), and Kueue lowers a
            # shrunk owner's slice in place after its pods went; and a new leader's caches may
            # lag what the last one did. Release nothing until fresh reads say how it is.
            unproven = self._unproven(key)
            stale_owner = self._owner_may_be_stale(key, rt, owner) or (
                unproven and self._owner_readable(rt)
            )
            stale_slice = unproven or self._slice_may_be_stale(key, slices)
            if stale_owner or stale_slice:
                fresh = await self._refresh(key, rt, owner, slices, stale_owner, stale_slice)
                if not fresh:
                    return None
                slices = fresh
                pods = await self._read_pods(key, rt, owner) if unproven else None
                decision = self._decide(key, rt, owner, slices, pods)
        self.notices.stuck(key, decision)
        s.decisions[key] = decision
        if decision.releases:
            await self._release(key, rt, owner.name, decision, active_slice(slices))
        return decision

    # -- deciding --------------------------------------------------------------------------------

    def _inputs(
        self, key: OwnerKey, rt: KindRuntime, owner: ObjectRef, pods: list[PodView] | None = None
    ) -> tuple[list[PodFacts], Mapping[str, int] | None, str]:
        """The decision's input from what the caches hold now (or from ``pods``, read fresh):
        pod facts, the owner's size, and why that size is unknown (empty when it is known)."""
        vias = via_objects(rt.handler, owner, self.s.objects_controlled_by(owner.uid))
        owner_facts = owner_facts_of(rt.handler, self.s.owner_facts.get(owner.uid), vias)
        if pods is None:
            pods = [
                p
                for selector in pod_selectors(rt.handler, owner, vias)
                for p in rt.pods.select(key.namespace, selector)
            ]
        facts = pod_facts(rt.handler, owner, pods, self.s.objects, owner_facts)
        desired = rt.handler.desired_counts(owner_facts) if owner_facts is not None else None
        return facts, desired, self._size_unknown(rt, owner, vias)

    def _size_unknown(self, rt: KindRuntime, owner: ObjectRef, vias: list[ObjectView]) -> str:
        """Why the owner's own size cannot be read, if it cannot: a bound that fails must hold
        everything, not fall back to the slice alone."""
        errors = [f"{v.kind} {v.name}: {v.facts_error}" for v in vias if v.facts_error]
        if errors:
            return "; ".join(errors)
        if rt.handler.spec.owner_resource is None:
            return ""
        error = self.s.owner_errors.get(owner.uid)
        if error is not None:
            return error
        if owner.uid not in self.s.owner_facts:
            return f"{owner.kind} {owner.name} is not in the cache (yet)"
        return ""

    def _audit(
        self, key: OwnerKey, rt: KindRuntime, owner: ObjectRef, slices: list[WorkloadView]
    ) -> Decision:
        """Audit mode: the same decision, compared with the pods as they are; nothing patched."""
        s = self.s
        facts, desired, _unknown = self._inputs(key, rt, owner)
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
        self,
        key: OwnerKey,
        rt: KindRuntime,
        owner: ObjectRef,
        slices: list[WorkloadView],
        fresh_pods: list[PodView] | None = None,
    ) -> Decision:
        """The pure decision on what the caches hold now for this owner (its pods as
        ``fresh_pods`` says, when they were read from the API server)."""
        facts, desired, unknown = self._inputs(key, rt, owner, fresh_pods)
        pods = [f.pod for f in facts]
        s = self.s
        blocked = s.blocked.waiting(p.uid for p in pods)
        retry = s.blocked.next_retry(blocked)
        if retry is not None:
            # a refused pod is tried again when its backoff runs out, whatever earlier wake-up
            # of this owner consumed the one the refusal set
            s.queue.add_after(key, max(retry, 0.01))
        return decide(
            slices,
            facts,
            rt.gate,
            s.expectations.pending(key) | self._behind_our_writes(pods) | frozenset(s.uncertain),
            apply_pod_set_updates=s.config.apply_pod_set_updates,
            desired=desired,
            blocked=blocked,
            size_unknown=unknown,
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

    def _unproven(self, key: OwnerKey) -> bool:
        """Whether this term has yet to show that the caches hold what the last leader did,
        for this owner: by a quorum read that matched them, or by every cache having seen
        past the Lease write that began the term (then no owner needs a read any more)."""
        s = self.s
        if s.proven is None or key in s.proven:
            return False
        seen = [resource_version_number(v) for v in s.cache_versions()]
        if s.term_rv and seen and all(v is not None and v >= s.term_rv for v in seen):
            s.proven = None
            return False
        return True

    @staticmethod
    def _owner_readable(rt: KindRuntime) -> bool:
        spec = rt.handler.spec
        return spec.owner_resource is not None or spec.select_via is not None

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

    async def _read_pods(self, key: OwnerKey, rt: KindRuntime, owner: ObjectRef) -> list[PodView]:
        """The owner's pods as the API server has them now (a quorum list per selector): what a
        new leader decides on until its cache is shown to hold the same."""
        s = self.s
        vias = via_objects(rt.handler, owner, s.objects_controlled_by(owner.uid))
        fresh: dict[str, PodView] = {}
        cached: dict[str, PodView] = {}
        for selector in pod_selectors(rt.handler, owner, vias):
            text = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
            items, _ = await s.client.list_objects(PODS, key.namespace, text)
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
        if (
            s.proven is not None
            and fresh.keys() == cached.keys()
            and all(_not_older(cached[uid], view) for uid, view in fresh.items())
        ):
            s.proven.add(key)
        return list(fresh.values())

    async def _settle_uncertain(self, key: OwnerKey, rt: KindRuntime) -> None:
        """Settle each release of this owner whose outcome is unknown, for good: it counts as
        released until the server shows the pod at another version (the patch tests the one
        it was decided on, so it can no longer land) or gone."""
        s = self.s
        unsettled = 0
        for uid, u in [(uid, u) for uid, u in s.uncertain.items() if u.key == key]:
            if await self._fence(key, rt, uid, u):
                s.uncertain.pop(uid, None)
            else:
                unsettled += 1
        if unsettled:  # still in flight: decide on that, and come back to settle it
            s.queue.add_after(key, UNSETTLED_RETRY_SECONDS)

    async def _fence(self, key: OwnerKey, rt: KindRuntime, uid: str, u: Uncertain) -> bool:
        """True once the release sent as ``u`` can never land (and, if it did, it is counted)."""
        s = self.s
        for _ in range(3):  # each round either settles or saw the pod change meanwhile
            try:
                obj = await s.client.get(PODS, u.namespace, u.name)
            except (ApiError, OSError, TimeoutError) as exc:
                log.warning("pod %s/%s: cannot settle a release yet: %r", u.namespace, u.name, exc)
                return False
            if obj is None or (obj.get("metadata") or {}).get("uid") != uid:
                # gone (a pod of the same name is not at the tested version); the release may
                # have landed first, and a lagging watch may still show it: not someone else's
                s.went(uid)
                return True
            view = parse_pod(obj)
            if view.resource_version != u.resource_version:
                if not view.has_gate(rt.gate) and not view.terminal and not view.deleting:
                    # released, by that patch or another writer: counted until seen
                    s.expectations.expect(key, [uid], rt.kind)
                    s.ours.add(uid)
                    written = resource_version_number(view.resource_version)
                    if written is not None:
                        s.written[uid] = max(written, s.written.get(uid, 0))
                return True
            # unchanged since the decision: the patch has not landed, and still could;
            # change the pod, so that it cannot
            fence = fence_patch(u.resource_version, bool(view.annotations))
            try:
                await s.client.json_patch(PODS, u.namespace, u.name, fence)
            except ApiError as exc:
                if exc.status == 404:
                    s.went(uid)  # gone since the read: as above
                    return True
                if exc.status in (409, 422):
                    continue  # it changed under the fence: look again
                log.warning("pod %s/%s: the fence was refused: %s", u.namespace, u.name, exc)
                return False  # refused or failed: the release stays in flight
            except (OSError, TimeoutError) as exc:
                log.warning("pod %s/%s: the fence failed: %r", u.namespace, u.name, exc)
                return False
            s.stats.fences += 1
            log.info("pod %s/%s: an unanswered release can no longer land", u.namespace, u.name)
            return True
        return False

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
        for r in releases:  # until each request's answer says otherwise, it may have landed
            s.uncertain[r.pod.uid] = Uncertain(
                key, r.pod.namespace, r.pod.name, r.pod.resource_version
            )
        outcomes = await self.patcher.release_all(releases, rt)  # none once rt audits
        retry = False
        failed = 0
        released: list[Release] = []
        waits: list[float] = []  # since each released pod became releasable
        refused: list[Release] = []
        for r in releases:
            outcome = outcomes.get(r.pod.uid, ERROR)
            if outcome != ERROR:
                s.uncertain.pop(r.pod.uid, None)  # answered: we know what became of it
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
                # unknown outcome: the patch may have landed, or may still land; it stays
                # uncertain (in flight) until the next reconcile settles it (_settle_uncertain)
                failed += 1
                s.expectations.observe(r.pod.uid)
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


def _not_older(cached: PodView, fresh: PodView) -> bool:
    a, b = (resource_version_number(p.resource_version) for p in (cached, fresh))
    return a is not None and b is not None and a >= b
