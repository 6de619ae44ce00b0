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
from bench.creator import populate

__all__ = ["scale"]

StartController = Callable[[str], ControllerProcess]
_SETTLE_MAX_S = 15.0  # "a few seconds after sync", also at 100k pods


async def scale(
    bed: Bed, workloads: int, pods_each: int, restarts: int, controller: StartController
) -> dict[str, Any]:
    """Sync times, RSS after sync (and a few seconds later), then the admit-all release."""
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
                    out.update(await _release_all(bed, jobs, pods_each, proc))
            finally:
                await proc.stop()
    try:
        await bed.clean(total)
    except Exception as exc:  # the figures above stand; say why the namespace may not be empty
        out["clean_error"] = repr(exc)
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
    total = len(jobs) * pods_each
    deadline = t0 + 120 + total / 20  # 20 pods/s at the least, far below the default QPS
    for ej in jobs:
        left = max(deadline - time.monotonic(), 1.0)
        last = max(last, await bed.observer.owner_released(ej.uid, pods_each, timeout=left))
    mem = proc.memory()
    return {
        "release_all_seconds": last - t0,
        "release_all_pods_per_s": len(jobs) * pods_each / (last - t0),
        "rss_after_release_mb": mem["VmRSS"],
        "peak_rss_mb": mem["VmHWM"],
        # a relist holds a second copy of what changed: say whether the peak includes one
        "relists": proc.count("gone, relisting"),
        "watch_restarts": sum(proc.count(f"watch {w}") for w in ("failed", "silent", "error")),
    }
