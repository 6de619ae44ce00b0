"""What the controller's parts share: the caches, the work queue and the bookkeeping around them.

The controller (``controller.py``) builds one ``State`` and hands it to the two halves that
read most of it, the event handlers (``handlers.py``) and the reconciler (``reconciler.py``),
and to the notices (``notices.py``) and the view reader (``view.py``). The parts that write to
the cluster, the patcher (``patcher.py``) and the settler (``settling.py``), are given only the
pieces they use, by name. One plain object makes each part's reads and writes visible by name,
instead of every part reaching into the controller. No I/O here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

import anyio

from ungater._controller.queue import WorkQueue
from ungater._decide.assess import owner_of
from ungater._decide.decision import Decision, active_slice, order_slices
from ungater._decide.freshness import Freshness
from ungater._decide.indexes import (
    ObjectIndex,
    OwnerFacts,
    OwnerIndex,
    OwnerKey,
    PodIndex,
    WorkloadIndex,
    ancestors,
)
from ungater._decide.ledger import Ledger
from ungater._decide.refusals import BlockedReleases
from ungater._decide.releasable import ReleasableClock, Stalls
from ungater._decide.standdown import StandDown
from ungater._kube.client import KubeClient
from ungater._kube.gateguard import GateGuard
from ungater._model.config import Config
from ungater._model.views import Kind, ObjectView, parse_object
from ungater._observe.auditor import Auditor
from ungater._observe.events import EventRecorder, InvolvedObject
from ungater._observe.metrics import Metrics
from ungater._observe.trace import Tracer
from ungater._plugins.registry import KindHandler, PluginError

__all__ = ["KindRuntime", "State", "Stats"]

log = logging.getLogger("ungater.controller")  # one logger for the controller's parts


@dataclass
class KindRuntime:
    """What the controller holds per configured owner kind."""

    handler: KindHandler
    gate: str
    pods: PodIndex
    mode: str = "release"  # what it does now; "audit": decide and report, never patch
    configured: str = (
        ""  # the config's mode ("auto" follows the gate guard: ungater._controller.modes)
    )
    why: str = ""  # why it runs in ``mode`` (/readyz)
    stood_down: str = ""  # why this kind stopped releasing (see ungater._decide.standdown)

    @property
    def kind(self) -> Kind:
        return self.handler.kind


@dataclass
class Stats:
    reconciles: int = 0
    reconcile_errors: int = 0
    plugin_errors: int = 0
    released: int = 0
    patch_conflicts: int = 0
    patch_resent: int = 0  # refused releases sent again on the pod as it is now
    patch_gone: int = 0
    patch_errors: int = 0
    patch_blocked: int = 0
    released_deleting: int = 0
    fences: int = 0  # unanswered releases made unable to land (settling.Settler.fence)
    proof_reads: int = 0  # a new term's quorum reads of an owner's pods
    reads_preempted: int = 0  # views whose reads an admission cut short (preempt_reads)
    foreign_releases: int = 0
    skipped_kinds: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """The counters that are not zero, for the line a run ends with."""
        counts = [f"{f.name}={getattr(self, f.name)}" for f in fields(self) if f.type == "int"]
        return ", ".join(c for c in counts if not c.endswith("=0")) or "nothing done"


class State:
    def __init__(
        self,
        config: Config,
        client: KubeClient,
        kinds: dict[Kind, KindRuntime],
        stats: Stats,
        clock: Callable[[], float],
        metrics: Metrics | None,
        events: EventRecorder | None,
    ) -> None:
        self.config = config
        self.client = client
        self.kinds = kinds
        self.stats = stats
        self.clock = clock
        self.metrics = metrics
        self.events = events
        self.leading: Callable[[], bool] = lambda: True  # set by the controller under election
        self.workload_version = ""
        # caches, filled by the event handlers
        self.workloads = WorkloadIndex()
        self.objects = ObjectIndex()  # intermediate objects, by UID and by controller
        self.owners = OwnerIndex()  # each owner's facts, as its plugin read them
        self.trace = Tracer(config.logging.trace)  # each owner's path, when logging.trace
        self.queue: WorkQueue[OwnerKey] = WorkQueue(trace=self.trace)
        # what we know of writes to our pods' gates, ours and others' (ungater._decide.ledger)
        self.ledger = Ledger(config.expectations_timeout_seconds, clock)
        self.decisions: dict[OwnerKey, Decision] = {}  # each owner's last decision
        # whether a new term may trust its caches (ungater._decide.freshness): the term's
        # start and the owners whose caches a read confirmed in it
        self.freshness = Freshness()
        rb = config.release_blocked
        self.blocked = BlockedReleases(  # releases refused for good, per pod
            rb.initial_backoff_seconds, rb.max_backoff_seconds, clock=clock
        )
        self.releasable = ReleasableClock(clock)  # when each gated pod could first go
        self.stalls = Stalls(clock)  # owners whose releasable pods stay gated, since when
        self.auditor = Auditor(config.audit, config.slice_handover_grace_seconds, metrics, events)
        self.stand_down = StandDown(config.stand_down, clock)
        self.guard = GateGuard(  # is each gate guarded against the other releaser?
            client, (rt.gate for rt in kinds.values()), config.policy_check_interval_seconds
        )
        #: other parts' per-owner records, each dropped by ``forget_owner``
        self.forgetters: list[Callable[[OwnerKey], None]] = []
        self.fatal_error = ""  # set when the process must end (standDown.action: exit)
        self.stop: anyio.Event | None = None  # the controller's stop, once it runs

    def forget_pod(self, uid: str) -> None:
        """A pod no view holds any more: drop what we kept about it, remember that it went."""
        self.ledger.forget_pod(uid)
        self.releasable.pod_gone(uid)

    def forget_owner(self, key: OwnerKey) -> None:
        """An owner no Workload names any more: drop every record kept about it, here and in
        the parts that registered one (``forgetters``)."""
        self.ledger.expectations.forget_key(key)
        self.decisions.pop(key, None)
        self.auditor.forget(key)
        self.stalls.forget(key)
        self.releasable.owner_gone(key)
        for forget in self.forgetters:
            forget(key)

    def memory(self) -> dict[str, int]:
        """How many entries each per-owner and per-pod record holds, by name: what must fall
        back to nothing once every owner is gone (``ledger``'s ``gone`` is bounded)."""
        out = {
            "workloads": len(self.workloads),
            "pods": sum(len(rt.pods) for rt in self.kinds.values()),
            "owners": len(self.owners),
            **self.objects.sizes(),
            "decisions": len(self.decisions),
            "releasable": len(self.releasable),
            "blocked": len(self.blocked),
            "stalls": len(self.stalls),
            "audited": len(self.auditor.tracker),
            "queue": self.queue.remembered(),
        }
        out.update({k: v for k, v in self.ledger.sizes().items() if k != "gone"})
        return out

    def describe(self, key: OwnerKey) -> str:
        """The owner as a person reads it, ``Job.batch team-a/train``, for log lines (a UID
        only while no Workload names it)."""
        owner = owner_of(self.workloads.for_owner(key.uid))
        if owner is None:
            return f"owner {key.namespace}/{key.uid}"
        return f"{owner.group_kind} {key.namespace}/{owner.name}"

    def kind_of(self, key: OwnerKey) -> KindRuntime | None:
        owner = owner_of(self.workloads.for_owner(key.uid))
        return self.kinds.get(owner.group_kind) if owner else None

    def owners_of(self, namespace: str, controller_uid: str | None) -> list[OwnerKey]:
        """The owners with Workloads above an object whose controller is ``controller_uid``."""
        if controller_uid is None:
            return []
        obj = self.objects.by_uid.get(controller_uid)
        uids = (
            [controller_uid, *ancestors(obj.controller, self.objects.by_uid)]
            if obj
            else [controller_uid]
        )
        return [OwnerKey(namespace, uid) for uid in uids if self.workloads.has_owner(uid)]

    def event_for(self, key: OwnerKey, type_: str, reason: str, message: str) -> None:
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

    # -- reading owners through their plugin ----------------------------------------------------

    def parse_owner(self, rt: KindRuntime, obj: Mapping[str, Any]) -> OwnerFacts:
        meta = obj.get("metadata") or {}
        error = ""
        try:
            facts = rt.handler.owner_facts(obj)
        except PluginError as exc:
            self._plugin_error(exc, f"{meta.get('namespace')}/{meta.get('name')}")
            facts, error = {}, str(exc)
        return OwnerFacts(
            str(meta.get("namespace", "")),
            str(meta.get("uid", "")),
            facts,
            str(meta.get("resourceVersion", "")),
            error,
        )

    def _plugin_error(self, exc: PluginError, what: str) -> None:
        self.stats.plugin_errors += 1
        log.error("%s: %s", what, exc)
        if self.metrics is not None:
            self.metrics.observe_plugin_error(exc.plugin.name)

    def parse_via(self, rt: KindRuntime, obj: Mapping[str, Any]) -> ObjectView:
        """An object a ``select_via`` kind's pods are selected through, with the plugin's facts
        of it (the size of a RayJob's RayCluster)."""
        view = parse_object(obj)
        try:
            facts = rt.handler.owner_facts(obj)
        except PluginError as exc:
            self._plugin_error(exc, f"{view.namespace}/{view.name}")
            return replace(view, facts={}, facts_error=str(exc))
        return replace(view, facts=dict(facts))
