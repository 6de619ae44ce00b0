"""Scale: W elastic Jobs of P gated pods each (10k pods across 1k workloads in the full run).

The controller is started over them several times (slices pending) to measure the time to
sync its caches and its memory once synced; then, in the last run, every slice is admitted at
once and the harness times until all pods are released, reading the peak memory after.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from bench.api import bounded_gather
from bench.bed import Bed, ElasticJob, settle_seconds
from bench.controller_proc import ControllerProcess

__all__ = ["scale"]

StartController = Callable[[str], ControllerProcess]


async def _populate(bed: Bed, workloads: int, pods_each: int) -> list[ElasticJob]:
    def make() -> Callable[[], Awaitable[ElasticJob]]:
        async def go() -> ElasticJob:
            return await bed.elastic_job("scale", pods_each)

        return go

    return await bounded_gather([make() for _ in range(workloads)], concurrency=8)


async def scale(
    bed: Bed, workloads: int, pods_each: int, restarts: int, controller: StartController
) -> dict[str, Any]:
    """Sync times, RSS after sync (and a few seconds later), then the admit-all release."""
    t = time.monotonic()
    jobs = await _populate(bed, workloads, pods_each)
    setup_s = time.monotonic() - t
    total = workloads * pods_each
    out: dict[str, Any] = {
        "pods": total,
        "workloads": workloads,
        "setup_seconds": setup_s,
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
                await anyio.sleep(settle_seconds(total))
                out["rss_settled_mb"].append(proc.memory()["VmRSS"])
                if i == restarts - 1:
                    out.update(await _release_all(bed, jobs, pods_each, proc))
            finally:
                await proc.stop()
    await bed.clean(total)
    return out


async def _release_all(
    bed: Bed, jobs: list[ElasticJob], pods_each: int, proc: ControllerProcess
) -> dict[str, Any]:
    def admit(ej: ElasticJob) -> Callable[[], Awaitable[float]]:
        async def go() -> float:
            return await bed.api.admit(bed.namespace, ej.slice_name, pods_each)

        return go

    t0 = time.monotonic()
    await bounded_gather([admit(ej) for ej in jobs], concurrency=32)
    last = 0.0
    for ej in jobs:
        last = max(last, await bed.observer.owner_released(ej.uid, pods_each, timeout=600))
    mem = proc.memory()
    return {
        "release_all_seconds": last - t0,
        "release_all_pods_per_s": len(jobs) * pods_each / (last - t0),
        "rss_after_release_mb": mem["VmRSS"],
        "peak_rss_mb": mem["VmHWM"],
    }
