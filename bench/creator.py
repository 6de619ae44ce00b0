"""Many objects fast: a fixed pool of workers over one queue of requests.

``bounded_gather`` starts one task per call, which at 100k pods is 100k coroutines alive at once;
here ``concurrency`` workers pull the next item from a shared iterator, so memory stays flat
and the API server sees at most ``concurrency`` requests in flight (64: enough to keep a
two-core API server busy without queueing in its priority-and-fairness levels).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

import anyio

from bench.bed import Bed, ElasticJob
from bench.objects import PODS, pod_body

__all__ = ["pooled", "populate"]

T = TypeVar("T")
R = TypeVar("R")


async def pooled(
    items: Iterable[T], fn: Callable[[T], Awaitable[R]], concurrency: int = 64
) -> list[R]:
    """``fn`` over ``items`` with at most ``concurrency`` calls in flight; results in order."""
    indexed = list(enumerate(items))
    results: list[Any] = [None] * len(indexed)
    it = iter(indexed)

    async def worker() -> None:
        for i, item in it:  # shared iterator: each item is taken by exactly one worker
            results[i] = await fn(item)

    async with anyio.create_task_group() as tg:
        for _ in range(min(concurrency, len(indexed)) or 0):
            tg.start_soon(worker)
    return results


async def populate(
    bed: Bed, workloads: int, pods_each: int, concurrency: int = 64
) -> tuple[list[ElasticJob], dict[str, float]]:
    """``workloads`` Jobs with a pending slice each, then all their gated pods, all seen by the
    harness's watch; the time each phase took and the pods' creation rate."""
    t0 = time.monotonic()

    async def job(i: int) -> ElasticJob:
        name = bed.name("scale")
        created = await bed.api.create_job(bed.namespace, name, pods_each, bed.run)
        ej = ElasticJob(created, f"job-{name}-a")
        await bed.api.create_workload(created, ej.slice_name, pods_each, bed.run)
        return ej

    jobs = await pooled(range(workloads), job, concurrency)
    t1 = time.monotonic()

    async def pod(item: tuple[ElasticJob, int]) -> None:
        ej, index = item
        ns = bed.namespace
        ej.pods.append(await bed.api.kube.create(PODS, ns, pod_body(ej.job, index, bed.run)))

    await pooled(((ej, i) for ej in jobs for i in range(pods_each)), pod, concurrency)
    t2 = time.monotonic()
    uids = [p["metadata"]["uid"] for ej in jobs for p in ej.pods]
    await bed.observer.seen(uids, timeout=120 + len(uids) / 100)
    t3 = time.monotonic()
    return jobs, {
        "create_jobs_seconds": t1 - t0,
        "create_pods_seconds": t2 - t1,
        "pods_created_per_second": len(uids) / max(t2 - t1, 1e-9),
        "all_seen_seconds": t3 - t0,
    }
