"""The controller's figures gathered into one ``ControllerSnapshot`` at scrape time.

The parts already count what ``/metrics`` shows (queue, ledger, caches, decisions, findings);
this module reads them, through the ``Counted`` protocol, and sums them into the plain figures
the collector exports. It sits below the controller, so it names only what it reads: the
controller's state satisfies ``Counted`` structurally, and nothing here can change it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sized
from typing import Protocol

from ungater._decide.decision import Decision, gated_by_reason
from ungater._decide.findings import FINDINGS
from ungater._decide.indexes import OwnerKey
from ungater._decide.ledger import Ledger
from ungater._decide.releasable import Stalls
from ungater._kube.gateguard import GateGuard
from ungater._kube.reflector import ReflectorStats
from ungater._model.config import Config
from ungater._model.views import Kind
from ungater._observe.auditor import Auditor
from ungater._observe.collector import WATCH_SERIES, ControllerSnapshot

__all__ = ["Counted", "audit_findings", "controller_snapshot", "gated_pods"]


class KindFigures(Protocol):
    """One configured kind, as far as figures go."""

    @property
    def kind(self) -> Kind: ...
    @property
    def gate(self) -> str: ...
    @property
    def mode(self) -> str: ...
    @property
    def stood_down(self) -> str: ...
    @property
    def pods(self) -> Sized: ...


class QueueFigures(Protocol):
    @property
    def depth(self) -> int: ...
    @property
    def adds(self) -> int: ...
    @property
    def retries(self) -> int: ...


class Counted(Protocol):
    """What a snapshot reads of the controller's state, read-only."""

    @property
    def kinds(self) -> Mapping[Kind, KindFigures]: ...
    @property
    def queue(self) -> QueueFigures: ...
    @property
    def ledger(self) -> Ledger: ...
    @property
    def blocked(self) -> Sized: ...
    @property
    def workloads(self) -> Sized: ...
    @property
    def objects(self) -> Sized: ...
    @property
    def decisions(self) -> Mapping[OwnerKey, Decision]: ...
    @property
    def auditor(self) -> Auditor: ...
    @property
    def stalls(self) -> Stalls: ...
    @property
    def guard(self) -> GateGuard: ...
    @property
    def config(self) -> Config: ...
    def kind_of(self, key: OwnerKey) -> KindFigures | None: ...


def gated_pods(parts: Counted) -> dict[tuple[str, str, str], int]:
    """Gated pods by (kind, gate, why they wait), from each owner's last decision; owners no
    Workload names any more have no kind and are left out."""
    out: dict[tuple[str, str, str], int] = {}
    for key, decision in list(parts.decisions.items()):
        rt = parts.kind_of(key)
        if rt is None:
            continue
        for reason, n in gated_by_reason(decision).items():
            label = (str(rt.kind), rt.gate, reason)
            out[label] = out.get(label, 0) + n
    return out


def audit_findings(parts: Counted) -> dict[tuple[str, str], int]:
    """Open findings per (kind, finding), with 0 for every finding of an audited kind that has
    none open: a series that vanishes reads as "no data", not as "resolved"."""
    out = {
        (str(kind), finding): 0
        for kind, rt in parts.kinds.items()
        if rt.mode == "audit"
        for finding in FINDINGS
    }
    out.update(parts.auditor.tracker.counts())
    return out


def watch_totals(watches: Iterable[tuple[str, ReflectorStats]]) -> dict[str, dict[str, int]]:
    """Each reflector's counters summed per watched resource (the pod watch may be several)."""
    totals: dict[str, dict[str, int]] = {}
    for name, stats in watches:
        counters = totals.setdefault(name, {})
        for counter in WATCH_SERIES:
            counters[counter] = counters.get(counter, 0) + getattr(stats, counter)
    return totals


def controller_snapshot(
    parts: Counted, watches: Iterable[tuple[str, ReflectorStats]], synced: bool
) -> ControllerSnapshot:
    """The figures ``ungater._observe.metrics`` exports now; ``watches``: each reflector's name
    and counters."""
    return ControllerSnapshot(
        queue_depth=parts.queue.depth,
        queue_adds=parts.queue.adds,
        queue_retries=parts.queue.retries,
        expectations_pending=len(parts.ledger.expectations),
        expectations_expired=parts.ledger.expectations.expired_total,
        release_blocked=len(parts.blocked),
        watches=watch_totals(watches),
        cached_workloads=len(parts.workloads),
        cached_pods=sum(len(rt.pods) for rt in parts.kinds.values()),
        cached_intermediates=len(parts.objects),
        synced=synced,
        audit_findings=audit_findings(parts),
        stood_down={str(kind): bool(rt.stood_down) for kind, rt in parts.kinds.items()},
        modes={str(kind): rt.mode for kind, rt in parts.kinds.items()},
        stale_provisioning_pods=sum(
            len(r.stale) for d in list(parts.decisions.values()) for r in d.pod_sets
        ),
        gate_guard={gate: st.state for gate, st in parts.guard.status.items()},
        gated_pods=gated_pods(parts),
        stalled_pods=parts.stalls.stalled(parts.config.audit.stall_seconds),
    )
