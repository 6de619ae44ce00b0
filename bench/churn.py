"""Scale-up churn: W elastic Jobs grow from A to B pods at once. Each gets its new gated pods
and a replacement slice; then all replacements are admitted (and the old slices Finished)
together, and the harness times until every new pod is released."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import anyio

from bench.api import bounded_gather
from bench.bed import Bed, ElasticJob, settle_seconds

__all__ = ["scaleup_churn"]


async def _grown(bed: Bed, workloads: int, before: int) -> list[ElasticJob]:
    """W Jobs, each with ``before`` pods released under an admitted first slice."""

    def make() -> Callable[[], Awaitable[ElasticJob]]:
        async def go() -> ElasticJob:
            ej = await bed.elastic_job("churn", before)
            await bed.api.admit(bed.namespace, ej.slice_name, before)
            return ej

        return go

    jobs = await bounded_gather([make() for _ in range(workloads)], concurrency=8)
    for ej in jobs:
        await bed.observer.owner_released(ej.uid, before, timeout=120)
    return jobs


async def scaleup_churn(
    bed: Bed, workloads: int, before: int, after: int, repeats: int
) -> tuple[list[float], list[float]]:
    """Per repeat: seconds from the first admission write to the last new pod seen released;
    and per workload: from its own admission write to its last new pod seen released."""
    totals: list[float] = []
    per_workload: list[float] = []
    for _ in range(repeats):
        jobs = await _grown(bed, workloads, before)
        new_slices: dict[str, str] = {}

        def grow(ej: ElasticJob, new_slices: dict[str, str]) -> Callable[[], Awaitable[None]]:
            async def go() -> None:
                await bed.api.scale_job(ej.job, after)
                created = await bed.api.create_pods(ej.job, range(before, after), bed.run)
                ej.pods.extend(p for _, p in created)
                name = ej.slice_name[:-1] + "b"
                await bed.api.create_workload(ej.job, name, after, bed.run, ej.slice_name)
                new_slices[ej.uid] = name

            return go

        await bounded_gather([grow(ej, new_slices) for ej in jobs], concurrency=8)
        await bed.observer.seen([u for ej in jobs for u in ej.pod_uids()], timeout=120)
        await anyio.sleep(settle_seconds(workloads * (after - before)))
        sent: dict[str, float] = {}

        def switch(
            ej: ElasticJob, new_slices: dict[str, str], sent: dict[str, float]
        ) -> Callable[[], Awaitable[None]]:
            async def go() -> None:
                sent[ej.uid] = await bed.api.admit(bed.namespace, new_slices[ej.uid], after)
                await bed.api.finish(bed.namespace, ej.slice_name)

            return go

        t0 = time.monotonic()
        await bounded_gather([switch(ej, new_slices, sent) for ej in jobs], concurrency=32)
        last = 0.0
        for ej in jobs:
            t = await bed.observer.owner_released(ej.uid, after, timeout=120)
            per_workload.append(t - sent[ej.uid])
            last = max(last, t)
        totals.append(last - t0)
        await bed.clean(workloads * after)
    return totals, per_workload
