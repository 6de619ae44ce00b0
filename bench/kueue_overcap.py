"""Releases past the cap, judged from the server's own objects (the harness's watch events).

The pod and Workload events of one namespace are replayed in resourceVersion order (one etcd:
one order across both watches). The cap of an owner's pod set is the admitted count of its
newest admitted, unevicted slice (newest: first seen last; finished-by-replacement or not, as
between Kueue finishing the old slice and admitting the new one the released pods are still
the old slice's), 0 before any admission. Per gate, a release is the event that shows a live
pod without the gate it carried (its first such event); it is past the cap when, after it, the
owner's pod set has more live pods without that gate than the cap. Each releaser is judged on
its own gate: the two gates are removed by two writers, each bound by the same cap.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from bench.timeline import PodEvent, SliceEvent

__all__ = ["OverCap", "releases_past_cap"]

_EXAMPLES = 5


@dataclass
class OverCap:
    """One gate's releases past the cap."""

    count: int = 0
    worst: int = 0  # the most live released pods above the cap at one release
    owners: set[str] = field(default_factory=set)
    examples: list[dict[str, Any]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "worst_excess": self.worst,
            "owners": len(self.owners),
            "examples": self.examples,
        }


def _cap(slices: dict[str, SliceEvent], pod_set: str) -> int:
    admitted = [s for s in slices.values() if s.admitted]
    if not admitted:
        return 0
    counts = dict(admitted[-1].counts)
    if pod_set in counts:
        return counts[pod_set]
    if not pod_set and len(counts) == 1:  # no pod set label: the owner's only pod set
        return next(iter(counts.values()))
    return 0


def releases_past_cap(
    events: Iterable[PodEvent | SliceEvent], gates: dict[str, str]
) -> dict[str, OverCap]:
    """Per label of ``gates`` (label -> gate name): the releases of that gate past the cap."""
    ordered = sorted((e for e in events if e.rv >= 0), key=lambda e: e.rv)
    slices: dict[str, dict[str, SliceEvent]] = {}  # owner -> name -> last seen, first seen first
    pods: dict[tuple[str, str], dict[str, PodEvent]] = {}  # (owner, pod set) -> uid -> last
    out = {label: OverCap() for label in gates}
    for e in ordered:
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
            released = gate in e.carried and gate not in e.gates
            if not released or not e.live or (before is not None and gate not in before.gates):
                continue
            live = sum(1 for p in group.values() if p.live and gate not in p.gates)
            cap = _cap(slices.get(e.owner, {}), e.pod_set)
            if live > cap:
                oc = out[label]
                oc.count += 1
                oc.worst = max(oc.worst, live - cap)
                oc.owners.add(e.owner)
                if len(oc.examples) < _EXAMPLES:
                    oc.examples.append(
                        {
                            "rv": e.rv,
                            "owner": e.owner,
                            "pod_set": e.pod_set,
                            "live": live,
                            "cap": cap,
                        }
                    )
    return out
