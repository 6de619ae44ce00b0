"""The stories of the Kueue benchmark, beside the real Kueue (v0.19.2 by default; any pinned
version by name), and what one releaser's share of a run gathers (``Side``).

Real elastic Indexed Jobs and RayClusters under real ClusterQueues; the real Job controller and
KubeRay operator create the pods; Kueue's webhook adds its gate; Kueue's scheduler admits the
slices. Who releases is the runner's choice (``bench.kueue_run``): each releaser alone on
Kueue's gate (Kueue in some namespaces, ungater behind the shipped policy in others), or head
to head (ungater's own gate beside Kueue's on the same pods). The cases:The cases:

- **initial**: a Job admitted; all its pods.
- **scale-up**: the Job scaled to twice its size; the new pods, from the new slice's admission.
- **succeeded**: a released pod Succeeded; the next completion index, from the Succeeded event.
- **recreated**: a released pod deleted; its replacement, from the deletion event.
- **freed slot, scale-up pending**: quota full, the Job scaled beyond it (slice pending), a
  released pod Succeeded: one gated pod may go, from the Succeeded event; which index went.
- **shrink race**: quota 8, a Job of 4 scaled to 12 (slice pending, 8 gated) then to 8: the
  shrunk slice admitted while the Job controller deletes the surplus; the last release.
- **RayCluster scale-up**: workers doubled; the new workers, from the new slice's admission.
- **burst**: N Jobs waiting on an empty quota, the quota raised for all: each Job's pods from
  its own admission, and from the quota change to the last removal.

Every story's releases past the cap are judged afterwards from the watch events of the pods,
the Workloads and the owners (``bench.kueue_overcap``): against min(spec count, admitted count,
the owner's own size) per pod set.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio

from bench import kueue_setup as ks
from bench.api import BenchApi, bounded_gather
from bench.kueue_waits import Waits
from bench.objects import PODS
from bench.sizes import Sizes
from bench.timeline import PodTrack, SliceTrack, Timeline

__all__ = [
    "CASES",
    "STORIES",
    "Side",
    "Wave",
    "burst",
    "freed_pending",
    "lifecycle",
    "raycluster",
    "shrink",
]

CASES = (
    "initial",
    "scale_up",
    "succeeded",
    "recreated",
    "freed_pending",
    "shrink",
    "rc_scale",
    "burst",
)
#: the stories whose releases past the cap are counted (a Job's lifecycle holds four cases)
STORIES = ("job_lifecycle", "freed_pending", "shrink", "rc_scale", "burst")
GATES = {"kueue": ks.KUEUE_GATE, "ungater": ks.UNGATER_GATE}
_WAIT_S = 120.0  # for the Job controller, KubeRay and Kueue to create, admit and scale


@dataclass(frozen=True)
class Wave:
    """One sample's wave as the harness saw it, per label: the pod whose wait is the sample
    (the longest, or the shortest of a one-slot wave), when it became releasable (the later of the
    trigger and its creation seen) and when it was seen released. For the spans."""

    case: str
    owner: str
    since: dict[str, float]
    end: dict[str, float]
    pod: dict[str, str]


@dataclass
class Side:
    """One releaser's share of a run (or both, head to head): the gates timed (label -> gate),
    the gate put in templates beside Kueue's (None: Kueue's alone), and what it gathers:
    samples per case, owners per story, release order, waves."""

    label: str
    gates: dict[str, str]
    template_gate: str | None
    stall_s: float
    cases: dict[str, Waits] = field(default_factory=dict)
    owners: dict[str, set[str]] = field(default_factory=lambda: {s: set() for s in STORIES})
    order: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    waves: list[Wave] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.cases = {c: Waits(self.gates, self.stall_s) for c in CASES}

    async def record(
        self,
        case: str,
        tl: Timeline,
        owner: str,
        pods: Callable[[], list[PodTrack]],
        since: float,
        *,
        first_only: bool = False,
    ) -> None:
        """A sample of ``case`` (``Waits.record``), and its wave for the spans."""
        got = await self.cases[case].record(tl, pods, since, first_only=first_only)
        wave = Wave(case, owner, {}, {}, {})
        for label, gate in self.gates.items():
            went = [p for p in pods() if gate in p.gates and gate in p.removed_at]
            if got.get(label) is None or not went:
                continue

            def waited(p: PodTrack, gate: str = gate) -> float:
                return p.removed_at[gate] - max(since, p.added_at)

            last = (min if first_only else max)(went, key=waited)  # the sample's own pod
            wave.since[label] = max(since, last.added_at)
            wave.end[label] = last.removed_at[gate]
            wave.pod[label] = last.uid
        self.waves.append(wave)


def _admitted(tl: Timeline, owner: str) -> list[SliceTrack]:
    return [s for s in tl.slices_of(owner) if s.admitted_at is not None]


async def _until(tl: Timeline, done: Callable[[], bool], what: str) -> None:
    if not await tl.until(done, _WAIT_S, what):
        raise RuntimeError(f"kueue bench: no {what} within {_WAIT_S:.0f}s")


async def _initial(tl: Timeline, side: Side, case: str | None, owner: str, n: int) -> None:
    """Wait for the first admission and ``n`` pods; record them (``case``) or only wait."""
    await _until(tl, lambda: bool(_admitted(tl, owner)) and len(tl.of(owner)) >= n, "admission")
    since = _admitted(tl, owner)[0].admitted_at or 0.0
    if case is not None:
        await side.record(case, tl, owner, lambda: tl.of(owner)[:n], since)
    else:
        await Waits(side.gates).record(tl, lambda: tl.of(owner)[:n], since)


async def _scaled(tl: Timeline, side: Side, owner: str, old: int, new: int) -> None:
    """After a scale from ``old`` to ``new``: the new slice's admission, the new pods."""
    await _until(
        tl, lambda: len(_admitted(tl, owner)) >= 2 and len(tl.of(owner)) >= new, "scale-up"
    )
    since = _admitted(tl, owner)[-1].admitted_at or 0.0
    await side.record(
        "scale_up", tl, owner, lambda: [p for p in tl.of(owner) if p.index >= old], since
    )


async def lifecycle(api: BenchApi, tl: Timeline, side: Side, i: int, p: int) -> None:
    ns = tl.namespace
    name = f"life-{i}"
    owner = await ks.create_job(api, ns, name, p, 2 * p + 2, side.template_gate)
    side.owners["job_lifecycle"].add(owner)
    await _initial(tl, side, "initial", owner, p)
    await ks.scale_job(api, ns, name, 2 * p)
    await _scaled(tl, side, owner, p, 2 * p)

    done = tl.of(owner)[0]
    await api.set_pod_phase(ns, done.name, "Succeeded")
    await _until(tl, lambda: done.succeeded_at is not None, "Succeeded seen")

    def next_index() -> list[PodTrack]:
        return [q for q in tl.of(owner) if q.index == 2 * p]

    await _until(tl, lambda: bool(next_index()), "the next index")
    await side.record("succeeded", tl, owner, next_index, done.succeeded_at or 0.0)

    victim = next(q for q in tl.of(owner) if q.index == 1)
    await api.kube.delete(PODS, ns, victim.name)
    await _until(tl, lambda: victim.deleted_at is not None, "the deletion seen")

    def replacement() -> list[PodTrack]:
        return [q for q in tl.of(owner) if q.index == 1 and q.uid != victim.uid]

    await _until(tl, lambda: bool(replacement()), "the replacement pod")
    await side.record("recreated", tl, owner, replacement, victim.deleted_at or 0.0)


async def raycluster(api: BenchApi, tl: Timeline, side: Side, i: int, p: int) -> None:
    """A RayCluster of ``p // 2`` workers (at least 1) scaled to ``p``: the new workers."""
    ns, start = tl.namespace, max(1, p // 2)
    name = f"rc-{i}"
    owner = await ks.create_raycluster(api, ns, name, start, side.template_gate)
    side.owners["rc_scale"].add(owner)
    await _initial(tl, side, None, owner, start + 1)
    before = {q.uid for q in tl.of(owner)}
    await ks.scale_raycluster(api, ns, name, p)

    def new_workers() -> list[PodTrack]:
        return [q for q in tl.of(owner) if q.uid not in before]

    await _until(
        tl,
        lambda: len(_admitted(tl, owner)) >= 2 and len(new_workers()) >= p - start,
        "RayCluster scale-up",
    )
    since = _admitted(tl, owner)[-1].admitted_at or 0.0
    await side.record("rc_scale", tl, owner, new_workers, since)


def _first_released(pods: list[PodTrack], gate: str) -> int | None:
    went = [q for q in pods if gate in q.removed_at]
    return min(went, key=lambda q: q.removed_at[gate]).index if went else None


async def freed_pending(api: BenchApi, tl: Timeline, side: Side, sizes: Sizes) -> None:
    """Quota ``p`` CPUs (this namespace's own ClusterQueue), Job of ``p`` scaled to ``p + g``:
    ``g`` gated, one slot freed; which index each releaser lets go."""
    ns, p, g = tl.namespace, sizes.kueue_pending_pods, sizes.kueue_pending_gated
    owner = await ks.create_job(api, ns, "pend", p, p + g, side.template_gate)
    side.owners["freed_pending"].add(owner)
    await _initial(tl, side, None, owner, p)
    await ks.scale_job(api, ns, "pend", p + g)
    await _until(
        tl, lambda: len(tl.slices_of(owner)) >= 2 and len(tl.of(owner)) >= p + g, "pending slice"
    )
    await anyio.sleep(1.0)  # Kueue has tried the pending slice against the full quota
    if len(_admitted(tl, owner)) > 1:
        raise RuntimeError("kueue bench: the scale-up slice was admitted beyond the quota")
    done = tl.of(owner)[0]
    await api.set_pod_phase(ns, done.name, "Succeeded")
    await _until(tl, lambda: done.succeeded_at is not None, "Succeeded seen")
    candidates = [q for q in tl.of(owner) if q.index >= p]
    await side.record(
        "freed_pending", tl, owner, lambda: candidates, done.succeeded_at or 0.0, first_only=True
    )
    order: dict[str, Any] = {"gated": [q.index for q in candidates]}
    order |= {label: _first_released(candidates, gate) for label, gate in side.gates.items()}
    side.order.setdefault("freed_pending", []).append(order)


async def shrink(api: BenchApi, tl: Timeline, side: Side, sizes: Sizes) -> None:
    """Quota ``to``: a Job of ``start`` scaled to ``big`` (slice pending), then to ``to``: the
    shrunk slice's admission to the last release among the live new pods."""
    ns, (start, big, to) = tl.namespace, sizes.kueue_shrink
    owner = await ks.create_job(api, ns, "shrink", start, 2 * big, side.template_gate)
    side.owners["shrink"].add(owner)
    await _initial(tl, side, None, owner, start)
    await ks.scale_job(api, ns, "shrink", big)
    await _until(
        tl, lambda: len(tl.slices_of(owner)) >= 2 and len(tl.of(owner)) >= big, "pending slice"
    )
    await anyio.sleep(1.0)  # Kueue has tried the pending slice against the quota
    if len(_admitted(tl, owner)) > 1:
        raise RuntimeError("kueue bench: the pending slice was admitted beyond the quota")
    t_shrink = time.monotonic()
    await ks.scale_job(api, ns, "shrink", to)

    def shrunk() -> list[SliceTrack]:
        return [s for s in _admitted(tl, owner) if (s.admitted_at or 0.0) > t_shrink]

    await _until(tl, lambda: bool(shrunk()), "the shrunk slice admitted")
    since = shrunk()[-1].admitted_at or 0.0
    await side.record(
        "shrink", tl, owner, lambda: [q for q in tl.of(owner) if q.index >= start], since
    )


async def burst(
    api: BenchApi, tl: Timeline, side: Side, cq: str, n: int, size: int
) -> dict[str, Any]:
    """``n`` Jobs of ``size`` wait on a quota of 0; the quota is raised for all at once."""
    ns = tl.namespace

    def create(i: int) -> Callable[[], Awaitable[str]]:
        return lambda: ks.create_job(api, ns, f"burst-{i}", size, size, side.template_gate)

    owners = await bounded_gather([create(i) for i in range(n)], 16)
    side.owners["burst"].update(owners)
    await _until(tl, lambda: all(tl.slices_of(o) for o in owners), "the burst's Workloads")
    await anyio.sleep(1.0)  # Kueue has found them inadmissible
    t0 = time.monotonic()
    await ks.set_quota(api, cq, n * size)
    for owner in owners:  # each records from its own admission; all run meanwhile
        await _initial(tl, side, "burst", owner, size)
    pods = [q for o in owners for q in tl.of(o)]
    gates = list(side.gates.values())
    await tl.until(  # every gate off (or the bound): the totals below need the last removal
        lambda: all(g in q.removed_at for q in pods for g in gates), _WAIT_S, "burst released"
    )
    admitted = [s.admitted_at for o in owners for s in _admitted(tl, o)]
    out: dict[str, Any] = {
        "last_admission_s": max(a for a in admitted if a) - t0,
        "last_pod_created_s": max(q.added_at for q in pods) - t0,  # the Job controller's pace
    }
    for label, gate in side.gates.items():  # from the quota change to the last removal
        done = [q.removed_at[gate] for q in pods if gate in q.removed_at]
        out[f"all_released_{label}_s"] = max(done) - t0 if len(done) == len(pods) else None
        out[f"still_gated_{label}"] = len(pods) - len(done)  # said when the above is None
    return out
