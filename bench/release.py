"""Release latency and throughput: admit a slice for N gated pods, time until all are released;
and the raw baseline, the same patches from a minimal script with the same client, one
long-lived process per variant over every sample (its connection pool warm, as the
controller's), metered only from "go" to the last pod seen released."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio
from anyio.abc import AnyByteReceiveStream, AnyByteSendStream
from anyio.streams.buffered import BufferedByteReceiveStream

from bench.bed import Bed, settle_seconds
from bench.controller_proc import stop_process
from bench.machine import CpuMeter
from bench.objects import CONTROLLER_UID
from bench.profile import PySpy

__all__ = ["RawProcess", "Release", "baseline_release", "raw_process", "release_latency"]


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


def _raw_args(bed: Bed, concurrency: int, qps: float, burst: int, watch: bool) -> list[str]:
    return [
        sys.executable,
        "-m",
        "bench.raw",
        "--kubeconfig",
        str(bed.kubeconfig),
        "--namespace",
        bed.namespace,
        "--concurrency",
        str(concurrency),
        "--qps",
        str(qps),
        "--burst",
        str(burst),
        *(["--watch"] if watch else []),
    ]


class RawProcess:
    """A running ``python -m bench.raw``, one sample at a time: :meth:`ready` (listed, pool
    warm), :meth:`go`, :meth:`finished`. Its CPU is metered by pid, between "go" and the last
    pod seen released only: what it spends listing and warming falls outside the window."""

    def __init__(self, stdin: AnyByteSendStream, stdout: AnyByteReceiveStream, pid: int) -> None:
        self.pid = pid
        self._in = stdin
        self._out = BufferedByteReceiveStream(stdout)

    async def _answer(self, expected: bytes, timeout: float) -> bytes:
        with anyio.fail_after(timeout):
            line = await self._out.receive_until(b"\n", 1024)
        if not line.startswith(expected):
            raise RuntimeError(f"bench.raw answered {line!r}, not {expected!r}")
        return line

    async def ready(self, selector: str, timeout: float = 60) -> int:
        """List the gated pods of ``selector`` and warm the pool; how many it will release."""
        await self._in.send(f"{selector}\n".encode())
        return int((await self._answer(b"ready ", timeout)).split()[1])

    async def go(self) -> float:
        """Tell the ready process to start; the moment it was told."""
        t0 = time.monotonic()
        await self._in.send(b"go\n")
        return t0

    async def finished(self, timeout: float = 60) -> float:
        """The seconds it reports from "go" to its last patch answered."""
        return float((await self._answer(b"done ", timeout)).split()[1])


@asynccontextmanager
async def raw_process(
    bed: Bed, qps: float, burst: int, concurrency: int = 32, watch: bool = False
) -> AsyncIterator[RawProcess]:
    """``python -m bench.raw`` over ``bed``'s namespace, connected once for every sample."""
    args = _raw_args(bed, concurrency, qps, burst, watch)
    proc = await anyio.open_process(args, stderr=subprocess.DEVNULL)
    try:
        assert proc.stdin is not None and proc.stdout is not None
        yield RawProcess(proc.stdin, proc.stdout, proc.pid)
    finally:
        await stop_process(proc)


async def baseline_release(
    bed: Bed,
    raw: RawProcess,
    pods: int,
    pids: dict[str, int] | None = None,
    profile: PySpy | None = None,
) -> Release:
    """The running ``raw`` over ``pods`` new gated pods: from "go" to the last seen released."""
    name = bed.name(f"raw{pods}")
    job = await bed.api.create_job(bed.namespace, name, pods, bed.run)
    created = await bed.api.create_pods(job, range(pods), bed.run)
    uids = [p["metadata"]["uid"] for _, p in created]
    await bed.observer.seen(uids, timeout=60 + pods / 10)
    await raw.ready(f"{CONTROLLER_UID}={job['metadata']['uid']}")
    await anyio.sleep(settle_seconds(0))
    if profile is not None:
        await profile.start(raw.pid)
    meter = CpuMeter({**(pids or {}), "bench.raw": raw.pid, "harness": os.getpid()})
    meter.start()
    t0 = await raw.go()
    t1 = await bed.observer.released(uids, timeout=60 + pods / 5)
    cpu = meter.stop()
    if profile is not None:
        await profile.stop()
    first = min(bed.observer.released_at[u] for u in uids)
    await raw.finished()
    await bed.clean(pods)
    return Release(pods, t1 - t0, first - t0, cpu)
