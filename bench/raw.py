"""The raw baseline: remove the gate from N pods with ungater's client, and nothing else.

Run as a separate process (``python -m bench.raw``), as the controller is: it lists the pods of
a selector, says ``ready N`` on stdout, waits for a line on stdin, then sends one guarded JSON
patch per pod (the controller's exact patch) through ``ungater._kube.adapter.connect`` with the same
QPS, burst, pool size and patch concurrency as the controller, and says ``done SECONDS``.

``--watch`` also keeps a pod watch on the selector open and decodes every event, as any
controller's cache must: that variant tells how much of the gap to the controller is the cost
of watching its own writes (on the API server and in the process), not the controller's logic.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import anyio

from bench.objects import GATE, PODS
from ungater._kube.adapter import connect

__all__ = ["main", "release_all"]


def _patch(pod: dict[str, Any]) -> list[dict[str, Any]]:
    names = [g["name"] for g in pod["spec"].get("schedulingGates") or ()]
    path = f"/spec/schedulingGates/{names.index(GATE)}"
    return [{"op": "test", "path": f"{path}/name", "value": GATE}, {"op": "remove", "path": path}]


async def release_all(args: argparse.Namespace) -> None:
    client = await connect(
        args.kubeconfig,
        qps=args.qps,
        burst=args.burst,
        pool_size=args.concurrency + 16,  # what `ungater run` asks for with one namespace
    )
    try:
        pods, rv = await client.list_objects(PODS, args.namespace, args.selector)
        pods = [p for p in pods if GATE in str(p["spec"].get("schedulingGates"))]
        async with anyio.create_task_group() as watching:
            if args.watch:
                watching.start_soon(_watch, client, args, rv)
            print(f"ready {len(pods)}", flush=True)
            await anyio.to_thread.run_sync(sys.stdin.readline)
            start = time.monotonic()
            slots = anyio.Semaphore(args.concurrency)

            async def one(pod: dict[str, Any]) -> None:
                async with slots:
                    meta = pod["metadata"]
                    await client.json_patch(PODS, meta["namespace"], meta["name"], _patch(pod))

            async with anyio.create_task_group() as tg:
                for pod in pods:
                    tg.start_soon(one, pod)
            print(f"done {time.monotonic() - start:.6f}", flush=True)
            watching.cancel_scope.cancel()
    finally:
        await client.close()


async def _watch(client: Any, args: argparse.Namespace, rv: str) -> None:
    """Decode every pod event of the selector until cancelled (one watch is enough here)."""
    events = 0
    async for _event in client.watch(PODS, args.namespace, rv, args.selector, 300, 300):
        events += 1


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.raw")
    p.add_argument("--kubeconfig", type=Path, required=True)
    p.add_argument("--namespace", required=True)
    p.add_argument("--selector", required=True)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--qps", type=float, default=200.0)
    p.add_argument("--burst", type=int, default=400)
    p.add_argument("--watch", action="store_true", help="also watch the pods, as a cache would")
    anyio.run(release_all, p.parse_args())


if __name__ == "__main__":
    main()
