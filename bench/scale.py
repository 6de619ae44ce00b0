"""Scale: W elastic Jobs of P gated pods each (10k pods across 1k workloads in the full run).

The controller is started over them several times (slices pending) to measure the time to
sync its caches and its memory once synced; then, in the last run, every slice is admitted at
once and the harness times until all pods are released, reading the peak memory after.

Then the raw baseline at the same scale: a namespace is filled again with as many Jobs and
gated pods, on a control plane of its own when the bench started the plane (emptying 100k pods
from the first one took longer than the rest of the run), else the first namespace emptied.
``python -m bench.raw`` (the guarded PATCH loop alone, with the controller's default QPS, burst
and patch concurrency) releases them all while the harness writes the same admissions as
before, so the API server carries the same writes in both windows. What the controller loses
to the loop at this size is its own cost; what both lose is the API server's.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import anyio

from bench.api import bounded_gather
from bench.bed import Bed, ElasticJob, settle_seconds
from bench.controller_proc import ControllerProcess
from bench.creator import populate
from bench.machine import CpuMeter
from bench.objects import BENCH_LABEL
from bench.release import raw_process
from bench.throughput import cpu_seconds_per_1000

__all__ = ["release_all_comparison", "scale"]

StartController = Callable[[str], ControllerProcess]
#: a bed on a plane of its own, with the plane's processes by name, for the block
FreshBed = Callable[[], AbstractAsyncContextManager[tuple[Bed, dict[str, int]]]]
_SETTLE_MAX_S = 15.0  # "a few seconds after sync", also at 100k pods


async def scale(
    bed: Bed,
    workloads: int,
    pods_each: int,
    restarts: int,
    controller: StartController,
    limits: tuple[float, int],
    plane_pids: dict[str, int] | None = None,
    fresh_bed: FreshBed | None = None,
) -> dict[str, Any]:
    """Sync times, RSS after sync (and a few seconds later), the admit-all release, then the
    raw loop's release-all at the same scale with the controller's client ``limits``: on
    ``fresh_bed`` when given, else on ``bed`` emptied."""
    jobs, setup = await populate(bed, workloads, pods_each)
    total = workloads * pods_each
    out: dict[str, Any] = {
        "pods": total,
        "workloads": workloads,
        "setup_seconds": setup["all_seen_seconds"],
        "setup": setup,
        "sync_seconds": [],
        "ready_seconds": [],
        "rss_synced_mb": [],
        "rss_settled_mb": [],
    }
    for i in range(restarts):
        proc = controller(f"scale-{i}")
        async with anyio.create_task_group() as tg:
            try:
                await proc.start(tg, timeout=300)
                out["sync_seconds"].append(proc.sync_seconds)
                out["ready_seconds"].append(proc.ready_seconds)
                out["rss_synced_mb"].append(proc.memory()["VmRSS"])
                await anyio.sleep(min(settle_seconds(total), _SETTLE_MAX_S))
                out["rss_settled_mb"].append(proc.memory()["VmRSS"])
                if i == restarts - 1:
                    pids = {**(plane_pids or {}), "controller": proc.pid}
                    out.update(await _release_all(bed, jobs, pods_each, proc, pids))
            finally:
                await proc.stop()
    if fresh_bed is not None:
        # the first plane left idle: its 100k pods' watch (a relist, on a busy harness) kept
        # its API server at most of a core through the raw loop's window
        bed.observer.stop()
        first = {f"first plane {k}": v for k, v in (plane_pids or {}).items()}
        async with fresh_bed() as (raw_bed, raw_pids):
            pids = {**raw_pids, **first}
            out["raw"] = await _raw_release_all(raw_bed, workloads, pods_each, limits, pids)
        out["raw"]["plane"] = "its own"
        out["raw"]["plane_pids"] = raw_pids
        return out
    try:
        await bed.clean(total)
    except Exception as exc:  # the figures above stand; say why the namespace may not be empty
        out["clean_error"] = repr(exc)
        return out
    out["raw"] = await _raw_release_all(bed, workloads, pods_each, limits, plane_pids or {})
    out["raw"]["plane"] = "the same, emptied"
    try:
        await bed.clean(total)
    except Exception as exc:
        out["raw"]["clean_error"] = repr(exc)
    return out


def _admissions(
    bed: Bed, jobs: list[ElasticJob], pods_each: int
) -> list[Callable[[], Awaitable[float]]]:
    def admit(ej: ElasticJob) -> Callable[[], Awaitable[float]]:
        async def go() -> float:
            return await bed.api.admit(bed.namespace, ej.slice_name, pods_each)

        return go

    return [admit(ej) for ej in jobs]


def _deadline(t0: float, total: int) -> float:
    return t0 + 120 + total / 20  # 20 pods/s at the least, far below the default QPS


async def _release_all(
    bed: Bed,
    jobs: list[ElasticJob],
    pods_each: int,
    proc: ControllerProcess,
    pids: dict[str, int],
) -> dict[str, Any]:
    meter = CpuMeter({**pids, "harness": os.getpid()})
    meter.start()
    t0 = time.monotonic()
    await bounded_gather(_admissions(bed, jobs, pods_each), concurrency=32)
    last = 0.0
    total = len(jobs) * pods_each
    deadline = _deadline(t0, total)
    for ej in jobs:
        left = max(deadline - time.monotonic(), 1.0)
        last = max(last, await bed.observer.owner_released(ej.uid, pods_each, timeout=left))
    cpu = meter.stop()
    mem = proc.memory()
    return {
        "release_all_seconds": last - t0,
        "release_all_pods_per_s": total / (last - t0),
        "release_all_cpu": cpu,
        "rss_after_release_mb": mem["VmRSS"],
        "peak_rss_mb": mem["VmHWM"],
        # a relist holds a second copy of what changed: say whether the peak includes one
        "relists": proc.count("gone, relisting"),
        "watch_restarts": sum(proc.count(f"watch {w}") for w in ("failed", "silent", "error")),
    }


async def _raw_release_all(
    bed: Bed,
    workloads: int,
    pods_each: int,
    limits: tuple[float, int],
    plane_pids: dict[str, int],
) -> dict[str, Any]:
    """The same scale released by the raw loop: from "go" (and the first admission written) to
    the last pod seen released, under the same admission writes as the controller's run."""
    jobs, setup = await populate(bed, workloads, pods_each)
    uids = [u for ej in jobs for u in ej.pod_uids()]
    total = len(uids)
    selector = f"{BENCH_LABEL}={bed.run}"
    qps, burst = limits
    async with raw_process(bed, qps, burst) as proc:
        await proc.ready(selector, timeout=60 + total / 500)
        await anyio.sleep(min(settle_seconds(total), _SETTLE_MAX_S))
        meter = CpuMeter({**plane_pids, "bench.raw": proc.pid, "harness": os.getpid()})
        meter.start()
        async with anyio.create_task_group() as tg:
            t0 = await proc.go()
            tg.start_soon(bounded_gather, _admissions(bed, jobs, pods_each), 32)
            left = max(_deadline(t0, total) - time.monotonic(), 1.0)
            last = await bed.observer.released(uids, timeout=left)
        cpu = meter.stop()
        reported = await proc.finished()
    result: dict[str, Any] = {
        "pods": total,
        "qps": qps,
        "burst": burst,
        "setup": setup,
        "release_all_seconds": last - t0,
        "release_all_pods_per_s": total / (last - t0),
        "reported_seconds": reported,  # the loop's own clock: "go" to its last answer
        "release_all_cpu": cpu,
    }
    return result


def release_all_comparison(ours: dict[str, Any], raw: dict[str, Any]) -> dict[str, Any]:
    """The controller's release-all against the raw loop's at the same scale: rate ratio, CPU
    per release, and the API server's and the machine's cores in each window."""
    mine, theirs = ours["release_all_cpu"], raw["release_all_cpu"]
    cpu_ctl = cpu_seconds_per_1000(mine, "controller", ours["pods"]) or math.nan
    cpu_raw = cpu_seconds_per_1000(theirs, "bench.raw", raw["pods"]) or math.nan
    return {
        "ratio": ours["release_all_pods_per_s"] / raw["release_all_pods_per_s"],
        "cpu_per_1000_controller": cpu_ctl,
        "cpu_per_1000_raw": cpu_raw,
        "cpu_ratio": cpu_ctl / cpu_raw if cpu_raw else math.nan,
        "apiserver_cores": (
            mine.get("kube-apiserver", math.nan),
            theirs.get("kube-apiserver", math.nan),
        ),
        "machine_cores": (mine.get("machine", math.nan), theirs.get("machine", math.nan)),
    }
