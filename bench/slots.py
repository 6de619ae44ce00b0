"""Freed-slot latency (a released pod finishes, the next waits) and pods arriving after the
slice was admitted (created in batches, each batch timed to its last release)."""

from __future__ import annotations

import time

import anyio

from bench.bed import Bed, settle_seconds

__all__ = ["arrival_latency", "freed_slot_latency"]


async def freed_slot_latency(bed: Bed, cap: int, samples: int) -> list[float]:
    """Seconds from a released pod's ``Succeeded`` status write to the next pod seen released."""
    total = cap + samples
    ej = await bed.elastic_job("freed", total)
    await anyio.sleep(settle_seconds(total))
    await bed.api.admit(bed.namespace, ej.slice_name, cap)
    await bed.observer.owner_released(ej.uid, cap, timeout=60)
    await anyio.sleep(0.3)
    by_index = sorted(ej.pods, key=lambda p: int(p["metadata"]["labels"][_INDEX]))
    out: list[float] = []
    for k in range(samples):
        victim = by_index[k]["metadata"]["name"]
        t0 = time.monotonic()
        await bed.api.set_pod_phase(bed.namespace, victim, "Succeeded")
        t1 = await bed.observer.owner_released(ej.uid, cap + k + 1, timeout=60)
        out.append(t1 - t0)
        await anyio.sleep(0.1)
    await bed.clean(total)
    return out


async def arrival_latency(bed: Bed, rounds: int, batch: int) -> list[float]:
    """Seconds from the last create of a batch (request sent) to its last pod seen released."""
    total = rounds * batch
    ej = await bed.elastic_job("arrive", total, pods=0)
    await bed.api.admit(bed.namespace, ej.slice_name, total)
    await anyio.sleep(settle_seconds(0))
    out: list[float] = []
    for r in range(rounds):
        created = await bed.api.create_pods(ej.job, range(r * batch, (r + 1) * batch), bed.run)
        last_sent = max(sent for sent, _ in created)
        t1 = await bed.observer.released([p["metadata"]["uid"] for _, p in created], timeout=60)
        out.append(t1 - last_sent)
        await anyio.sleep(0.1)
    await bed.clean(total)
    return out


_INDEX = "batch.kubernetes.io/job-completion-index"
