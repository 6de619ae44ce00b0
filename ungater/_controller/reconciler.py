"""One owner key to the patches it needs: settle our writes, ask the caches, read the view,
decide, release.

``Reconciler._reconcile`` is the whole path, read top to bottom (``reconcile`` adds the
trace's start and end around it, ``logging.trace``). It never decides on a cache that has not
seen its own writes (expectations, settled from the API server when they expire); the caches
only say whether a release may be due, and every release is decided on the view of ``view.py``
(the pods, then every bound read from the API server after them). In audit mode it compares
instead of patching. Patch requests and their outcomes are
``patcher.py``'s; what the operator is told, ``notices.py``'s.

A reconcile returns its ``Outcome`` (the decision, when to look again, whether to back off)
and never touches the work queue: the worker does (``controller.py``), as controller-runtime's
does with a ``Result``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum

import anyio

from ungater._controller.notices import Notices
from ungater._controller.patcher import Patcher
from ungater._controller.settling import UNSETTLED_RETRY_SECONDS, Settler
from ungater._controller.state import KindRuntime, State
from ungater._controller.view import Bounds, BoundsMoving, PodSnapshot, View, ViewReader
from ungater._decide.assess import FactsMemo, owner_facts_of, owner_of, pod_facts, via_objects
from ungater._decide.decision import Decision, PodFacts, Release, active_slice, decide
from ungater._decide.freshness import version_number
from ungater._decide.indexes import OwnerKey
from ungater._decide.refusals import PatchOutcome
from ungater._model.views import (
    ADMITTED,
    ObjectRef,
    PodView,
    WorkloadView,
)
from ungater._observe.events import NORMAL, RELEASED, InvolvedObject, released_message
from ungater._observe.metrics import seconds_since

__all__ = ["Outcome", "Reconciler", "Retry"]

log = logging.getLogger("ungater.controller")  # one logger for the controller's parts


class Retry(StrEnum):
    """Why the worker retries an owner with its per-key backoff (the values are the ``result``
    label of ``ungater_reconcile_total``)."""

    CHANGED = "conflict"  # pods changed under our patches (gone, or our guarded patch refused)
    MOVING = "moving"  # the bounds kept changing while read (view.BoundsMoving)
    FAILED = "error"  # patches whose outcome is unknown (a timeout, a 5xx)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one reconcile asks of the worker: ``after`` seconds, look at the owner again
    (0: at once); ``retry``, back off per key before the next try."""

    decision: Decision | None = None
    after: float | None = None
    retry: Retry | None = None

    def sooner(self, after: float | None) -> Outcome:
        """The same, looked at again by ``after`` at the latest."""
        if after is None or (self.after is not None and self.after <= after):
            return self
        return replace(self, after=max(after, 0.0))


class _Wake:
    """What wakes the watch of an owner's waves: a change of its objects, or an answer."""

    __slots__ = ("changed", "event")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.changed = False


class Reconciler:
    def __init__(self, state: State, notices: Notices, patcher: Patcher) -> None:
        self.s = state
        self.notices = notices
        self.patcher = patcher
        self.view = ViewReader(state)
        self.settler = Settler(
            state.client,
            state.ledger,
            concurrency=state.config.client.patch_concurrency,
            stats=state.stats,
            held=lambda uid: any(uid in rt.pods.by_uid for rt in state.kinds.values()),
            forget_pod=state.forget_pod,
            describe=state.describe,
        )
        #: The reads of each owner's view under way, which an admission may cut short.
        self._reading: dict[OwnerKey, anyio.CancelScope] = {}
        #: Owners with a wave out, woken when one of their objects changes (``touched``).
        self._changes: dict[OwnerKey, _Wake] = {}
        #: The plugin's answers about the pods of the last owners decided on: a decision asks
        #: again only about pods whose view changed (``assess.FactsMemo``).
        self._facts_memo = FactsMemo()
        state.forgetters.append(lambda key: self._facts_memo.forget(key.uid))
        #: Called with each decision that releases, before any patch is sent (no await
        #: between): what tests and tools watch the controller decide through.
        self.on_decision: Callable[[OwnerKey, Decision], None] | None = None

    async def reconcile(self, key: OwnerKey) -> Outcome:
        """Decide for one owner and release what the decision chose."""
        trace = self.s.trace
        if not trace.on:
            return await self._reconcile(key)
        trace.point("reconcile_start", key)
        label = "cancelled"
        try:
            outcome = await self._reconcile(key)
            label = outcome.retry or ("none" if outcome.decision is None else "decided")
            return outcome
        except Exception as exc:  # an API error, a plugin's: the worker's to handle
            label = type(exc).__name__
            raise
        finally:
            trace.point("reconcile_end", key, outcome=label)

    async def _reconcile(self, key: OwnerKey) -> Outcome:
        s = self.s
        s.stats.reconciles += 1
        slices = s.workloads.for_owner(key.uid)
        if not slices:
            s.forget_owner(key)
            return Outcome()
        owner = owner_of(slices)
        rt = s.kinds.get(owner.group_kind) if owner else None
        if owner is None or rt is None:
            return Outcome()
        later = Outcome()
        if rt.stood_down:
            later = later.sooner(self.notices.stand_up_if_due(rt))
        if rt.mode == "audit":
            decision, wait = self._audit(key, rt, owner, slices)
            return replace(later, decision=decision).sooner(wait)
        if s.ledger.uncertain_of(key) and not await self.settler.settle_uncertain(key, rt):
            later = later.sooner(UNSETTLED_RETRY_SECONDS)  # still in flight: settle it soon
        if s.ledger.expectations.has_pending(key):
            # our releases the deciding view has not shown yet count in flight (the snapshot
            # takes them), so the owner is decided on all the same; one that expired is read
            # back first, and the owner comes back when the next one expires
            expired = s.ledger.expectations.expired(key)
            if expired and not await self.settler.settle_expired(key, rt, expired):
                later = later.sooner(UNSETTLED_RETRY_SECONDS)  # one read failed: again soon
            wait = s.ledger.expectations.next_deadline(key)
            if wait is not None:
                later = later.sooner(max(wait, 0.01))
        if self._writes_unseen(key, rt):
            # a write of ours may have released a pod this view does not hold at all (one
            # released on a new term's quorum reads): the view cannot count it, so wait
            deadline = s.ledger.expectations.next_deadline(key)
            return later.sooner(max(deadline if deadline is not None else 1.0, 0.01))
        view = self._cached_view(key, rt, owner, slices)
        decision, retry = self._decide(key, rt, owner, view, unbounded_if_uncached=True)
        if decision.releases:
            # the caches say a release is due: decide again on the view (view.py), the pods
            # first, then every bound read from the API server after them
            read = await self._read_view(key, rt, owner, view)
            if isinstance(read, Outcome):
                return replace(later, retry=read.retry).sooner(read.after)
            view = read
            decision, retry = self._decide(key, rt, owner, view)
        later = later.sooner(retry)  # a refused pod is tried again when its backoff runs out
        if s.trace.on:
            s.trace.point("decided", key, releases=len(decision.releases))
        later = later.sooner(self.notices.stuck(key, decision))
        s.decisions[key] = decision
        if decision.releases:
            released = await self._waves(key, rt, owner, decision, view)
            later = replace(later, retry=released.retry).sooner(released.after)
        return replace(later, decision=decision)

    async def _read_view(
        self, key: OwnerKey, rt: KindRuntime, owner: ObjectRef, cached: View
    ) -> View | Outcome:
        """The view a release is decided on: the cached pods (a quorum LIST in a term not yet
        proven), then every bound read after them; or, when no view can be had now, what the
        worker is to do (bounds moving: back off; gone: nothing; cut short: again at once)."""
        s = self.s
        snapshot = cached.pods
        with anyio.CancelScope() as reading:
            self._reading[key] = reading  # preempt_reads may drop these reads
            try:
                if s.freshness.unconfirmed(key):  # a new term: the caches may lag
                    snapshot = await self.view.quorum_snapshot(key, rt, owner, self._in_flight(key))
                bounds = await self.view.bounds(
                    key, rt, owner, s.workloads.for_owner(key.uid), snapshot
                )
            except BoundsMoving as exc:
                log.info("%s; retrying with backoff", exc)
                return Outcome(retry=Retry.MOVING)
            finally:
                del self._reading[key]
        if reading.cancelled_caught:  # nothing was written on these reads: decide anew
            return Outcome(after=0.0)
        if bounds.gone:
            return Outcome()
        return View(snapshot, bounds, self.view.basis(key))

    # -- waves -----------------------------------------------------------------------------------

    def touched(self, key: OwnerKey) -> None:
        """An object of this owner changed (the handlers queued it): if a wave of its is
        out, decide again now rather than once every answer is in."""
        woken = self._changes.get(key)
        if woken is not None:
            woken.changed = True
            woken.event.set()

    async def _waves(
        self, key: OwnerKey, rt: KindRuntime, owner: ObjectRef, decision: Decision, view: View
    ) -> Outcome:
        """Release what ``decision`` chose; while its answers are out, decide again on every
        change of the owner's objects (a new view each time) and release what that chooses
        too, so that pods created meanwhile do not wait for the slowest answer. Each wave is
        in the ledger before this returns to the event loop, so every later decision counts
        the earlier waves' pods in flight (docs/safety.md, "Waves that overlap")."""
        results: list[Outcome] = []
        out = 0
        woken = self._changes[key] = _Wake()
        try:
            async with anyio.create_task_group() as tg:

                async def wave(d: Decision, v: View) -> None:
                    nonlocal out
                    try:
                        results.append(await self._release(key, rt, owner.name, d, v))
                    finally:
                        out -= 1
                        woken.event.set()  # the watch ends once every answer is in

                def send(d: Decision, v: View) -> None:
                    nonlocal out
                    if self.on_decision is not None:
                        self.on_decision(key, d)
                    self._sending(key, rt, d)  # counted in flight from this moment on
                    out += 1
                    tg.start_soon(wave, d, v)

                async def watch() -> None:
                    # never cancelled: a decision it makes is always sent (a wave cancelled
                    # before its patches went out would count in flight until it expired)
                    while True:
                        await woken.event.wait()
                        woken.event = anyio.Event()
                        if woken.changed:
                            woken.changed = False
                            again = await self._decide_again(key, rt, owner)
                            if again is not None:
                                send(*again)
                        if out == 0 and not woken.changed:
                            return

                send(decision, view)
                tg.start_soon(watch)
        finally:
            del self._changes[key]
        merged = Outcome()
        for r in results:
            if r.retry is not None and (merged.retry is None or r.retry == Retry.FAILED):
                merged = replace(merged, retry=r.retry)
            merged = merged.sooner(r.after)
        return merged

    async def _decide_again(
        self, key: OwnerKey, rt: KindRuntime, owner: ObjectRef
    ) -> tuple[Decision, View] | None:
        """A decision while earlier waves' answers are out, made as the reconcile's first
        was (the caches, then a view); None when it releases nothing or cannot be made now
        (the owner is queued again by what changed, and decided on once the waves are in)."""
        s = self.s
        slices = s.workloads.for_owner(key.uid)
        if not slices or rt.mode != "release" or self._writes_unseen(key, rt):
            return None
        view = self._cached_view(key, rt, owner, slices)
        decision, _ = self._decide(key, rt, owner, view, unbounded_if_uncached=True)
        if not decision.releases:
            return None
        try:
            read = await self._read_view(key, rt, owner, view)
        except Exception as exc:  # a failed read: the re-run the change queued meets it
            log.info("%s: a read while releasing failed: %r", s.describe(key), exc)
            return None
        if isinstance(read, Outcome):
            return None
        decision, _ = self._decide(key, rt, owner, read)
        if s.trace.on:
            s.trace.point("decided", key, releases=len(decision.releases))
        if not decision.releases:
            return None
        s.decisions[key] = decision
        return decision, read

    def preempt_reads(self, key: OwnerKey) -> bool:
        """An admission of this owner changed while its reconcile reads a view: drop those
        reads, so that the reconcile the event queued decides on the new admission now, not
        after rounds of reads for a decision it makes moot. Only reads are dropped, never a
        write (docs/safety.md, "Reads cut short"). True if there were reads to drop."""
        reading = self._reading.get(key)
        if reading is None:
            return False
        reading.cancel()
        self.s.stats.reads_preempted += 1
        if self.s.trace.on:
            self.s.trace.point("reads_preempted", key)
        return True

    # -- deciding --------------------------------------------------------------------------------

    def _in_flight(self, key: OwnerKey) -> Callable[[list[PodView]], frozenset[str]]:
        """Which of these pods our writes may have released though their views do not show it:
        expected, unanswered, or released at a version newer than the view (the ledger)."""
        s = self.s

        def of(pods: list[PodView]) -> frozenset[str]:
            return (
                s.ledger.expectations.pending(key)
                | self._released_unseen(pods)
                | s.ledger.uncertain_pods()
            )

        return of

    def _cached_view(
        self, key: OwnerKey, rt: KindRuntime, owner: ObjectRef, slices: list[WorkloadView]
    ) -> View:
        """The caches, shaped as a view: they say whether a view is worth reading, and are what
        audit mode compares with (it patches nothing)."""
        s = self.s
        snapshot = self.view.snapshot(key, rt, owner, self._in_flight(key))
        vias = via_objects(rt.handler, owner, s.objects.controlled_by(owner.uid))
        cached = s.owners.get(owner.uid)
        bounds = Bounds(
            tuple(slices),
            cached.facts if cached is not None else None,
            cached.error if cached is not None else "",
            tuple(vias),
            gone=False,
        )
        return View(snapshot, bounds, self.view.basis(key))

    def _size_unknown(self, rt: KindRuntime, owner: ObjectRef, bounds: Bounds) -> str:
        """Why the owner's own size cannot be read, if it cannot: a bound that fails must hold
        everything, not fall back to the slice alone."""
        errors = [f"{v.kind} {v.name}: {v.facts_error}" for v in bounds.vias if v.facts_error]
        if errors:
            return "; ".join(errors)
        if rt.handler.spec.owner_resource is None:
            return ""
        if bounds.owner_error:
            return bounds.owner_error
        if bounds.owner_facts is None:
            return f"{owner.kind} {owner.name} is not in the cache (yet)"
        return ""

    def _audit(
        self, key: OwnerKey, rt: KindRuntime, owner: ObjectRef, slices: list[WorkloadView]
    ) -> tuple[Decision, float | None]:
        """Audit mode: the same decision, compared with the pods as they are; nothing patched.
        Also when to look again (a finding that waits for a grace)."""
        s = self.s
        s.stalls.forget(key)  # an audited kind's stalls are the auditor's findings
        view = self._cached_view(key, rt, owner, slices)
        facts, desired = self._facts(rt, owner, view.pods, view.bounds)
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
        return decision, wait

    def _facts(
        self, rt: KindRuntime, owner: ObjectRef, snapshot: PodSnapshot, bounds: Bounds
    ) -> tuple[list[PodFacts], Mapping[str, int] | None]:
        """The plugin's facts of each pod of the view, and the owner's size per pod set."""
        owner_facts = owner_facts_of(rt.handler, bounds.owner_facts, list(bounds.vias))
        objects = self.s.objects
        memo = (self._facts_memo, objects.version)
        facts = pod_facts(rt.handler, owner, snapshot.pods, objects.by_uid, owner_facts, memo)
        desired = rt.handler.desired_counts(owner_facts) if owner_facts is not None else None
        return facts, desired

    def _decide(
        self,
        key: OwnerKey,
        rt: KindRuntime,
        owner: ObjectRef,
        view: View,
        unbounded_if_uncached: bool = False,
    ) -> tuple[Decision, float | None]:
        """The pure decision on one view, and when its first refused pod may be tried again.
        ``unbounded_if_uncached``: an owner the cache does not hold yet does not stop the
        caches from asking for a view (the view reads it)."""
        snapshot, bounds = view.pods, view.bounds
        facts, desired = self._facts(rt, owner, snapshot, bounds)
        unknown = self._size_unknown(rt, owner, bounds)
        if unbounded_if_uncached and bounds.owner_facts is None and not bounds.owner_error:
            unknown = ""
        s = self.s
        blocked = s.blocked.waiting(f.pod.uid for f in facts)
        retry = s.blocked.next_retry(blocked)
        decision = decide(
            list(bounds.slices),
            facts,
            rt.gate,
            snapshot.in_flight,
            apply_pod_set_updates=s.config.apply_pod_set_updates,
            desired=desired,
            blocked=blocked,
            size_unknown=unknown,
        )
        return decision, max(retry, 0.01) if retry is not None else None

    # -- views that may be stale -----------------------------------------------------------------

    def _writes_unseen(self, key: OwnerKey, rt: KindRuntime) -> bool:
        """Whether a release of ours for this owner, still in flight (expected or unanswered),
        is of a pod the deciding index does not hold: a decision would count it as nothing."""
        s, held = self.s, rt.pods.by_uid
        pending = s.ledger.expectations.pending(key)
        return any(uid not in held for uid in pending) or any(
            uid not in held for uid, _ in s.ledger.uncertain_of(key)
        )

    def _released_unseen(self, pods: list[PodView]) -> frozenset[str]:
        """Pods whose view predates a release this replica knows of: in flight, whatever the
        view says.

        Expectations cover the usual wait for the deciding watch; this covers the rest: our
        release whose expectation expired and was settled while this view still lags, and
        another writer's release that another of our views (another kind's pod watch, the
        read after a refused patch) has shown first. No clock is involved.
        """
        ledger = self.s.ledger
        return frozenset(
            p.uid for p in pods if ledger.released_unseen(p.uid, version_number(p.resource_version))
        )

    # -- releasing -------------------------------------------------------------------------------

    def _sending(self, key: OwnerKey, rt: KindRuntime, decision: Decision) -> None:
        """The chosen pods, expected in this kind's view, and uncertain until each request's
        answer says otherwise: in flight for every decision from now on."""
        self.s.ledger.sending(
            key,
            (
                (r.pod.uid, r.pod.namespace, r.pod.name, r.pod.resource_version)
                for r in decision.releases
            ),
            rt.kind,
        )

    async def _release(
        self, key: OwnerKey, rt: KindRuntime, owner_name: str, decision: Decision, view: View
    ) -> Outcome:
        """Patch the chosen pods (already in the ledger: ``_sending``), each only while the
        caches still show ``view``'s basis, and act on each outcome: what the worker is to
        do next (back off when a patch failed or the pods changed; when one was refused for
        good, decide again at once, since the next pod in order may take its slot, and again
        when its backoff runs out)."""
        s = self.s
        releases = decision.releases
        basis = view.basis
        active = active_slice(list(view.bounds.slices))
        outcomes = await self.patcher.release_all(  # none once rt audits
            releases, rt, unchanged=lambda: self.view.basis(key) == basis, key=key
        )
        retry = False
        failed = 0
        released: list[Release] = []
        waits: list[float] = []  # since each released pod became releasable
        refused: list[Release] = []
        for r in releases:
            outcome = outcomes.get(r.pod.uid, PatchOutcome.ERROR)
            if outcome != PatchOutcome.ERROR:
                s.ledger.answered(r.pod.uid)  # answered: we know what became of it
            if outcome == PatchOutcome.RELEASED:
                s.stats.released += 1
                s.blocked.clear(r.pod.uid)
                released.append(r)
                waited = s.releasable.waited(key, r.pod.uid)
                if waited is not None:
                    waits.append(waited)
            elif outcome == PatchOutcome.DELETING:
                # ours, but no release: keep it among our pods (its watch event must not look
                # like someone else's release) and re-decide; the expectation stays until the
                # deciding view shows the pod terminating, or a re-decision on the older view
                # (still gated, live) patches it again and reads its own write as foreign
                retry = True
            elif outcome == PatchOutcome.BLOCKED:
                s.ledger.expectations.observe(r.pod.uid)  # refused: nothing of ours in flight
                s.ledger.not_mine(r.pod.uid)
                refused.append(r)
            elif outcome in (
                PatchOutcome.GONE,
                PatchOutcome.CONFLICT,
                PatchOutcome.SKIPPED,
                PatchOutcome.SUPERSEDED,
            ):
                s.ledger.expectations.observe(r.pod.uid)  # nothing of ours is in flight there
                s.ledger.not_mine(r.pod.uid)
                if outcome == PatchOutcome.CONFLICT:
                    await self.patcher.check_foreign_release(r, rt)
                retry = retry or outcome != PatchOutcome.SKIPPED
            else:
                # unknown outcome: the patch may have landed, or may still land; it stays
                # uncertain (in flight) until the next reconcile settles it (settling.py)
                failed += 1
                s.ledger.expectations.observe(r.pod.uid)
        self._announce(key, rt, owner_name, decision, active, released, waits)
        out = Outcome()
        if refused:
            self.notices.blocked(key, rt, refused)
            out = Outcome(after=0.0)  # that decision sets the wake-up for the backoff's end
        if failed:
            log.warning("%s: %d patch(es) failed; retrying with backoff", s.describe(key), failed)
            return replace(out, retry=Retry.FAILED)
        if retry:
            # the cache was behind the server: re-decide, but back off per key, so that a
            # lagging watch cannot turn into a hot loop of refused patches
            return replace(out, retry=Retry.CHANGED)
        return out

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
        kind = str(rt.kind)
        if s.metrics is not None and waits:
            s.metrics.observe_release_wait(kind, *waits)
        for pod_set, n in by_set.items():
            if s.metrics is not None:
                s.metrics.observe_release(kind, pod_set, latency, pods=n)
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
