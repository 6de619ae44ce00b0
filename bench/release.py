"""Release latency and throughput: admit a slice for N gated pods, time until all are released;
and the raw baseline, the same patches from a minimal script with the same client."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream

from bench.bed import Bed, settle_seconds
from bench.controller_proc import stop_process
from bench.machine import CpuMeter
from bench.objects import CONTROLLER_UID
from bench.profile import PySpy

__all__ = ["Release", "baseline_release", "finished", "go", "raw_process", "release_latency"]


@dataclass
class Release:
    """One timed release of ``pods`` pods: to the last one, to the first one, CPU meanwhile."""

    pods: int
    seconds: float
    first_seconds: float
    cpu: dict[str, float] = field(default_factory=dict)

    @property
    def pods_per_second(self) -> float:
        return self.pods / self.seconds


async def release_latency(
    bed: Bed,
    pods: int,
    repeats: int,
    pids: dict[str, int] | None = None,
    profile: tuple[PySpy, int] | None = None,
) -> list[Release]:
    """From the Admitted status write (request sent) to the last pod seen released.

    ``profile``: a py-spy and the pid to profile for exactly the timed window.
    """
    out: list[Release] = []
    for _ in range(repeats):
        ej = await bed.elastic_job(f"lat{pods}", pods)
        await anyio.sleep(settle_seconds(pods))
        if profile is not None:
            await profile[0].start(profile[1])
        meter = CpuMeter({**(pids or {}), "harness": os.getpid()})
        meter.start()
        t0 = await bed.api.admit(bed.namespace, ej.slice_name, pods)
        t1 = await bed.observer.owner_released(ej.uid, pods, timeout=60 + pods / 5)
        cpu = meter.stop()
        if profile is not None:
            await profile[0].stop()
        first = min(bed.observer.released_by_owner[ej.uid])
        out.append(Release(pods, t1 - t0, first - t0, cpu))
        await bed.clean(pods)
    return out


def _raw_args(
    bed: Bed, selector: str, concurrency: int, qps: float, burst: int, watch: bool
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "bench.raw",
        "--kubeconfig",
        str(bed.kubeconfig),
        "--namespace",
        bed.namespace,
        "--selector",
        selector,
        "--concurrency",
        str(concurrency),
        "--qps",
        str(qps),
        "--burst",
        str(burst),
        *(["--watch"] if watch else []),
    ]


@asynccontextmanager
async def raw_process(
    bed: Bed,
    selector: str,
    qps: float,
    burst: int,
    concurrency: int = 32,
    watch: bool = False,
    list_timeout: float = 60,
) -> AsyncIterator[tuple[Process, BufferedByteReceiveStream]]:
    """``python -m bench.raw`` over the gated pods of ``selector``, listed and waiting for "go"."""
    args = _raw_args(bed, selector, concurrency, qps, burst, watch)
    proc = await anyio.open_process(args, stderr=subprocess.DEVNULL)
    try:
        assert proc.stdin is not None and proc.stdout is not None
        out = BufferedByteReceiveStream(proc.stdout)
        with anyio.fail_after(list_timeout):
            ready = await out.receive_until(b"\n", 1024)
        if not ready.startswith(b"ready"):
            raise RuntimeError(f"bench.raw did not start: {ready!r}")
        yield proc, out
    finally:
        await stop_process(proc)


async def go(proc: Process, out: BufferedByteReceiveStream) -> float:
    """Tell a ready ``bench.raw`` to start; the moment it was told."""
    assert proc.stdin is not None
    t0 = time.monotonic()
    await proc.stdin.send(b"go\n")
    return t0


async def finished(out: BufferedByteReceiveStream, timeout: float = 60) -> float:
    """The seconds ``bench.raw`` reports from "go" to its last patch answered."""
    with anyio.fail_after(timeout):
        line = await out.receive_until(b"\n", 1024)
    if not line.startswith(b"done "):
        raise RuntimeError(f"bench.raw did not finish: {line!r}")
    return float(line.split()[1])


async def baseline_release(
    bed: Bed,
    pods: int,
    qps: float,
    burst: int,
    concurrency: int = 32,
    pids: dict[str, int] | None = None,
    profile: PySpy | None = None,
    watch: bool = False,
) -> Release:
    """``python -m bench.raw`` over ``pods`` gated pods: from "go" to the last seen released."""
    name = bed.name(f"raw{pods}")
    job = await bed.api.create_job(bed.namespace, name, pods, bed.run)
    created = await bed.api.create_pods(job, range(pods), bed.run)
    uids = [p["metadata"]["uid"] for _, p in created]
    await bed.observer.seen(uids, timeout=60 + pods / 10)
    selector = f"{CONTROLLER_UID}={job['metadata']['uid']}"
    async with raw_process(bed, selector, qps, burst, concurrency, watch) as (proc, out):
        await anyio.sleep(settle_seconds(0))
        if profile is not None:
            await profile.start(proc.pid)
        meter = CpuMeter({**(pids or {}), "bench.raw": proc.pid, "harness": os.getpid()})
        meter.start()
        t0 = await go(proc, out)
        t1 = await bed.observer.released(uids, timeout=60 + pods / 5)
        cpu = meter.stop()
        if profile is not None:
            await profile.stop()
        first = min(bed.observer.released_at[u] for u in uids)
        await finished(out)
    await bed.clean(pods)
    return Release(pods, t1 - t0, first - t0, cpu)
