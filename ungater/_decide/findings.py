"""Audit: compare what the active slice allows with the pods as they are, whoever released them.

Pure (no I/O, no clock of its own): ``audit_owner`` takes one owner's slices and pod facts (the
same input ``decide`` takes, from the same plugins) and a wall-clock time, runs the same
decision with nothing in flight, and returns findings. Each names its Workload, owner, pod set
and pods. ``finding_tracker.FindingTracker`` keeps, per owner, when each finding was first seen, so the
controller can tell a new finding (a counter, a log line, an Event) from one still open (a
gauge), and say for how long an over-release has lasted.

Findings:

- ``OverRelease``: live released pods of a pod set above its cap (warning);
- ``Stalled``: a pod the active slice allows still gated after ``stall_seconds`` (warning);
- ``ReleasedWithoutAdmission``: live released pods of an elastic owner with no active slice, or
  outside it (a pod set it does not know, an unmapped pod): released before admission, or born
  without the gate (kueue#10167) (warning);
- ``OutOfOrder``: released pods later in the plugin's order than pods still gated that
  already existed when they were released (created no later) (info);
- ``ForeignGates``: released pods still held by another controller's gate (kueue#9482) (info).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ungater._decide.decision import (
    Decision,
    Ownership,
    PodFacts,
    active_slice,
    decide,
    order_slices,
    pod_set_caps,
)
from ungater._model.views import ADMITTED, FINISHED, ObjectRef, WorkloadView

__all__ = [
    "FINDINGS",
    "FOREIGN_GATES",
    "INFO",
    "OUT_OF_ORDER",
    "OVER_RELEASE",
    "RELEASED_WITHOUT_ADMISSION",
    "STALLED",
    "WARNING",
    "Finding",
    "audit_owner",
    "parse_time",
]

OVER_RELEASE = "OverRelease"
STALLED = "Stalled"
RELEASED_WITHOUT_ADMISSION = "ReleasedWithoutAdmission"
OUT_OF_ORDER = "OutOfOrder"
FOREIGN_GATES = "ForeignGates"
FINDINGS = (OVER_RELEASE, STALLED, RELEASED_WITHOUT_ADMISSION, OUT_OF_ORDER, FOREIGN_GATES)
WARNING = "warning"
INFO = "info"
SEVERITY = {
    OVER_RELEASE: WARNING,
    STALLED: WARNING,
    RELEASED_WITHOUT_ADMISSION: WARNING,
    OUT_OF_ORDER: INFO,
    FOREIGN_GATES: INFO,
}
MAX_NAMED = 20  # pods named in one message; the finding keeps them all


@dataclass(frozen=True, slots=True)
class Finding:
    finding: str  # one of FINDINGS
    kind: str  # the owner kind, as ``Kind`` prints it
    owner: str  # "Kind namespace/name"
    workload: str | None  # the slice it is about (the active one, else the newest)
    pod_set: str | None
    pods: tuple[str, ...]
    message: str
    seconds: float | None = None  # for how long, when known (at least this long)
    first_seen: float | None = field(default=None, compare=False)

    @property
    def severity(self) -> str:
        return SEVERITY[self.finding]

    @property
    def key(self) -> tuple[str, str | None, str | None]:
        return (self.finding, self.workload, self.pod_set)

    def as_dict(self) -> dict[str, object]:
        return {
            "finding": self.finding,
            "severity": self.severity,
            "kind": self.kind,
            "owner": self.owner,
            "workload": self.workload,
            "podSet": self.pod_set,
            "pods": list(self.pods),
            "seconds": None if self.seconds is None else round(self.seconds, 3),
            "message": self.message,
        }


def parse_time(stamp: str) -> float | None:
    """Seconds since the epoch of an RFC 3339 API timestamp; None if there is none."""
    if not stamp:
        return None
    try:
        dt = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp()


def _names(pods: Sequence[str]) -> str:
    shown = ", ".join(pods[:MAX_NAMED])
    return shown + (f" and {len(pods) - MAX_NAMED} more" if len(pods) > MAX_NAMED else "")


def _live_released(f: PodFacts, gate: str) -> bool:
    p = f.pod
    return not p.has_gate(gate) and not p.terminal and not p.deleting


def _order(f: PodFacts) -> tuple[object, ...]:
    key = tuple((0, x, "") if isinstance(x, int) else (1, 0, str(x)) for x in f.sort_key)
    return (key, f.pod.creation_timestamp, f.pod.name, f.pod.uid)


def _existed_before(waiting: PodFacts, released: PodFacts) -> bool:
    """The gated pod already existed when the released one was released: it was created no
    later (a pod is released after its creation). A gated pod created later may have come after
    that release: KubeRay gives a new worker the lowest free replica index, so an older worker
    with a higher index, released long before, is no release out of order (seen beside the
    real KubeRay v1.6.1). Unknown creation times count as existing."""
    w, r = parse_time(waiting.pod.creation_timestamp), parse_time(released.pod.creation_timestamp)
    return w is None or r is None or w <= r


def _handover(slices: Sequence[WorkloadView], now: float, grace: float) -> bool:
    """The chain is between two slices: the newest finished one was replaced less than
    ``grace`` seconds ago and its replacement is not admitted yet (Kueue finishes the old slice
    a few milliseconds before it admits the new one)."""
    finished = [w for w in slices if w.condition_true(FINISHED)]
    if not finished:
        return False
    newest = max(finished, key=lambda w: parse_time(w.conditions[FINISHED].transition_time) or 0)
    at = parse_time(newest.conditions[FINISHED].transition_time)
    if at is None or now - at >= grace:
        return False
    return any(w.replacement_for == newest.key and not w.condition_true(FINISHED) for w in slices)


def audit_owner(
    slices: Sequence[WorkloadView],
    facts: Sequence[PodFacts],
    gate: str,
    *,
    owner: ObjectRef,
    kind: str,
    namespace: str,
    now: float,
    stall_seconds: float,
    desired: Mapping[str, int] | None = None,
    releasable_since: Mapping[str, float] | None = None,
    handover_grace_seconds: float = 5.0,
) -> tuple[list[Finding], Decision]:
    """The findings for one owner at wall-clock time ``now`` (seconds since the epoch), and the
    decision they rest on. How long an over-release has lasted is not in the objects: a
    ``FindingTracker`` measures it while watching. ``releasable_since`` (pod UID -> when it was first seen releasable)
    comes from a watcher that has been looking; without it a stall is dated from the later of
    the pod's creation and the slice's admission (an upper bound)."""
    owner_desc = f"{owner.kind} {namespace}/{owner.name}"
    mine = [f for f in facts if f.ownership is not Ownership.FOREIGN]
    decision = decide(slices, mine, gate, apply_pod_set_updates=False, desired=desired)
    active = active_slice(slices)
    ordered = order_slices(slices)
    newest = ordered[-1].name if ordered else None
    out: list[Finding] = []

    def add(
        finding: str,
        pod_set: str | None,
        pods: Sequence[str],
        msg: str,
        seconds: float | None = None,
    ) -> None:
        workload = active.name if active else newest
        out.append(Finding(finding, kind, owner_desc, workload, pod_set, tuple(pods), msg, seconds))

    if active is None:
        loose = [f.pod.name for f in mine if _live_released(f, gate)]
        if loose and not _handover(slices, now, handover_grace_seconds):
            add(
                RELEASED_WITHOUT_ADMISSION,
                None,
                loose,
                f"{len(loose)} pod(s) released (or born without gate {gate}) with no admitted "
                f"slice: {_names(loose)}",
            )
        return out, decision

    caps = pod_set_caps(active, desired)
    by_set: dict[str, list[PodFacts]] = {name: [] for name in caps}
    outside: list[str] = []
    for f in mine:
        if f.pod_set in by_set:
            by_set[f.pod_set].append(f)
        elif _live_released(f, gate):
            outside.append(f.pod.name)
    if outside:
        add(
            RELEASED_WITHOUT_ADMISSION,
            None,
            outside,
            f"{len(outside)} pod(s) released outside the pod sets of slice {active.name}: "
            f"{_names(outside)}",
        )
    admitted = active.conditions.get(ADMITTED)
    admitted_at = parse_time(admitted.transition_time) if admitted else None
    chosen = {name for r in decision.pod_sets for name in r.chosen}
    for name, cap in caps.items():
        members = sorted(by_set[name], key=_order)
        released = [f for f in members if _live_released(f, gate)]
        # judged against what the slice admits, not the owner's own size: an owner that shrank
        # keeps its released pods until its controller deletes them (KubeRay takes seconds),
        # which is a scale-down under way, not a release beyond admission
        limit = _admitted_limit(cap)
        if len(released) > limit:
            extra = [f.pod.name for f in released[limit:]]
            add(
                OVER_RELEASE,
                name,
                [f.pod.name for f in released],
                f"{len(released)} live released pod(s) in pod set {name} for a cap of {limit} "
                f"(spec {cap.spec}, admitted {cap.admitted}) of slice {active.name}; beyond the "
                f"cap in order: {_names(extra)}",
            )
        stalled: list[tuple[str, float]] = []
        for f in members:
            if f.pod.name not in chosen:
                continue
            start = (releasable_since or {}).get(f.pod.uid)
            if start is None:
                born = parse_time(f.pod.creation_timestamp)
                start = max((t for t in (born, admitted_at) if t is not None), default=None)
            if start is not None and now - start >= stall_seconds:
                stalled.append((f.pod.name, now - start))
        if stalled:
            longest = max(s for _, s in stalled)
            add(
                STALLED,
                name,
                [n for n, _ in stalled],
                f"{len(stalled)} pod(s) of pod set {name} releasable under slice {active.name} "
                f"still gated after {stall_seconds:g}s (longest {longest:.0f}s): "
                f"{_names([n for n, _ in stalled])}",
                seconds=longest,
            )
        live = [f for f in members if not f.pod.terminal and not f.pod.deleting]
        waiting = [f for f in live if f.pod.has_gate(gate)]
        passed = [
            (r, w)
            for r in released
            for w in waiting
            if _order(w) < _order(r) and _existed_before(w, r)
        ]
        if passed:
            later = list(dict.fromkeys(r.pod.name for r, _ in passed))
            lower = list(
                dict.fromkeys(w.pod.name for _, w in sorted(passed, key=lambda p: _order(p[1])))
            )
            add(
                OUT_OF_ORDER,
                name,
                later,
                f"pod set {name}: released {_names(later)} while earlier {_names(lower)} "
                "wait(s) gated",
            )
        foreign = [
            (f.pod.name, [g for g in f.pod.gates if g != gate])
            for f in released
            if any(g != gate for g in f.pod.gates)
        ]
        if foreign:
            add(
                FOREIGN_GATES,
                name,
                [n for n, _ in foreign],
                f"{len(foreign)} released pod(s) of pod set {name} still held by other gates: "
                + ", ".join(f"{n} ({', '.join(g)})" for n, g in foreign[:MAX_NAMED]),
            )
    return out, decision


def _admitted_limit(cap: Any) -> int:
    """The pod set's count under the slice alone: min(spec count, admitted count)."""
    counts = [c for c in (cap.spec, cap.admitted) if c is not None]
    return min(counts) if counts else int(cap.cap)
