"""Releases past the cap, judged from the server's own objects (the harness's watch events).

The pod, Workload and owner events of one namespace are replayed in resourceVersion order (one
etcd: one order across the watches). The cap of an owner's pod set is min(spec count, admitted
count) of its newest admitted slice (newest in the product's own order,
``ungater._decide.decision.order_slices``: creation time, the replacement annotation's chain,
UID; admitted: not evicted, and not finished unless a replacement finished it, as between Kueue
finishing the old slice and admitting the new one the released pods are still the old
slice's), 0 before any admission,
bounded again by the owner's own size (the pods its own controller keeps: a Job's parallelism
within its completions left, a RayCluster group's replicas; 0 while the owner was never seen or
after it went). Per gate, a release is the event that shows a live pod without that gate when
the pod's previous event showed it with the gate or the pod had not been seen before: a pod
first seen live and already without the gate is released from that event on. It is past the
cap when, after it, the owner's pod set has more live pods without that gate than the cap.
Each releaser is judged on its own gate: the two gates are removed by two writers, each bound
by the same cap. Every release judged is counted (``judged``): "0 past the cap" of 0 judged
proves nothing. A history with a gap (``bench.gapwatch``: the timeline's watches missed events)
is not judged at all: its result has no count, only the gaps.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.gapwatch import Gap
from bench.timeline import OwnerEvent, PodEvent, SliceEvent
from ungater._decide.decision import order_slices
from ungater._model.views import SLICE_REPLACEMENT_ANNOTATION, WorkloadView

__all__ = ["Limit", "OverCap", "releases_past_cap"]

_EXAMPLES = 5


@dataclass(frozen=True)
class Limit:
    """The three bounds on one pod set's live released pods at one moment."""

    spec: int  # the active slice's spec count (0 without one)
    admitted: int  # its admitted count (0 without one)
    size: int  # the owner's own size (0 while it is unknown)

    @property
    def cap(self) -> int:
        return min(self.spec, self.admitted, self.size)


@dataclass
class OverCap:
    """One gate's releases past the cap, of ``judged`` releases; or, for a history with gaps,
    no judgement (``gaps``: what was not seen)."""

    count: int = 0
    worst: int = 0  # the most live released pods above the cap at one release
    owners: set[str] = field(default_factory=set)
    examples: list[dict[str, Any]] = field(default_factory=list)
    judged: int = 0
    gaps: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        if self.gaps:  # no result: never a count of 0
            return {"count": None, "judged": 0, "gaps": self.gaps}
        return {
            "count": self.count,
            "judged": self.judged,
            "worst_excess": self.worst,
            "owners": len(self.owners),
            "examples": self.examples,
        }


def _of(counts: Mapping[str, int], pod_set: str) -> int:
    if pod_set in counts:
        return counts[pod_set]
    if not pod_set and len(counts) == 1:  # no pod set label: the owner's only pod set
        return next(iter(counts.values()))
    return 0


def _view(s: SliceEvent) -> WorkloadView:
    """Just what ``order_slices`` reads of a slice."""
    namespace, _, name = s.key.partition("/")
    annotations = {SLICE_REPLACEMENT_ANNOTATION: s.replaces} if s.replaces else {}
    return WorkloadView(
        namespace, name, s.uid or s.name, s.created, annotations, None, (), None, {}
    )


def _limit(slices: dict[str, SliceEvent], size: Mapping[str, int] | None, pod_set: str) -> Limit:
    admitted = {s.uid or s.name: s for s in slices.values() if s.admitted}
    owner_size = _of(size, pod_set) if size is not None else 0
    if not admitted:
        return Limit(0, 0, owner_size)
    active = admitted[order_slices(_view(s) for s in admitted.values())[-1].uid]
    return Limit(_of(dict(active.spec), pod_set), _of(dict(active.counts), pod_set), owner_size)


def releases_past_cap(
    events: Iterable[PodEvent | SliceEvent | OwnerEvent],
    gates: dict[str, str],
    gaps: Sequence[Gap] = (),
) -> dict[str, OverCap]:
    """Per label of ``gates`` (label -> gate name): the releases of that gate past the cap;
    with ``gaps``, no judgement (each label's result names them)."""
    if gaps:
        return {label: OverCap(gaps=[g.line() for g in gaps]) for label in gates}
    ordered = sorted((e for e in events if e.rv >= 0), key=lambda e: e.rv)
    slices: dict[str, dict[str, SliceEvent]] = {}  # owner -> name -> last seen, first seen first
    sizes: dict[str, dict[str, int]] = {}  # owner -> pod set -> its own size, while it exists
    pods: dict[tuple[str, str], dict[str, PodEvent]] = {}  # (owner, pod set) -> uid -> last
    out = {label: OverCap() for label in gates}
    for e in ordered:
        if isinstance(e, OwnerEvent):
            if e.gone:
                sizes.pop(e.owner, None)
            else:
                sizes[e.owner] = dict(e.sizes)
            continue
        if isinstance(e, SliceEvent):
            mine = slices.setdefault(e.owner, {})
            if e.gone:
                mine.pop(e.name, None)
            else:
                mine[e.name] = e
            continue
        group = pods.setdefault((e.owner, e.pod_set), {})
        before = group.get(e.uid)
        group[e.uid] = e
        for label, gate in gates.items():
            if not e.live or gate in e.gates:
                continue
            if before is not None and gate not in before.gates:
                continue  # released before: one release per pod
            out[label].judged += 1
            live = sum(1 for p in group.values() if p.live and gate not in p.gates)
            limit = _limit(slices.get(e.owner, {}), sizes.get(e.owner), e.pod_set)
            if live > limit.cap:
                oc = out[label]
                oc.count += 1
                oc.worst = max(oc.worst, live - limit.cap)
                oc.owners.add(e.owner)
                if len(oc.examples) < _EXAMPLES:
                    oc.examples.append(
                        {
                            "rv": e.rv,
                            "owner": e.owner,
                            "pod_set": e.pod_set,
                            "live": live,
                            "cap": limit.cap,
                            "spec": limit.spec,
                            "admitted": limit.admitted,
                            "owner_size": limit.size,
                            "first_seen": before is None,
                        }
                    )
    return out
