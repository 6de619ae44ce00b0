"""The ungating decision: which gated pods to release now. A pure function, no I/O.

Given every Workload slice of one owner, the owner's candidate pods (with the plugin's answers
already attached) and the gate we own, ``decide`` picks the pods to release and explains, per
pod set, why every other pod waits. The controller does the I/O around it; ``ungater explain``
prints the same explanation.

Rules, in short: only the newest admitted, unfinished, unevicted slice sets the cap; the cap of
a pod set is min(spec count, admitted count, the owner's own desired count when its plugin can
tell: an owner shrinks before Kueue lowers the slice's count); pods already released (or in flight) use it up;
the rest is filled in the plugin's order, whole release groups at a time, never with a pod
being deleted or one whose ownership is not proven. A pod bound to a ProvisioningRequest other
than the active slice's, or whose release the API server refused for good, waits uncounted.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ungater._decide.podsetupdates import NO_CHANGES, PodChanges, fit_to_pod, merge_updates
from ungater._model.views import ADMITTED, EVICTED, FINISHED, PodView, WorkloadView
from ungater.plugin_api import ReleaseGroup

__all__ = [
    "CONSUME_PROVISIONING_REQUEST",
    "WAIT_CAPACITY",
    "WAIT_CONFLICT",
    "WAIT_ENDED",
    "WAIT_GROUP",
    "WAIT_REFUSED",
    "WAIT_STALE_PROVISIONING",
    "WAIT_UNMAPPED",
    "WAIT_UNRESOLVED",
    "Decision",
    "Ownership",
    "PodFacts",
    "PodSetReport",
    "Release",
    "Waiting",
    "active_slice",
    "decide",
    "gated_by_reason",
    "live_slices",
    "order_slices",
    "pod_set_caps",
]


#: The annotation a ProvisioningRequest admission check puts on the pods it provisioned for.
CONSUME_PROVISIONING_REQUEST = "autoscaling.x-k8s.io/consume-provisioning-request"


class Ownership(enum.Enum):
    PROVEN = "proven"  # the controller chain reaches the owner and the plugin accepts it
    FOREIGN = "foreign"  # the chain leads elsewhere, or there is none: not ours
    UNRESOLVED = "unresolved"  # a hop of the chain is not cached yet: cannot tell


@dataclass(frozen=True, slots=True)
class PodFacts:
    """A candidate pod with what its plugin said about it."""

    pod: PodView
    pod_set: str | None
    sort_key: tuple[int | str, ...] = ()
    group: ReleaseGroup | None = None
    ownership: Ownership = Ownership.PROVEN


@dataclass(frozen=True, slots=True)
class Release:
    """One pod to release: remove ``gate`` found at ``gate_index`` of its schedulingGates, and
    apply ``changes`` (the admission checks' pod set updates) in the same request."""

    pod: PodView
    pod_set: str
    gate: str
    gate_index: int
    changes: PodChanges = NO_CHANGES


#: Why a gated pod waits, as a short code (the ``reason`` label of ``ungater_gated_pods``);
#: ``Waiting.reason`` says the same for a human.
WAIT_CAPACITY = "capacity"  # the cap is reached, or no admitted slice: Kueue has not made room
WAIT_GROUP = "group"  # its release group is incomplete or has a member that cannot go
WAIT_REFUSED = "refused"  # the API server refused its release; backing off
WAIT_STALE_PROVISIONING = "stale-provisioning-request"
WAIT_CONFLICT = "pod-set-update-conflict"
WAIT_UNRESOLVED = "ownership-unresolved"
WAIT_UNMAPPED = "unmapped"  # not provably the owner's, or in no pod set of the slice
WAIT_ENDED = "ended"  # terminal or being deleted: never released, not waiting either


@dataclass(frozen=True, slots=True)
class Waiting:
    pod: str
    reason: str
    code: str = WAIT_CAPACITY


@dataclass(frozen=True, slots=True)
class PodSetReport:
    name: str
    spec_count: int | None
    admitted_count: int | None
    cap: int
    live_ungated: int
    in_flight: int
    gated: int
    chosen: tuple[str, ...] = ()
    waiting: tuple[Waiting, ...] = ()
    problem: str = ""
    desired_count: int | None = None  # the owner's own size for this pod set, when known
    stale: tuple[str, ...] = ()  # gated pods bound to another slice's ProvisioningRequest

    @property
    def free(self) -> int:
        return max(0, self.cap - self.live_ungated - self.in_flight)


@dataclass(frozen=True, slots=True)
class Decision:
    active_slice: str | None
    summary: str
    releases: tuple[Release, ...] = ()
    pod_sets: tuple[PodSetReport, ...] = ()
    unmapped: tuple[Waiting, ...] = field(default=())

    @property
    def released_names(self) -> list[str]:
        return [r.pod.name for r in self.releases]


def _chain_depth(wl: WorkloadView, by_key: dict[str, WorkloadView]) -> int:
    """How many replacement links lead back from ``wl`` (a missing target still counts one)."""
    depth, seen, cur = 0, {wl.key}, wl
    while cur.replacement_for and depth < len(by_key) + 1:
        depth += 1
        nxt = by_key.get(cur.replacement_for)
        if nxt is None or nxt.key in seen:
            break
        seen.add(nxt.key)
        cur = nxt
    return depth


def order_slices(slices: Iterable[WorkloadView]) -> list[WorkloadView]:
    """Oldest first. Creation time, then the replacement link (a replacement is newer than the
    slice it replaces, even within the same second), then UID for a stable total order."""
    items = list(slices)
    by_key = {w.key: w for w in items}
    return sorted(items, key=lambda w: (w.creation_timestamp, _chain_depth(w, by_key), w.uid))


def live_slices(slices: Iterable[WorkloadView]) -> list[WorkloadView]:
    """The slices that are admitted, not finished and not evicted, oldest first: the newest is
    the active one, and any of the others is if the newer ones turn out finished."""
    return [
        w
        for w in order_slices(slices)
        if w.condition_true(ADMITTED)
        and not w.condition_true(FINISHED)
        and not w.condition_true(EVICTED)
    ]


def active_slice(slices: Iterable[WorkloadView]) -> WorkloadView | None:
    """The newest slice that is admitted, not finished and not evicted; None if there is none."""
    live = live_slices(slices)
    return live[-1] if live else None


@dataclass(frozen=True, slots=True)
class _Cap:
    cap: int
    spec: int | None
    admitted: int | None
    problem: str = ""
    desired: int | None = None


def pod_set_caps(wl: WorkloadView, desired: Mapping[str, int] | None = None) -> dict[str, _Cap]:
    """Per pod set: min(spec count, admitted count when present, the owner's desired count
    when known). Malformed input caps at 0."""
    assigned = {a.name: a for a in wl.assignments or ()}
    caps: dict[str, _Cap] = {}
    for ps in wl.pod_sets:
        a = assigned.get(ps.name)
        if ps.count is None:
            cap = _Cap(0, None, a.count if a else None, "spec count missing or invalid")
        elif a is None:
            cap = _Cap(0, ps.count, None, "pod set missing from status.admission")
        elif a.invalid:
            cap = _Cap(0, ps.count, None, "admitted count invalid")
        elif a.count is None:
            cap = _Cap(ps.count, ps.count, None)
        else:
            cap = _Cap(min(ps.count, a.count), ps.count, a.count)
        size = desired.get(ps.name) if desired is not None else None
        if size is not None:
            cap = _Cap(min(cap.cap, size), cap.spec, cap.admitted, cap.problem, size)
        caps[ps.name] = cap
    return caps


def _bound(cap: _Cap) -> str:
    slice_cap = min((c for c in (cap.spec, cap.admitted) if c is not None), default=0)
    if cap.desired is not None and cap.desired < slice_cap:
        return f"; the owner wants {cap.desired} of the {slice_cap} admitted"
    return ""


def _comparable(key: tuple[int | str, ...]) -> tuple[tuple[int, int, str], ...]:
    # ints sort before strs and never compare with them, whatever shapes a plugin returns
    return tuple((0, x, "") if isinstance(x, int) else (1, 0, str(x)) for x in key)


def _order(f: PodFacts) -> tuple[object, ...]:
    return (_comparable(f.sort_key), f.pod.creation_timestamp, f.pod.name, f.pod.uid)


def _decide_pod_set(
    name: str,
    cap: _Cap,
    facts: Sequence[PodFacts],
    gate: str,
    in_flight: frozenset[str],
    updates: tuple[PodChanges, str] = (NO_CHANGES, ""),
    blocked: Mapping[str, str] | None = None,
    provisioning_request: str | None = None,
) -> tuple[PodSetReport, list[Release]]:
    wanted, set_conflict = updates
    fitted: dict[str, PodChanges] = {}
    live_ungated = flying = gated = 0
    waiting: list[Waiting] = []
    eligible: list[PodFacts] = []
    blocked_groups: dict[str, str] = {}
    stale: list[str] = []
    present_in_group: dict[str, int] = {}
    for f in facts:
        pod = f.pod
        live = not pod.terminal and not pod.deleting
        if f.group is not None and live:
            present_in_group[f.group.key] = present_in_group.get(f.group.key, 0) + 1
        if not pod.has_gate(gate):
            live_ungated += live
            continue
        if pod.uid in in_flight:
            flying += live
            continue
        if not live:
            reason = "being deleted" if pod.deleting else f"terminal ({pod.phase})"
            waiting.append(Waiting(pod.name, reason, WAIT_ENDED))
            continue
        gated += 1
        if f.ownership is Ownership.UNRESOLVED:
            reason = "ownership not yet provable (an intermediate owner is not cached)"
            waiting.append(Waiting(pod.name, reason, WAIT_UNRESOLVED))
            if f.group is not None:
                blocked_groups[f.group.key] = f"member {pod.name} is not provably owned"
            continue
        refused = blocked.get(pod.uid) if blocked else None
        if refused is not None:
            # the API server refused its release for good: it waits out its backoff, gated
            # and uncounted, and the next pod in order may take its slot
            waiting.append(Waiting(pod.name, refused, WAIT_REFUSED))
            if f.group is not None:
                blocked_groups[f.group.key] = f"member {pod.name}: {refused}"
            continue
        bound_to = pod.annotations.get(CONSUME_PROVISIONING_REQUEST)
        if provisioning_request and bound_to and bound_to != provisioning_request:
            # made for capacity an older slice provisioned, which is not this slice's: it
            # stays gated and takes no slot, to be recycled by its owner (as upstream does)
            reason = (
                f"stale ProvisioningRequest: the pod consumes {bound_to!r}, the active slice "
                f"provisioned {provisioning_request!r}"
            )
            waiting.append(Waiting(pod.name, reason, WAIT_STALE_PROVISIONING))
            stale.append(pod.name)
            if f.group is not None:
                blocked_groups[f.group.key] = f"member {pod.name}: {reason}"
            continue
        changes, conflict = (
            fit_to_pod(wanted, pod) if not set_conflict else (NO_CHANGES, set_conflict)
        )
        if conflict:
            waiting.append(Waiting(pod.name, f"pod set update conflict: {conflict}", WAIT_CONFLICT))
            if f.group is not None:
                blocked_groups[f.group.key] = (
                    f"member {pod.name} conflicts with the pod set updates"
                )
            continue
        fitted[pod.uid] = changes
        eligible.append(f)

    budget = cap.cap - live_ungated - flying
    units: list[list[PodFacts]] = []
    unit_of: dict[str, list[PodFacts]] = {}
    for f in sorted(eligible, key=_order):
        if f.group is None:
            units.append([f])
            continue
        unit = unit_of.get(f.group.key)
        if unit is None:
            unit = unit_of[f.group.key] = []
            units.append(unit)
        unit.append(f)

    chosen: list[Release] = []
    stopped = ""
    for unit in units:
        group = unit[0].group
        if stopped:
            waiting.extend(Waiting(f.pod.name, stopped) for f in unit)
            continue
        if group is not None:
            why = blocked_groups.get(group.key, "")
            present = present_in_group.get(group.key, 0)
            if not why and group.size is not None and present < group.size:
                why = f"release group {group.key} incomplete ({present} of {group.size} pods)"
            if why:
                waiting.extend(Waiting(f.pod.name, why, WAIT_GROUP) for f in unit)
                continue
        if len(unit) > budget:
            if budget <= 0:
                stopped = f"cap reached ({cap.cap - budget} of {cap.cap} released{_bound(cap)})"
            else:
                stopped = f"next release group needs {len(unit)} pods, {budget} left under the cap"
            waiting.extend(Waiting(f.pod.name, stopped) for f in unit)
            continue
        budget -= len(unit)
        for f in unit:
            chosen.append(Release(f.pod, name, gate, f.pod.gates.index(gate), fitted[f.pod.uid]))

    report = PodSetReport(
        name=name,
        spec_count=cap.spec,
        admitted_count=cap.admitted,
        cap=cap.cap,
        live_ungated=live_ungated,
        in_flight=flying,
        gated=gated,
        chosen=tuple(r.pod.name for r in chosen),
        waiting=tuple(waiting),
        problem=cap.problem,
        desired_count=cap.desired,
        stale=tuple(stale),
    )
    return report, chosen


def decide(
    slices: Sequence[WorkloadView],
    pods: Sequence[PodFacts],
    gate: str,
    in_flight: Iterable[str] = (),
    apply_pod_set_updates: bool = True,
    desired: Mapping[str, int] | None = None,
    blocked: Mapping[str, str] | None = None,
    size_unknown: str = "",
) -> Decision:
    """Choose the pods to release now.

    ``in_flight`` holds the UIDs of pods already patched whose change the cache has not shown
    yet; they count as released. Calling again with the chosen pods added to ``in_flight``
    chooses nothing new. With ``apply_pod_set_updates`` every release carries the active slice's
    admission-check pod set updates the pod still lacks; a pod that cannot take them waits.
    ``desired`` is the owner's own size per pod set (from its plugin); a pod set it does not
    name is bounded by the slice alone. ``blocked`` maps the UIDs of pods whose release the
    API server refused for good (and that are still backing off) to why: they stay gated.
    ``size_unknown`` says why the owner's own size cannot be known: every pod set then caps
    at 0, since a bound that cannot be read must not fall back to the slice alone.
    """
    flying = frozenset(in_flight)
    active = active_slice(slices)
    if active is None:
        summary = "no workload" if not slices else "no admitted, unfinished, unevicted slice"
        return Decision(
            None,
            summary,
            unmapped=tuple(Waiting(f.pod.name, summary) for f in pods if f.pod.has_gate(gate)),
        )
    caps = pod_set_caps(active, desired)
    if size_unknown:
        problem = f"the owner's size is unknown: {size_unknown}"
        caps = {name: _Cap(0, c.spec, c.admitted, problem) for name, c in caps.items()}
    by_set: dict[str, list[PodFacts]] = {name: [] for name in caps}
    unmapped: list[Waiting] = []
    for f in pods:
        if f.ownership is Ownership.FOREIGN:
            if f.pod.has_gate(gate):
                unmapped.append(
                    Waiting(
                        f.pod.name,
                        "not owned: ownerReferences do not lead to the owner",
                        WAIT_UNMAPPED,
                    )
                )
            continue
        if f.pod_set is None or f.pod_set not in by_set:
            if f.pod.has_gate(gate):
                what = f"unknown pod set {f.pod_set!r}" if f.pod_set else "no pod set"
                unmapped.append(
                    Waiting(f.pod.name, f"{what} in slice {active.name}", WAIT_UNMAPPED)
                )
            continue
        by_set[f.pod_set].append(f)

    reports: list[PodSetReport] = []
    releases: list[Release] = []
    for name, cap in caps.items():
        merged = merge_updates(active.pod_set_updates, name)
        updates = merged if apply_pod_set_updates else (NO_CHANGES, "")
        request = merged[0].annotations.get(CONSUME_PROVISIONING_REQUEST)
        report, chosen = _decide_pod_set(
            name, cap, by_set[name], gate, flying, updates, blocked, request
        )
        reports.append(report)
        releases.extend(chosen)
    summary = f"active slice {active.name}: releasing {len(releases)}"
    return Decision(active.name, summary, tuple(releases), tuple(reports), tuple(unmapped))


def gated_by_reason(decision: Decision) -> dict[str, int]:
    """How many gated pods of the decision wait, by ``Waiting.code`` (pods that ended excluded;
    the pods it releases are not waiting)."""
    counts: dict[str, int] = {}
    waits = [w for report in decision.pod_sets for w in report.waiting]
    for w in (*waits, *decision.unmapped):
        if w.code != WAIT_ENDED:
            counts[w.code] = counts.get(w.code, 0) + 1
    return counts
