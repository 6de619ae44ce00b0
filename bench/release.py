"""Release latency and throughput: admit a slice for N gated pods, time until all are released;
and the raw baseline, the same patches from a minimal script with the same client."""

from __future__ import annotations

import subprocess
import sys
import time

import anyio
from anyio.streams.buffered import BufferedByteReceiveStream

from bench.bed import Bed, settle_seconds
from bench.controller_proc import stop_process
from bench.objects import CONTROLLER_UID

__all__ = ["baseline_throughput", "release_latency"]


async def release_latency(bed: Bed, pods: int, repeats: int) -> list[float]:
    """Seconds from the Admitted status write (request sent) to the last pod seen released."""
    samples: list[float] = []
    for _ in range(repeats):
        ej = await bed.elastic_job(f"lat{pods}", pods)
        await anyio.sleep(settle_seconds(pods))
        t0 = await bed.api.admit(bed.namespace, ej.slice_name, pods)
        t1 = await bed.observer.owner_released(ej.uid, pods, timeout=60 + pods / 5)
        samples.append(t1 - t0)
        await bed.clean(pods)
    return samples


async def baseline_throughput(
    bed: Bed, pods: int, repeats: int, qps: float, burst: int, concurrency: int = 32
) -> list[float]:
    """Pods per second of ``python -m bench.raw``: from "go" to the last pod seen released."""
    samples: list[float] = []
    for _ in range(repeats):
        name = bed.name(f"raw{pods}")
        job = await bed.api.create_job(bed.namespace, name, pods, bed.run)
        created = await bed.api.create_pods(job, range(pods), bed.run)
        uids = [p["metadata"]["uid"] for _, p in created]
        await bed.observer.seen(uids, timeout=60 + pods / 10)
        selector = f"{CONTROLLER_UID}={job['metadata']['uid']}"
        args = [
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
        ]
        proc = await anyio.open_process(args, stderr=subprocess.DEVNULL)
        try:
            assert proc.stdin is not None and proc.stdout is not None
            out = BufferedByteReceiveStream(proc.stdout)
            with anyio.fail_after(60):
                ready = await out.receive_until(b"\n", 1024)
            if not ready.startswith(b"ready"):
                raise RuntimeError(f"bench.raw did not start: {ready!r}")
            await anyio.sleep(settle_seconds(0))
            t0 = time.monotonic()
            await proc.stdin.send(b"go\n")
            t1 = await bed.observer.released(uids, timeout=60 + pods / 5)
            samples.append(pods / (t1 - t0))
            with anyio.fail_after(60):
                await out.receive_until(b"\n", 1024)
        finally:
            await stop_process(proc)
        await bed.clean(pods)
    return samples
