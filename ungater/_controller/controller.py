"""The controller: caches, readiness, leadership and the workers around one reconciler
(``manager.py`` composes it into the running process).

``Controller`` resolves the configured kinds, builds one reflector per watched resource and
namespace (Workloads, each kind's pods, owners, intermediates) wired to the event handlers
(``handlers.py``), reports ready once every cache has listed, and runs the workers that take
owner keys from the queue and hand them to the reconciler (``reconciler.py``), only while this
replica leads. The shared caches and bookkeeping are ``state.py``'s (``Controller.state``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import anyio

from ungater._controller.handlers import EventHandlers
from ungater._controller.modes import effective_mode
from ungater._controller.notices import Notices
from ungater._controller.patcher import Patcher
from ungater._controller.queue import QueueShutDown
from ungater._controller.reconciler import Outcome, Reconciler, Retry
from ungater._controller.state import KindRuntime, State, Stats
from ungater._decide.freshness import version_number
from ungater._decide.indexes import OwnerKey, PodIndex
from ungater._kube.client import KubeClient
from ungater._kube.kueue import KUEUE_GROUP
from ungater._kube.leader import LeaderElector, LeaderTerm
from ungater._kube.reflector import Reflector
from ungater._model.config import Config
from ungater._model.errors import StartupError
from ungater._model.views import Kind
from ungater._observe.events import PLUGIN_ERROR, WARNING, EventRecorder
from ungater._observe.figures import controller_snapshot, gated_pods
from ungater._observe.metrics import ControllerSnapshot, Metrics
from ungater._plugins.registry import PluginError, PluginRegistry

__all__ = ["Controller"]

log = logging.getLogger("ungater.controller")

#: A cache still behind a term's start this long after another cache passed it is relisted.
CATCH_UP_AFTER_S = 2.0
#: How often a new term looks at its caches, and for how long (by then bookmarks have come).
CATCH_UP_TICK_S = 0.5
CATCH_UP_FOR_S = 180.0


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
        self.client = client
        self.registry = registry
        self.metrics = metrics
        self.stats = Stats()
        s = self.state = State(
            config, client, self._resolve_kinds(), self.stats, clock, metrics, events
        )
        self.notices = Notices(s)  # warnings, stand-down, status lines
        self.handlers = EventHandlers(s, self.notices)
        patcher = Patcher(
            client,
            s.ledger,
            s.blocked,
            self.notices,
            leading=lambda: s.leading(),  # set once leader election runs
            concurrency=config.client.patch_concurrency,
            stats=s.stats,
            metrics=metrics,
            trace=s.trace,
        )
        self.reconciler = Reconciler(s, self.notices, patcher)
        self.handlers.on_admission = self.reconciler.preempt_reads
        self.handlers.on_change = self.reconciler.touched
        self.reflectors: list[Reflector[Any]] = []
        s.freshness.cache_versions = lambda: [r.resource_version for r in self.reflectors]
        self.ready = anyio.Event()
        self._busy = 0
        self._idle: anyio.Event | None = None

    # -- set-up ---------------------------------------------------------------------------------

    def _resolve_kinds(self) -> dict[Kind, KindRuntime]:
        # one pure function decides, shared with `ungater check-config` (ungater/_plugins/binding.py)
        from ungater._plugins import binding as kinds

        for failed in self.registry.failures:
            log.error("plugin %s unavailable: %s", failed.label, failed.error)
        resolved = kinds.resolve_kinds(self.config, self.registry)  # StartupError goes up
        for skipped in resolved.skipped:
            log.error("kind %s skipped: %s (a plugin failed to load)", skipped.kind, skipped.reason)
            self.stats.skipped_kinds.append(str(skipped.kind))
        out: dict[Kind, KindRuntime] = {}
        for kind, rk in resolved.kinds.items():
            mode = next(
                (
                    self.config.mode_for(k)
                    for k in self.config.kinds
                    if Kind(k.group, k.kind) == kind
                ),
                self.config.mode,
            )
            # auto on Kueue's own gate audits until a guard check finds the policy
            now = effective_mode(mode, rk.gate, None, self.config.policy_check_interval_seconds > 0)
            pods = PodIndex(rk.handler.spec.pod_label)
            out[kind] = KindRuntime(rk.handler, rk.gate, pods, now.mode, mode, now.why)
        return out

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
        self.reflectors.extend(
            self.handlers.reflectors(self.client, self.state.workload_version, self._namespaces())
        )

    # -- what others ask ------------------------------------------------------------------------

    async def reconcile(self, key: OwnerKey) -> Outcome:
        """Decide for one owner and release what the decision chose (see ``Reconciler``)."""
        return await self.reconciler.reconcile(key)

    def describe(self, key: OwnerKey) -> str:
        """The owner as a person reads it, ``Job.batch team-a/train``, for log lines."""
        return self.state.describe(key)

    def gated_pods(self) -> dict[tuple[str, str, str], int]:
        """Gated pods by (kind, gate, why they wait): what ``ungater_gated_pods`` reports."""
        return gated_pods(self.state)

    def metrics_snapshot(self) -> ControllerSnapshot:
        """The figures ``ungater._observe.metrics`` reads at scrape time (its ``SnapshotSource``)."""
        return controller_snapshot(
            self.state, ((r.name, r.stats) for r in self.reflectors), self.ready.is_set()
        )

    def status_lines(self) -> list[str]:
        """What ``/readyz`` says beside "ok" (see ``Notices.status_lines``)."""
        return self.notices.status_lines()

    # -- running --------------------------------------------------------------------------------

    async def start(self) -> None:
        """Resolve the Workload API version and build the caches (no watching yet)."""
        self.state.workload_version = await self._discover_workload_version()
        self.build_reflectors()
        log.info(
            "serving %s with Workload %s in %s",
            ", ".join(
                f"{k} (gate {rt.gate}, plugin {rt.handler.plugin.label})"
                for k, rt in self.state.kinds.items()
            ),
            self.state.workload_version,
            ", ".join(self.config.namespaces) or "all namespaces",
        )
        if self.state.guard.interval > 0:
            await self.state.guard.refresh()  # at start-up, then every interval (run)
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
        self.state.stop = stop
        if elector is not None:
            self.state.leading = lambda: elector.is_leader
            self.state.freshness.term_start = lambda: _term_start(elector)
        async with anyio.create_task_group() as tg:
            for r in self.reflectors:
                tg.start_soon(r.run)
            if self.state.guard.interval > 0:
                tg.start_soon(self.state.guard.run)
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
                    self.state.queue.shut_down()  # no new keys; workers return after their current one
                    if self._busy:
                        self._idle = anyio.Event()
                        with anyio.move_on_after(grace):
                            await self._idle.wait()
                    acting.cancel_scope.cancel()
            tg.cancel_scope.cancel()

    async def _lead(self, term: LeaderTerm) -> None:
        log.info("leading (term %d): acting", term.number)
        # the caches may lag what the previous leader did: each owner's first release of the
        # term is decided on quorum reads, until one shows the cache current (reconciler.py)
        self.state.freshness.begin_term(version_number(term.resource_version) or 0)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._catch_up, self.state.freshness.term_rv)
                await self._workers()
                tg.cancel_scope.cancel()
        finally:
            if term.lost.is_set():
                log.warning("lost leadership (term %d): stopped acting", term.number)

    async def _catch_up(self, term_rv: int) -> None:
        """Relist the caches that stay behind the term's start while another has passed it.

        Until every cache is past the Lease write that began the term, each owner's first
        release waits on quorum reads of its own, and a cache that sees no change (the Jobs,
        while only their pods move) gets past it only at the API server's next bookmark, about
        a minute. A cache still behind ``CATCH_UP_AFTER_S`` after another moved past it is such a
        cache, and one list brings it past. A quiet term relists nothing (nothing moves, no
        release needs a proof), and a busy cache is never relisted (its events carry it).
        """
        if not term_rv:
            return  # no order to compare with: every owner is proven by its own reads

        def past(r: Reflector[Any]) -> bool:
            return (version_number(r.resource_version) or -1) >= term_rv

        at_start = {id(r): r.resource_version for r in self.reflectors}
        moved_at: float | None = None
        for _ in range(round(CATCH_UP_FOR_S / CATCH_UP_TICK_S)):
            await anyio.sleep(CATCH_UP_TICK_S)
            behind = [r for r in self.reflectors if not past(r)]
            if not behind:
                return
            now = anyio.current_time()
            # moved: changed since the term began (a cache listed after the Lease write is
            # past it without anything happening)
            if moved_at is None and any(
                past(r) and r.resource_version != at_start[id(r)] for r in self.reflectors
            ):
                moved_at = now
            if moved_at is not None and now - moved_at >= CATCH_UP_AFTER_S:
                for r in behind:
                    log.info("%s: behind the start of this term: relisting", r.name)
                    r.relist_soon()
                return

    async def _wait_synced(self) -> None:
        for r in self.reflectors:
            await r.synced.wait()
        log.info(
            "caches synced: %d workloads, %d pods, %d intermediate owners",
            len(self.state.workloads),
            sum(len(rt.pods) for rt in self.state.kinds.values()),
            len(self.state.objects),
        )
        self.ready.set()

    async def _workers(self) -> None:
        """Run the workers until the queue shuts down (or the task is cancelled)."""
        for key in self.state.workloads.owner_keys():
            self.state.queue.add(key)  # a new term starts from the whole picture
        async with anyio.create_task_group() as tg:
            for _ in range(self.config.workers):
                tg.start_soon(self._worker)

    async def _worker(self) -> None:
        while True:
            try:
                key = await self.state.queue.get()
            except QueueShutDown:
                return
            self._busy += 1
            started, result = time.monotonic(), "success"
            try:
                outcome = await self.reconciler.reconcile(key)
                if outcome.retry is not None:
                    result = "error" if outcome.retry == Retry.FAILED else "conflict"
                    self.state.queue.add_rate_limited(key)
                else:
                    self.state.queue.forget(key)
                if outcome.after is not None:
                    self.state.queue.add_after(key, outcome.after)
            except PluginError as exc:
                result = "plugin_error"
                self.stats.plugin_errors += 1
                log.error("%s: skipped: %s", self.describe(key), exc)
                if self.metrics is not None:
                    self.metrics.observe_plugin_error(exc.plugin.name)
                self.state.event_for(key, WARNING, PLUGIN_ERROR, str(exc))
                self.state.queue.add_rate_limited(key)
            except anyio.get_cancelled_exc_class():
                self.state.queue.add(
                    key
                )  # leadership lost or shutting down: the next term redoes it
                raise
            except Exception as exc:
                result = "error"
                self.stats.reconcile_errors += 1
                log.warning(
                    "%s: reconcile failed: %r; retrying with backoff", self.describe(key), exc
                )
                self.state.queue.add_rate_limited(key)
            finally:
                self._busy -= 1
                self.state.queue.done(key)
                if self.metrics is not None:
                    self.metrics.observe_reconcile(result, time.monotonic() - started)
                if self._busy == 0 and self._idle is not None:
                    self._idle.set()


def _term_start(elector: LeaderElector) -> int:
    term = elector.term
    return (version_number(term.resource_version) or 0) if term is not None else 0


async def _first_of(*events: anyio.Event) -> None:
    async with anyio.create_task_group() as tg:

        async def wait(e: anyio.Event) -> None:
            await e.wait()
            tg.cancel_scope.cancel()

        for e in events:
            tg.start_soon(wait, e)
