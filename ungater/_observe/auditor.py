"""Audit mode inside the controller: findings turned into metrics, log lines and Events.

The controller calls ``Auditor.observe`` instead of patching for a kind in audit mode (set in
the config, or after standing down). The findings themselves come from the pure
``ungater._decide.findings.audit_owner``; this module keeps them over time (``FindingTracker``: when each
was first seen, which were reported), reports each new one once (a counter, a log line, a
rate-limited Warning Event on its Workload) and tells the controller when to look again (a
stall becomes one without any event).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence

from ungater._decide.decision import Decision, PodFacts
from ungater._decide.finding_tracker import FindingTracker
from ungater._decide.findings import WARNING as SEVERE
from ungater._decide.findings import Finding, audit_owner
from ungater._model.config import AuditConfig
from ungater._model.views import ObjectRef, WorkloadView
from ungater._observe.events import WARNING, EventRecorder, InvolvedObject
from ungater._observe.metrics import Metrics

__all__ = ["Auditor"]

log = logging.getLogger("ungater.auditing")


class Auditor:
    def __init__(
        self,
        config: AuditConfig,
        handover_grace: float,
        metrics: Metrics | None = None,
        events: EventRecorder | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.handover_grace = handover_grace
        self.metrics = metrics
        self.events = events
        self.wall_clock = wall_clock
        self.tracker = FindingTracker(config.report_after_seconds)
        self.reported = 0

    def observe(
        self,
        key: object,
        kind: str,
        owner: ObjectRef,
        namespace: str,
        slices: Sequence[WorkloadView],
        facts: Sequence[PodFacts],
        gate: str,
        desired: Mapping[str, int] | None,
        workload_version: str,
    ) -> tuple[Decision, float | None]:
        """Audit one owner now. Returns the decision (what release mode would do) and the
        seconds until this owner should be looked at again, if a finding may ripen."""
        now = self.wall_clock()
        # what the decision would release with nothing in flight: "releasable now"
        _, decision = audit_owner(
            slices,
            facts,
            gate,
            owner=owner,
            kind=kind,
            namespace=namespace,
            now=now,
            stall_seconds=self.config.stall_seconds,
            desired=desired,
            releasable_since={},
            handover_grace_seconds=self.handover_grace,
        )
        chosen = {n for r in decision.pod_sets for n in r.chosen}
        releasable = [f.pod.uid for f in facts if f.pod.name in chosen]
        since = self.tracker.releasable_since(key, releasable, now)
        findings, decision = audit_owner(
            slices,
            facts,
            gate,
            owner=owner,
            kind=kind,
            namespace=namespace,
            now=now,
            stall_seconds=self.config.stall_seconds,
            desired=desired,
            releasable_since=since,
            handover_grace_seconds=self.handover_grace,
        )
        due, next_check = self.tracker.update(key, findings, now)
        by_name = {w.name: w for w in slices}
        for f in due:
            self._report(f, by_name.get(f.workload or ""), workload_version)
        # look again when a releasable pod would become a stall (not for those that already are:
        # an open finding needs no polling, the next event re-audits the owner)
        stall_due = [
            t + self.config.stall_seconds
            for t in since.values()
            if t + self.config.stall_seconds > now
        ]
        times = [t for t in (next_check, min(stall_due, default=None)) if t is not None]
        wait = max(0.05, min(times) - now) if times else None
        return decision, wait

    def forget(self, key: object) -> None:
        self.tracker.forget(key)

    def _report(self, f: Finding, wl: WorkloadView | None, version: str) -> None:
        self.reported += 1
        if self.metrics is not None:
            self.metrics.observe_audit_finding(f.kind, f.finding)
        level = logging.WARNING if f.severity == SEVERE else logging.INFO
        how_long = "" if f.seconds is None else f" (for {f.seconds:.0f}s)"
        log.log(
            level,
            "audit: %s: %s: %s%s",
            f.finding,
            f.owner,
            f.message,
            how_long,
            extra={"workload": f.workload, "owner": f.owner, "pod_set": f.pod_set},
        )
        if self.events is not None and wl is not None:
            self.events.record(
                InvolvedObject.workload(wl, version), WARNING, f.finding, f"audit: {f.message}"
            )
