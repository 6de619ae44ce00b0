"""The raw baseline: remove the gate from N pods with ungater's client, and nothing else.

Run as a separate, long-lived process (``python -m bench.raw``), as the controller is: it
connects once, through ``ungater._kube.adapter.connect`` with the same QPS, burst, pool size and
patch concurrency as the controller, then serves one sample per line on stdin. A line names a
label selector: it lists the gated pods of it, warms its connection pool (``concurrency``
concurrent GETs of the listed pods, so that as many connections are open and past their TLS
handshake as the patches will use: idle ones may have been closed since the last sample), says
``ready N`` on stdout, waits for the next line ("go"), then sends one guarded JSON patch per pod
(the controller's exact patch) and says ``done SECONDS``. The end of stdin ends it. So its timed
window opens on a warm pool, as the controller's does; a fresh process per sample used to pay
up to ``concurrency`` TLS handshakes inside it.

``--watch`` also keeps a pod watch on the sample's selector open (from its listing to "done")
and decodes every event, as any controller's cache must: that variant tells how much of the gap
to the controller is the cost of watching its own writes (on the API server and in the
process), not the controller's logic.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

from bench.objects import GATE, PODS
from ungater._kube.adapter import connect

__all__ = ["main", "serve", "warm"]


def _patch(pod: dict[str, Any]) -> list[dict[str, Any]]:
    names = [g["name"] for g in pod["spec"].get("schedulingGates") or ()]
    path = f"/spec/schedulingGates/{names.index(GATE)}"
    return [{"op": "test", "path": f"{path}/name", "value": GATE}, {"op": "remove", "path": path}]


async def warm(client: Any, pods: list[dict[str, Any]], concurrency: int) -> None:
    """``concurrency`` GETs of the listed pods at once: as many pooled connections open as the
    patches will use, before the window opens (none without pods)."""
    if not pods:
        return
    async with anyio.create_task_group() as tg:
        for i in range(concurrency):
            meta = pods[i % len(pods)]["metadata"]
            tg.start_soon(client.get, PODS, meta["namespace"], meta["name"])


async def serve(
    client: Any,
    args: argparse.Namespace,
    read_line: Callable[[], Awaitable[str]],
    say: Callable[[str], None],
) -> None:
    """One sample per selector line, until the end of the input (or an empty line)."""
    while selector := (await read_line()).strip():
        await _sample(client, args, selector, read_line, say)


async def _sample(
    client: Any,
    args: argparse.Namespace,
    selector: str,
    read_line: Callable[[], Awaitable[str]],
    say: Callable[[str], None],
) -> None:
    pods, rv = await client.list_objects(PODS, args.namespace, selector)
    pods = [p for p in pods if GATE in str(p["spec"].get("schedulingGates"))]
    async with anyio.create_task_group() as watching:
        if args.watch:
            watching.start_soon(_watch, client, args.namespace, selector, rv)
        await warm(client, pods, args.concurrency)
        gc.collect()  # the last sample's garbage is not collected in this one's window
        say(f"ready {len(pods)}")
        await read_line()
        start = time.monotonic()
        slots = anyio.Semaphore(args.concurrency)

        async def one(pod: dict[str, Any]) -> None:
            async with slots:
                meta = pod["metadata"]
                await client.json_patch(PODS, meta["namespace"], meta["name"], _patch(pod))

        async with anyio.create_task_group() as tg:
            for pod in pods:
                tg.start_soon(one, pod)
        say(f"done {time.monotonic() - start:.6f}")
        watching.cancel_scope.cancel()


async def _watch(client: Any, namespace: str, selector: str, rv: str) -> None:
    """Decode every pod event of the selector until cancelled (one watch is enough here)."""
    events = 0
    async for _event in client.watch(PODS, namespace, rv, selector, 300, 300):
        events += 1


async def _main(args: argparse.Namespace) -> None:
    client = await connect(
        args.kubeconfig,
        qps=args.qps,
        burst=args.burst,
        pool_size=args.concurrency + 16,  # what `ungater run` asks for with one namespace
    )

    async def read_line() -> str:
        return await anyio.to_thread.run_sync(sys.stdin.readline)

    def say(line: str) -> None:
        print(line, flush=True)

    try:
        await serve(client, args, read_line, say)
    finally:
        await client.close()


def main() -> None:
    p = argparse.ArgumentParser(
        prog="python -m bench.raw",
        description="per line on stdin: a label selector, then any line to go",
    )
    p.add_argument("--kubeconfig", type=Path, required=True)
    p.add_argument("--namespace", required=True)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--qps", type=float, default=200.0)
    p.add_argument("--burst", type=int, default=400)
    p.add_argument("--watch", action="store_true", help="also watch the pods, as a cache would")
    anyio.run(_main, p.parse_args())


if __name__ == "__main__":
    main()
