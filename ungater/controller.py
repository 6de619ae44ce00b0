"""The controller: caches, work queue, expectations and patching around the pure decision.

Data path: reflectors keep indexed caches of elastic Workloads, of each kind's pods and of the
intermediate owners needed to prove ownership. Every relevant change enqueues the owner it
concerns; a worker reconciles one owner at a time: it checks expectations, gathers the owner's
slices and pods, asks the plugin about each pod, calls ``decide`` and removes the gate from the
chosen pods with a guarded JSON patch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from ungater.assess import owner_of, pod_facts
from ungater.auditing import Auditor
from ungater.blocked import BLOCKED, GONE, BlockedReleases, classify_patch_error, server_message
from ungater.cache import OwnerKey, PodIndex, WorkloadIndex, ancestors
from ungater.config import Config
from ungater.decision import (
    Decision,
    PodFacts,
    Release,
    active_slice,
    decide,
    gated_by_reason,
    order_slices,
)
from ungater.events import (
    NORMAL,
    PLUGIN_ERROR,
    RELEASED,
    WARNING,
    EventRecorder,
    InvolvedObject,
    released_message,
)
from ungater.expectations import Expectations
from ungater.guard import GateGuard
from ungater.kube import PODS, ApiError, KubeClient, Resource
from ungater.leader import LeaderElector, LeaderTerm
from ungater.metrics import Metrics, seconds_since
from ungater.model import (
    ADMITTED,
    Kind,
    MalformedObject,
    ObjectRef,
    ObjectView,
    PodView,
    WorkloadView,
    parse_object,
    parse_pod,
    parse_workload,
)
from ungater.notices import Notices
from ungater.patches import release_patch
from ungater.plugin_api import ResourceSpec
from ungater.reflector import Reflector
from ungater.registry import KindHandler, PluginError, PluginRegistry
from ungater.releasable import ReleasableClock
from ungater.standdown import StandDown
from ungater.workqueue import QueueShutDown, WorkQueue

__all__ = ["Controller", "StartupError", "workload_resource"]

log = logging.getLogger(__name__)
KUEUE_GROUP = "kueue.x-k8s.io"
DELETING = "deleting"  # patch outcome: it landed on a pod already being deleted


class StartupError(Exception):
    """The controller cannot start as configured; the message says what to fix."""


class _Changed(Exception):
    """Pods changed under our patches (gone, or our guarded patch refused): retry later."""


def workload_resource(version: str) -> Resource:
    return Resource(KUEUE_GROUP, version, "workloads", "Workload")


@dataclass
class KindRuntime:
    """What the controller holds per configured owner kind."""

    handler: KindHandler
    gate: str
    pods: PodIndex
    mode: str = "release"  # "audit": decide and report, never patch
    stood_down: str = ""  # why this kind stopped releasing (see ungater.standdown)

    @property
    def kind(self) -> Kind:
        return self.handler.kind


@dataclass(frozen=True, slots=True)
class OwnerFacts:
    """What a plugin extracted from an owner object, kept instead of the object."""

    namespace: str
    uid: str
    facts: dict[str, Any]
    resource_version: str = ""


@dataclass
class Stats:
    reconciles: int = 0
    reconcile_errors: int = 0
    plugin_errors: int = 0
    released: int = 0
    patch_conflicts: int = 0
    patch_gone: int = 0
    patch_errors: int = 0
    patch_blocked: int = 0
    released_deleting: int = 0
    foreign_releases: int = 0
    skipped_kinds: list[str] = field(default_factory=list)


class Controller:
    def __init__(
        self,
        config: Config,
        client: KubeClient,
        registry: PluginRegistry,
        clock: Callable[[], float] = time.monotonic,
        metrics: Metrics | None = None,
        events: EventRecorder | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.events = events
        self._leading: Callable[[], bool] = lambda: True  # set by run() under leader election
        self._busy = 0
        self._idle: anyio.Event | None = None
        self.client = client
        self.registry = registry
        self.stats = Stats()
        self.kinds: dict[Kind, KindRuntime] = {}
        self._resolve_kinds()
        self.workloads = WorkloadIndex()
        self.objects: dict[str, ObjectView] = {}
        self.owner_facts: dict[str, dict[str, Any]] = {}
        self.queue: WorkQueue[OwnerKey] = WorkQueue()
        self.expectations = Expectations(config.expectations_timeout_seconds, clock)
        self.reflectors: list[Reflector[Any]] = []
        self.decisions: dict[OwnerKey, Decision] = {}
        self.workload_version = ""
        self.ready = anyio.Event()
        self._patch_slots = anyio.Semaphore(config.client.patch_concurrency)
        self._ours: set[str] = set()  # pods we are patching or have patched, to spot others
        self._foreign_seen: set[str] = set()  # pods already reported released by another
        # per owner: the newest resourceVersion of one of its pods that ended or went away,
        # to tell whether the cached owner object may predate the event that freed a slot
        self._freed_rv: dict[OwnerKey, int] = {}
        self._owner_rv: dict[str, int] = {}
        rb = config.release_blocked
        self.blocked = BlockedReleases(  # releases refused for good, per pod
            rb.initial_backoff_seconds, rb.max_backoff_seconds, clock=clock
        )
        self.auditor = Auditor(config.audit, config.slice_handover_grace_seconds, metrics, events)
        self.stand_down = StandDown(config.stand_down, clock)
        self.guard = GateGuard(  # is each gate guarded against the other releaser?
            client, (rt.gate for rt in self.kinds.values()), config.policy_check_interval_seconds
        )
        self.releasable = ReleasableClock(clock)  # when each gated pod could first go
        self.fatal_error = ""  # set when the process must end (standDown.action: exit)
        self._stop: anyio.Event | None = None
        self._clock = clock
        self.notices = Notices(self)  # warnings, stand-down, status lines

    # -- set-up -----------------------------------------------------------------------------

    def _resolve_kinds(self) -> None:
        # one pure function decides, shared with `ungater check-config` (ungater/kinds.py)
        from ungater import kinds

        for failed in self.registry.failures:
            log.error("plugin %s unavailable: %s", failed.label, failed.error)
        try:
            resolved = kinds.resolve_kinds(self.config, self.registry)
        except kinds.StartupError as exc:
            raise StartupError(str(exc)) from exc
        for skipped in resolved.skipped:
            log.error("kind %s skipped: %s (a plugin failed to load)", skipped.kind, skipped.reason)
            self.stats.skipped_kinds.append(str(skipped.kind))
        for kind, rk in resolved.kinds.items():
            mode = next(
                (
                    self.config.mode_for(k)
                    for k in self.config.kinds
                    if Kind(k.group, k.kind) == kind
                ),
                self.config.mode,
            )
            pods = PodIndex(rk.handler.spec.pod_label)
            self.kinds[kind] = KindRuntime(rk.handler, rk.gate, pods, mode)

    async def _discover_workload_version(self) -> str:
        served = await self.client.served_versions(KUEUE_GROUP)
        for version in self.config.workload_api_versions:
            if version in served:
                return version
        wanted = ", ".join(self.config.workload_api_versions)
        raise StartupError(
            f"the API server serves no Workload version of {wanted} "
            f"(served: {', '.join(served) or 'none'}; is Kueue installed?)"
        )

    def _namespaces(self) -> Sequence[str | None]:
        return list(self.config.namespaces) or [None]

    def build_reflectors(self) -> None:
        w = self.config.watch
        common: dict[str, Any] = {
            "timeout_seconds": w.timeout_seconds,
            "silence_seconds": w.silence_seconds,
            "backoff_initial": w.backoff_initial_seconds,
            "backoff_max": w.backoff_max_seconds,
        }
        wl_res = workload_resource(self.workload_version)
        intermediates: dict[tuple[str, str, str, str], ResourceSpec] = {}
        for rt in self.kinds.values():
            for spec in rt.handler.spec.intermediates:
                intermediates[(spec.group, spec.version, spec.plural, spec.label_selector)] = spec
        for ns in self._namespaces():
            self.reflectors.append(
                Reflector(
                    self.client, wl_res, ns, self._parse_workload, self._on_workload, **common
                )
            )
            for rt in self.kinds.values():
                self.reflectors.append(
                    Reflector(
                        self.client,
                        PODS,
                        ns,
                        parse_pod,
                        self._pod_handler(rt),
                        label_selector=rt.handler.spec.pod_label,
                        **common,
                    )
                )
            for rt in self.kinds.values():
                owner_spec = rt.handler.spec.owner_resource
                if owner_spec is not None:
                    res = Resource(
                        owner_spec.group, owner_spec.version, owner_spec.plural, owner_spec.kind
                    )
                    self.reflectors.append(
                        Reflector(
                            self.client,
                            res,
                            ns,
                            self._owner_parser(rt),
                            self._on_owner,
                            label_selector=owner_spec.label_selector,
                            **common,
                        )
                    )
            for spec in intermediates.values():
                res = Resource(spec.group, spec.version, spec.plural, spec.kind)
                self.reflectors.append(
                    Reflector(
                        self.client,
                        res,
                        ns,
                        parse_object,
                        self._on_object,
                        label_selector=spec.label_selector,
                        **common,
                    )
                )

    # -- cache event handlers (synchronous: they only update indexes and enqueue) --------------

    def _parse_workload(self, obj: Mapping[str, Any]) -> WorkloadView | None:
        wl = parse_workload(obj)
        if wl.owner is None or wl.owner.group_kind not in self.kinds:
            return None
        if self.config.require_elastic_annotation and not wl.elastic:
            return None
        return wl

    def _on_workload(self, old: WorkloadView | None, new: WorkloadView | None) -> None:
        self.workloads.on_change(old, new)
        if new is not None and new.owner is not None and _admission_changed(old, new):
            self.releasable.room_made(OwnerKey(new.namespace, new.owner.uid))
        for wl in (old, new):
            if wl is not None and wl.owner is not None:
                self.queue.add(OwnerKey(wl.namespace, wl.owner.uid))

    def _owner_parser(self, rt: KindRuntime) -> Callable[[Mapping[str, Any]], OwnerFacts | None]:
        def parse(obj: Mapping[str, Any]) -> OwnerFacts | None:
            meta = obj.get("metadata") or {}
            try:
                facts = rt.handler.owner_facts(obj)
            except PluginError as exc:
                self.stats.plugin_errors += 1
                log.error("%s/%s: %s", meta.get("namespace"), meta.get("name"), exc)
                facts = {}
            return OwnerFacts(
                str(meta.get("namespace", "")),
                str(meta.get("uid", "")),
                facts,
                str(meta.get("resourceVersion", "")),
            )

        return parse

    def _on_owner(self, old: OwnerFacts | None, new: OwnerFacts | None) -> None:
        if new is not None:
            if old is None or old.facts != new.facts:  # its size may have grown
                self.releasable.room_made(OwnerKey(new.namespace, new.uid))
            self._keep_owner(new)
        elif old is not None:
            self.owner_facts.pop(old.uid, None)
            self._owner_rv.pop(old.uid, None)
            self.releasable.owner_gone(OwnerKey(old.namespace, old.uid))
        view = new or old
        if view is not None and self.workloads.has_owner(view.uid):
            self.queue.add(OwnerKey(view.namespace, view.uid))

    def _keep_owner(self, view: OwnerFacts) -> None:
        rv = _rv(view.resource_version)
        if rv is not None and rv < self._owner_rv.get(view.uid, -1):
            return  # a fresh read already gave us something newer than this event
        self.owner_facts[view.uid] = view.facts
        self._owner_rv[view.uid] = rv if rv is not None else -1

    def _on_object(self, old: ObjectView | None, new: ObjectView | None) -> None:
        if new is not None:
            self.objects[new.uid] = new
        elif old is not None:
            self.objects.pop(old.uid, None)
        view = new or old
        if view is not None:
            self._enqueue_owners(view.namespace, view.controller.uid if view.controller else None)

    def _owners_of(self, namespace: str, controller_uid: str | None) -> list[OwnerKey]:
        """The owners with Workloads above an object whose controller is ``controller_uid``."""
        if controller_uid is None:
            return []
        obj = self.objects.get(controller_uid)
        uids = (
            [controller_uid, *ancestors(obj.controller, self.objects)] if obj else [controller_uid]
        )
        return [OwnerKey(namespace, uid) for uid in uids if self.workloads.has_owner(uid)]

    def _enqueue_owners(self, namespace: str, controller_uid: str | None) -> None:
        for key in self._owners_of(namespace, controller_uid):
            self.queue.add(key)

    def _pod_handler(self, rt: KindRuntime) -> Callable[[PodView | None, PodView | None], None]:
        gate = rt.gate

        def on_pod(old: PodView | None, new: PodView | None) -> None:
            rt.pods.on_change(old, new)
            pod = new or old
            if pod is None:
                return
            if new is not None:
                self.releasable.pod_seen(new.uid)
            settled = new is None or not new.has_gate(gate) or new.terminal or new.deleting
            if settled:
                # only this kind's own view clears what this kind's reconcile expects
                self.expectations.observe(pod.uid, rt.kind)
                self.blocked.clear(pod.uid)
            if (
                rt.mode == "release"
                and self._leading()  # a standby sees the leader's releases: not foreign
                and old is not None
                and new is not None
                and old.has_gate(gate)
                and not new.has_gate(gate)
                and pod.uid not in self._ours
            ):
                self.notices.foreign_release(new, rt)
            if new is None and not any(pod.uid in k.pods.by_uid for k in self.kinds.values()):
                self._ours.discard(pod.uid)  # no view holds it any more
                self._foreign_seen.discard(pod.uid)
                self.releasable.pod_gone(pod.uid)
            if old is not None and new is not None and not _relevant_change(old, new):
                return
            ctrl = pod.controller
            keys = self._owners_of(pod.namespace, ctrl.uid if ctrl else None)
            freed = _released_live(old, gate) and not _released_live(new, gate)
            rv = _rv(pod.resource_version)
            for key in keys:
                if freed:
                    self.releasable.room_made(key)
                if freed and rv is not None:
                    self._freed_rv[key] = max(rv, self._freed_rv.get(key, 0))
                self.queue.add(key)

        return on_pod

    # -- reconcile --------------------------------------------------------------------------

    async def reconcile(self, key: OwnerKey) -> Decision | None:
        """Decide for one owner and release what the decision chose."""
        self.stats.reconciles += 1
        slices = self.workloads.for_owner(key.uid)
        if not slices:
            self.expectations.forget_key(key)
            self.decisions.pop(key, None)
            self.auditor.forget(key)
            self.notices.forget(key)
            return None
        owner = owner_of(slices)
        rt = self.kinds.get(owner.group_kind) if owner else None
        if owner is None or rt is None:
            return None
        if rt.mode == "audit":
            return self._audit(key, rt, owner, slices)
        if self.expectations.pending(key):
            expired = self.expectations.expired(key)
            if not expired:
                wait = self.expectations.next_deadline(key) or 0.0
                self.queue.add_after(key, max(wait, 0.01))
                return None
            await self._settle_expired(key, rt, expired)
        decision = self._decide(key, rt, owner, slices)
        if decision.releases and self._owner_may_be_stale(key, rt, owner):
            # a released pod ended after our last view of the owner: the owner may have shrunk
            # first (scale-down), so refill nothing until a fresh read says how big it is now
            if not await self._refresh_owner(rt, key.namespace, owner):
                return None
            decision = self._decide(key, rt, owner, slices)
        self.notices.stuck(key, decision)
        self.decisions[key] = decision
        if decision.releases:
            await self._release(key, rt, owner.name, decision, active_slice(slices))
        return decision

    def _inputs(
        self, key: OwnerKey, rt: KindRuntime, owner: ObjectRef
    ) -> tuple[list[PodFacts], Mapping[str, int] | None]:
        """The decision's input from what the caches hold now: pod facts, the owner's size."""
        owner_facts = self.owner_facts.get(owner.uid)
        pods = rt.pods.select(key.namespace, rt.handler.pod_selector(owner))
        facts = pod_facts(rt.handler, owner, pods, self.objects, owner_facts)
        desired = rt.handler.desired_counts(owner_facts) if owner_facts is not None else None
        return facts, desired

    def _audit(
        self, key: OwnerKey, rt: KindRuntime, owner: ObjectRef, slices: list[WorkloadView]
    ) -> Decision:
        """Audit mode: the same decision, compared with the pods as they are; nothing patched."""
        facts, desired = self._inputs(key, rt, owner)
        decision, wait = self.auditor.observe(
            key,
            str(rt.kind),
            owner,
            key.namespace,
            slices,
            facts,
            rt.gate,
            desired,
            self.workload_version,
        )
        self.decisions[key] = decision
        if wait is not None:
            self.queue.add_after(key, wait)
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
            self.expectations.pending(key),
            apply_pod_set_updates=self.config.apply_pod_set_updates,
            desired=desired,
            blocked=self.blocked.waiting(p.uid for p in pods),
        )

    def _owner_may_be_stale(self, key: OwnerKey, rt: KindRuntime, owner: ObjectRef) -> bool:
        freed = self._freed_rv.get(key)
        if freed is None or rt.handler.spec.owner_resource is None:
            return False
        return self._owner_rv.get(owner.uid, -1) < freed

    async def _refresh_owner(self, rt: KindRuntime, namespace: str, owner: ObjectRef) -> bool:
        """Read the owner from the API server (a quorum read) into the owner facts.

        False when it is gone or is another object now: nothing may be released for it.
        """
        spec = rt.handler.spec.owner_resource
        assert spec is not None
        res = Resource(spec.group, spec.version, spec.plural, spec.kind)
        obj = await self.client.get(res, namespace, owner.name)
        if obj is None or (obj.get("metadata") or {}).get("uid") != owner.uid:
            return False
        view = self._owner_parser(rt)(obj)
        if view is None or _rv(view.resource_version) is None:
            return False
        self._keep_owner(view)
        return True

    async def _settle_expired(self, key: OwnerKey, rt: KindRuntime, uids: frozenset[str]) -> None:
        """The watch has not shown our patches in time: ask the API server for the truth.

        A pod that is released keeps counting as in flight (re-armed) until the cache catches up;
        one that is gone or still gated no longer does.
        """
        self.expectations.expired_total += len(uids)
        for uid in uids:
            pod = rt.pods.by_uid.get(uid)
            self.expectations.observe(uid)
            if pod is None:
                continue
            fresh = await self.client.get(PODS, pod.namespace, pod.name)
            if fresh is None or (fresh.get("metadata") or {}).get("uid") != uid:
                continue
            try:
                view = parse_pod(fresh)
            except MalformedObject:
                continue
            if not view.has_gate(rt.gate) and not view.terminal and not view.deleting:
                self.expectations.expect(key, [uid], rt.kind)
        log.warning(
            "%s: %d expectation(s) expired; settled from the API server",
            self.describe(key),
            len(uids),
        )

    async def _release(
        self,
        key: OwnerKey,
        rt: KindRuntime,
        owner_name: str,
        decision: Decision,
        active: WorkloadView | None,
    ) -> None:
        releases = decision.releases
        self.expectations.expect(key, [r.pod.uid for r in releases], rt.kind)
        self._ours.update(r.pod.uid for r in releases)
        outcomes: dict[str, str] = {}

        async def one(r: Release) -> None:
            async with self._patch_slots:
                outcomes[r.pod.uid] = await self._patch(r)

        async with anyio.create_task_group() as tg:
            for r in releases:
                tg.start_soon(one, r)
        retry = False
        failed = 0
        released_by_set: dict[str, int] = {}
        waits: list[float] = []  # since each released pod became releasable
        refused: list[Release] = []
        for r in releases:
            outcome = outcomes.get(r.pod.uid, "error")
            if outcome == "released":
                self.stats.released += 1
                self.blocked.clear(r.pod.uid)
                released_by_set[r.pod_set] = released_by_set.get(r.pod_set, 0) + 1
                waited = self.releasable.waited(key, r.pod.uid)
                if waited is not None:
                    waits.append(waited)
            elif outcome == DELETING:
                # ours, but no release: keep it among our pods (its watch event must not look
                # like someone else's release) and re-decide; the expectation stays until the
                # deciding view shows the pod terminating, or a re-decision on the older view
                # (still gated, live) patches it again and reads its own write as foreign
                retry = True
            elif outcome == BLOCKED:
                self.expectations.observe(r.pod.uid)  # refused: nothing of ours in flight
                self._ours.discard(r.pod.uid)
                refused.append(r)
            elif outcome in ("gone", "conflict", "skipped"):
                self.expectations.observe(r.pod.uid)  # nothing of ours is in flight there
                self._ours.discard(r.pod.uid)
                if outcome == "conflict" and r.pod.uid not in self._foreign_seen:
                    await self._check_foreign_release(r, rt)
                retry = retry or outcome != "skipped"
            else:
                failed += 1  # unknown outcome: the patch may have landed; keep expecting it
        admitted = active.conditions.get(ADMITTED) if active is not None else None
        latency = seconds_since(admitted.transition_time) if admitted is not None else None
        if self.metrics is not None:
            for waited in waits:
                self.metrics.observe_release_wait(str(rt.kind), waited)
        for pod_set, n in released_by_set.items():
            if self.metrics is not None:
                for _ in range(n):
                    self.metrics.observe_release(str(rt.kind), pod_set, latency)
            if self.events is not None and active is not None:
                self.events.record(
                    InvolvedObject.workload(active, self.workload_version),
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
        if refused:
            self.notices.blocked(key, rt, refused)
        if failed:
            raise RuntimeError(f"{failed} patch(es) failed for {key}")
        if retry:
            # the cache was behind the server: re-decide, but back off per key, so that a
            # lagging watch cannot turn into a hot loop of refused patches
            raise _Changed(key)

    async def _check_foreign_release(self, r: Release, rt: KindRuntime) -> None:
        """Our guarded patch was refused: if the gate is gone, another writer released the pod."""
        fresh = await self.client.get(PODS, r.pod.namespace, r.pod.name)
        if fresh is None:
            return
        view = parse_pod(fresh)
        if view.uid == r.pod.uid and not view.has_gate(r.gate):
            self.notices.foreign_release(view, rt)

    def describe(self, key: OwnerKey) -> str:
        """The owner as a person reads it, ``Job.batch team-a/train``, for log lines (a UID
        only while no Workload names it)."""
        owner = owner_of(self.workloads.for_owner(key.uid))
        if owner is None:
            return f"owner {key.namespace}/{key.uid}"
        return f"{owner.group_kind} {key.namespace}/{owner.name}"

    def gated_pods(self) -> dict[tuple[str, str, str], int]:
        """Gated pods by (kind, gate, why they wait), from each owner's last decision: what
        ``ungater_gated_pods`` reports."""
        out: dict[tuple[str, str, str], int] = {}
        for key, decision in list(self.decisions.items()):
            owner = owner_of(self.workloads.for_owner(key.uid))
            rt = self.kinds.get(owner.group_kind) if owner else None
            if rt is None:
                continue
            for reason, n in gated_by_reason(decision).items():
                label = (str(rt.kind), rt.gate, reason)
                out[label] = out.get(label, 0) + n
        return out

    def status_lines(self) -> list[str]:
        """What ``/readyz`` says beside "ok" (see ``Notices.status_lines``)."""
        return self.notices.status_lines()

    async def _patch(self, r: Release) -> str:
        outcome = await self._patch_once(r)
        if self.metrics is not None:
            self.metrics.observe_patch(outcome)
        return outcome

    async def _patch_once(self, r: Release) -> str:
        if not self._leading():
            return "skipped"  # leadership lost since the decision: act no more
        try:
            patched = await self.client.json_patch(
                PODS, r.pod.namespace, r.pod.name, release_patch(r)
            )
        except ApiError as exc:
            outcome = classify_patch_error(exc.status, exc.reason, exc.body)
            if outcome == GONE:
                self.stats.patch_gone += 1
                return "gone"
            if outcome == BLOCKED:
                self.stats.patch_blocked += 1
                message = server_message(exc.reason, exc.body)
                self.blocked.record(r.pod.uid, r.pod.namespace, r.pod.name, exc.status, message)
                return BLOCKED
            if outcome == "conflict":
                self.stats.patch_conflicts += 1
                log.info(
                    "pod %s/%s changed under us (%s); re-deciding", r.pod.namespace, r.pod.name, exc
                )
                return "conflict"
            self.stats.patch_errors += 1
            log.warning("patching pod %s/%s failed: %s", r.pod.namespace, r.pod.name, exc)
            return "error"
        except (OSError, TimeoutError) as exc:
            self.stats.patch_errors += 1
            log.warning("patching pod %s/%s failed: %r", r.pod.namespace, r.pod.name, exc)
            return "error"
        if ((patched or {}).get("metadata") or {}).get("deletionTimestamp"):
            # the gate is gone, but so is the pod: a terminating pod runs nothing and frees
            # its slot, so this is no release (not counted, logged or announced)
            self.stats.released_deleting += 1
            return DELETING
        return "released"

    # -- running ----------------------------------------------------------------------------

    async def _worker(self) -> None:
        while True:
            try:
                key = await self.queue.get()
            except QueueShutDown:
                return
            self._busy += 1
            started, result = time.monotonic(), "success"
            try:
                await self.reconcile(key)
                self.queue.forget(key)
            except _Changed:
                result = "conflict"
                self.queue.add_rate_limited(key)
            except PluginError as exc:
                result = "plugin_error"
                self.stats.plugin_errors += 1
                log.error("%s: skipped: %s", self.describe(key), exc)
                if self.metrics is not None:
                    self.metrics.observe_plugin_error(exc.plugin.name)
                self._event_for(key, WARNING, PLUGIN_ERROR, str(exc))
                self.queue.add_rate_limited(key)
            except anyio.get_cancelled_exc_class():
                self.queue.add(key)  # leadership lost or shutting down: the next term redoes it
                raise
            except Exception as exc:
                result = "error"
                self.stats.reconcile_errors += 1
                log.warning(
                    "%s: reconcile failed: %r; retrying with backoff", self.describe(key), exc
                )
                self.queue.add_rate_limited(key)
            finally:
                self._busy -= 1
                self.queue.done(key)
                if self.metrics is not None:
                    self.metrics.observe_reconcile(result, time.monotonic() - started)
                if self._busy == 0 and self._idle is not None:
                    self._idle.set()

    async def _workers(self) -> None:
        """Run the workers until the queue shuts down (or the task is cancelled)."""
        for key in self.workloads.owner_keys():
            self.queue.add(key)  # a new term starts from the whole picture
        async with anyio.create_task_group() as tg:
            for _ in range(self.config.workers):
                tg.start_soon(self._worker)

    def _event_for(self, key: OwnerKey, type_: str, reason: str, message: str) -> None:
        """An Event on the owner's newest slice (best effort, rate-limited by the recorder)."""
        if self.events is None:
            return
        slices = self.workloads.for_owner(key.uid)
        if not slices:
            return
        wl = active_slice(slices) or order_slices(slices)[-1]
        self.events.record(
            InvolvedObject.workload(wl, self.workload_version), type_, reason, message
        )

    async def start(self) -> None:
        """Resolve the Workload API version and build the caches (no watching yet)."""
        self.workload_version = await self._discover_workload_version()
        self.build_reflectors()
        log.info(
            "serving %s with Workload %s in %s",
            ", ".join(
                f"{k} (gate {rt.gate}, plugin {rt.handler.plugin.label})"
                for k, rt in self.kinds.items()
            ),
            self.workload_version,
            ", ".join(self.config.namespaces) or "all namespaces",
        )
        if self.guard.interval > 0:
            await self.guard.refresh()  # at start-up, then every interval (run)
        self.notices.startup()

    async def run(
        self, stop: anyio.Event, elector: LeaderElector | None = None, grace: float = 10.0
    ) -> None:
        """Run until ``stop`` is set; then let in-flight reconciles finish (up to ``grace`` s).

        Caches run all the time. With an ``elector`` the workers run only while this replica
        leads, and every patch checks leadership first: a standby stays warm and ready, and a
        leader that lost its lease stops acting before another can take over.
        """
        if not self.reflectors:
            await self.start()
        self._stop = stop
        if elector is not None:
            self._leading = lambda: elector.is_leader
        async with anyio.create_task_group() as tg:
            for r in self.reflectors:
                tg.start_soon(r.run)
            if self.guard.interval > 0:
                tg.start_soon(self.guard.run)
            async with anyio.create_task_group() as sync_wait:
                sync_wait.start_soon(self._wait_synced)
                await _first_of(stop, self.ready)
                sync_wait.cancel_scope.cancel()
            if self.ready.is_set():
                async with anyio.create_task_group() as acting:
                    if elector is None:
                        acting.start_soon(self._workers)
                    else:
                        acting.start_soon(elector.run_while_leading, self._lead)
                    await stop.wait()
                    self.queue.shut_down()  # no new keys; workers return after their current one
                    if self._busy:
                        self._idle = anyio.Event()
                        with anyio.move_on_after(grace):
                            await self._idle.wait()
                    acting.cancel_scope.cancel()
            tg.cancel_scope.cancel()

    async def _lead(self, term: LeaderTerm) -> None:
        log.info("leading (term %d): acting", term.number)
        try:
            await self._workers()
        finally:
            if term.lost.is_set():
                log.warning("lost leadership (term %d): stopped acting", term.number)

    async def _wait_synced(self) -> None:
        for r in self.reflectors:
            await r.synced.wait()
        log.info(
            "caches synced: %d workloads, %d pods, %d intermediate owners",
            len(self.workloads),
            sum(len(rt.pods) for rt in self.kinds.values()),
            len(self.objects),
        )
        self.ready.set()


async def _first_of(*events: anyio.Event) -> None:
    async with anyio.create_task_group() as tg:

        async def wait(e: anyio.Event) -> None:
            await e.wait()
            tg.cancel_scope.cancel()

        for e in events:
            tg.start_soon(wait, e)


def _relevant_change(old: PodView, new: PodView) -> bool:
    return (
        old.gates != new.gates
        or old.terminal != new.terminal
        or old.deleting != new.deleting
        or old.labels != new.labels
        or old.owner_refs != new.owner_refs
    )


def _admission_changed(old: WorkloadView | None, new: WorkloadView) -> bool:
    """An admitted slice that was not admitted before, or is admitted for other counts."""
    if not new.condition_true(ADMITTED):
        return False
    return old is None or not old.condition_true(ADMITTED) or old.assignments != new.assignments


def _rv(resource_version: str) -> int | None:
    """An etcd-backed API server's resourceVersions are increasing integers across all
    resources; anything else cannot be ordered."""
    return int(resource_version) if resource_version.isdigit() else None


def _released_live(pod: PodView | None, gate: str) -> bool:
    return pod is not None and not pod.has_gate(gate) and not pod.terminal and not pod.deleting
