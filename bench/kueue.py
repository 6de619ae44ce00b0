"""Side by side with the real Kueue v0.17.0: on the same pods, Kueue's gate and ungater's.

Real elastic Indexed Jobs under a real ClusterQueue; the real Job controller creates the pods;
Kueue's webhook adds its gate beside ours; Kueue's scheduler admits the slices and its job
reconciler removes its gate, while ungater (as a user runs it) removes its own. The cases:

- **initial**: a Job admitted; all its pods.
- **scale-up**: the Job scaled to twice its size; the new pods, from the new slice's admission.
- **succeeded**: a released pod Succeeded; the next completion index, from the Succeeded event.
- **recreated**: a released pod deleted; its replacement, from the deletion event.
- **freed slot, scale-up pending**: quota full, the Job scaled beyond it (slice pending), a
  released pod Succeeded: one gated pod may go, from the Succeeded event.
- **N workloads scaling at once**: N Jobs scaled to twice their size in one burst; per Job.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

from bench import kueue_setup as ks
from bench.api import BenchApi, bounded_gather
from bench.controller_proc import ControllerProcess
from bench.kueue_waits import Waits
from bench.objects import PODS
from bench.sizes import Sizes
from bench.timeline import PodTrack, SliceTrack, Timeline

__all__ = ["CASES", "kueue_side_by_side"]

CASES = ("initial", "scale_up", "succeeded", "recreated", "freed_pending", "burst")
GATES = {"kueue": ks.KUEUE_GATE, "ungater": ks.UNGATER_GATE}
_WAIT_S = 120.0  # for the Job controller and Kueue to create, admit and scale


def _admitted(tl: Timeline, owner: str) -> list[SliceTrack]:
    return [s for s in tl.slices_of(owner) if s.admitted_at is not None]


async def _until(tl: Timeline, done: Callable[[], bool], what: str) -> None:
    if not await tl.until(done, _WAIT_S, what):
        raise RuntimeError(f"kueue bench: no {what} within {_WAIT_S:.0f}s")


async def _initial(tl: Timeline, w: Waits | None, owner: str, n: int) -> None:
    """Wait for the first admission and ``n`` pods; record them (``w``) or only wait."""
    await _until(tl, lambda: bool(_admitted(tl, owner)) and len(tl.of(owner)) >= n, "admission")
    since = _admitted(tl, owner)[0].admitted_at or 0.0
    record = w or Waits(GATES)
    await record.record(tl, lambda: tl.of(owner)[:n], since)


async def _scaled(tl: Timeline, w: Waits, owner: str, old: int, new: int) -> None:
    """After a scale from ``old`` to ``new``: the new slice's admission, the new pods."""
    await _until(
        tl, lambda: len(_admitted(tl, owner)) >= 2 and len(tl.of(owner)) >= new, "scale-up"
    )
    since = _admitted(tl, owner)[-1].admitted_at or 0.0
    await w.record(tl, lambda: [p for p in tl.of(owner) if p.index >= old], since)


async def _lifecycle(api: BenchApi, tl: Timeline, cases: dict[str, Waits], i: int, p: int) -> None:
    ns = tl.namespace
    name = f"life-{i}"
    owner = await ks.create_job(api, ns, name, p, 2 * p + 2)
    await _initial(tl, cases["initial"], owner, p)
    await ks.scale_job(api, ns, name, 2 * p)
    await _scaled(tl, cases["scale_up"], owner, p, 2 * p)

    done = tl.of(owner)[0]
    await api.set_pod_phase(ns, done.name, "Succeeded")
    await _until(tl, lambda: done.succeeded_at is not None, "Succeeded seen")

    def next_index() -> list[PodTrack]:
        return [q for q in tl.of(owner) if q.index == 2 * p]

    await _until(tl, lambda: bool(next_index()), "the next index")
    await cases["succeeded"].record(tl, next_index, done.succeeded_at or 0.0)

    victim = next(q for q in tl.of(owner) if q.index == 1)
    await api.kube.delete(PODS, ns, victim.name)
    await _until(tl, lambda: victim.deleted_at is not None, "the deletion seen")

    def replacement() -> list[PodTrack]:
        return [q for q in tl.of(owner) if q.index == 1 and q.uid != victim.uid]

    await _until(tl, lambda: bool(replacement()), "the replacement pod")
    await cases["recreated"].record(tl, replacement, victim.deleted_at or 0.0)


async def _freed_pending(api: BenchApi, tl: Timeline, w: Waits, p: int) -> None:
    """Quota ``p`` CPUs (this namespace's own ClusterQueue), Job of ``p`` scaled to ``p + 2``."""
    ns = tl.namespace
    owner = await ks.create_job(api, ns, "pend", p, p + 2)
    await _initial(tl, None, owner, p)
    await ks.scale_job(api, ns, "pend", p + 2)
    await _until(
        tl, lambda: len(tl.slices_of(owner)) >= 2 and len(tl.of(owner)) >= p + 2, "pending slice"
    )
    await anyio.sleep(1.0)  # Kueue has tried the pending slice against the full quota
    if len(_admitted(tl, owner)) > 1:
        raise RuntimeError("kueue bench: the scale-up slice was admitted beyond the quota")
    done = tl.of(owner)[0]
    await api.set_pod_phase(ns, done.name, "Succeeded")
    await _until(tl, lambda: done.succeeded_at is not None, "Succeeded seen")
    candidates = [q for q in tl.of(owner) if q.index >= p]
    await w.record(tl, lambda: candidates, done.succeeded_at or 0.0, first_only=True)


async def _burst(api: BenchApi, tl: Timeline, w: Waits, n: int, size: int) -> dict[str, Any]:
    ns = tl.namespace

    def create(i: int) -> Callable[[], Awaitable[str]]:
        return lambda: ks.create_job(api, ns, f"burst-{i}", size, 2 * size)

    def grow(i: int) -> Callable[[], Awaitable[None]]:
        return lambda: ks.scale_job(api, ns, f"burst-{i}", 2 * size)

    owners = await bounded_gather([create(i) for i in range(n)], 16)
    for owner in owners:
        await _initial(tl, None, owner, size)
    t0 = time.monotonic()
    await bounded_gather([grow(i) for i in range(n)], 32)
    for owner in owners:  # each records from its own slice's admission; all run meanwhile
        await _scaled(tl, w, owner, size, 2 * size)
    new_pods = [q for o in owners for q in tl.of(o) if q.index >= size]
    out: dict[str, Any] = {}
    for label, gate in GATES.items():  # from the burst of scale requests to the last removal
        done = [q.removed_at[gate] for q in new_pods if gate in q.removed_at]
        out[f"all_released_{label}_s"] = (
            max(done) - t0 if done and len(done) == len(new_pods) else None
        )
    return out


async def kueue_side_by_side(
    kubeconfig: Path, sizes: Sizes, workdir: Path, run: str
) -> dict[str, Any]:
    """Every case once per repeat; per case and gate the waits, stalls and the ratio."""
    started = time.monotonic()
    api = await BenchApi.connect(kubeconfig)
    life, burst = f"kq-life-{run}", f"kq-burst-{run}"
    pend = [f"kq-pend{i}-{run}" for i in range(sizes.kueue_pending_repeats)]
    queues: list[str] = []
    cases = {c: Waits(GATES, sizes.kueue_stall_s) for c in CASES}
    out: dict[str, Any] = {}
    try:
        for ns in (life, burst, *pend):
            await api.ensure_namespace(ns)
        p = sizes.kueue_pods
        many = sizes.kueue_workloads * sizes.kueue_workload_pods
        queues.append(await ks.create_queues(api, life, 4 * p * sizes.kueue_repeats))
        queues.append(await ks.create_queues(api, burst, 4 * many))
        for ns in pend:
            queues.append(await ks.create_queues(api, ns, p))
        timelines = {ns: Timeline(api.kube, ns) for ns in (life, burst, *pend)}
        proc = ControllerProcess(
            kubeconfig, ks.kueue_controller_config(list(timelines)), workdir, "kueue"
        )
        async with anyio.create_task_group() as tg:
            for tl in timelines.values():
                tg.start_soon(tl.run)
                with anyio.fail_after(30):
                    await tl.synced.wait()
            await proc.start(tg)
            try:
                for i in range(sizes.kueue_repeats):
                    await _lifecycle(api, timelines[life], cases, i, p)
                for ns in pend:
                    await _freed_pending(api, timelines[ns], cases["freed_pending"], p)
                out["burst_totals"] = await _burst(
                    api,
                    timelines[burst],
                    cases["burst"],
                    sizes.kueue_workloads,
                    sizes.kueue_workload_pods,
                )
            finally:
                out["controller_exit_code"] = await proc.stop()
                out["controller_log"] = str(proc.log_path)
                tg.cancel_scope.cancel()
    finally:
        for ns in (life, burst, *pend):
            await api.delete_namespace(ns)
        for cq in queues:
            await ks.delete_queues(api, cq)
        await api.close()
    out["cases"] = {c: w.summary() for c, w in cases.items()}
    out["duration_seconds"] = round(time.monotonic() - started, 1)
    out["sizes"] = {
        "pods": sizes.kueue_pods,
        "repeats": sizes.kueue_repeats,
        "workloads": sizes.kueue_workloads,
        "workload_pods": sizes.kueue_workload_pods,
        "stall_seconds": sizes.kueue_stall_s,
    }
    return out
