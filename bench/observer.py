"""The harness's own watch on pods: when each pod was first seen, and first seen released.

Every latency the harness reports ends at a moment recorded here: the arrival (monotonic clock
of this process) of the first watch event showing a pod without the gate. Waiting is by owner
(the Job's UID label) or by pod UID, never by polling the API server.
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Collection
from typing import Any

import anyio

from bench.objects import CONTROLLER_UID, GATE, PODS
from ungater._kube.client import GoneError, KubeClient

__all__ = ["PodObserver"]

log = logging.getLogger(__name__)
_MAX_WATCHES = 10_000  # each lasts up to its timeout; far more than any run needs


def _gated(pod: dict[str, Any]) -> bool:
    gates = (pod.get("spec") or {}).get("schedulingGates") or ()
    return any(g.get("name") == GATE for g in gates)


class PodObserver:
    def __init__(self, client: KubeClient, namespace: str) -> None:
        self.client = client
        self.namespace = namespace
        self.gated: dict[str, bool] = {}  # uid -> still gated
        self.owner_of: dict[str, str] = {}
        self.seen_at: dict[str, float] = {}
        self.released_at: dict[str, float] = {}
        self.release_order: list[str] = []  # uids as first seen released: waiters read the tail
        self.released_by_owner: dict[str, list[float]] = defaultdict(list)
        self.pods_by_owner: dict[str, set[str]] = defaultdict(set)
        self.events = 0
        self.synced = anyio.Event()
        self._changed = anyio.Event()
        self._running = anyio.CancelScope()

    def __len__(self) -> int:
        return len(self.gated)

    def _apply(self, etype: str, pod: dict[str, Any], now: float) -> None:
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        owner = str((meta.get("labels") or {}).get(CONTROLLER_UID, ""))
        if etype == "DELETED":
            self.gated.pop(uid, None)
            self.pods_by_owner[owner].discard(uid)
            return
        gated = _gated(pod)
        was = self.gated.get(uid)
        self.gated[uid] = gated
        if was is None:
            self.seen_at.setdefault(uid, now)
            self.owner_of[uid] = owner
            self.pods_by_owner[owner].add(uid)
        if was and not gated and uid not in self.released_at:
            self.released_at[uid] = now
            self.release_order.append(uid)
            self.released_by_owner[owner].append(now)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    def stop(self) -> None:
        """End :meth:`run`: its watch costs the API server nothing more (what was seen stays)."""
        self._running.cancel()

    async def run(self) -> None:
        """List, then watch until cancelled or stopped; relist on 410 Gone."""
        with self._running:
            await self._watch()

    async def _watch(self) -> None:
        rv = ""
        for _ in range(_MAX_WATCHES):
            try:
                if not rv:
                    items, rv = await self.client.list_objects(PODS, self.namespace)
                    now = time.monotonic()
                    for pod in items:
                        self._apply("ADDED", pod, now)
                    self.synced.set()
                    self._notify()
                async for ev in self.client.watch(PODS, self.namespace, rv, "", 300, 120):
                    now = time.monotonic()
                    obj = ev.get("object") or {}
                    rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                    if ev.get("type") == "BOOKMARK":
                        continue
                    self.events += 1
                    self._apply(str(ev.get("type")), obj, now)
                    self._notify()
            except GoneError:
                rv = ""
            except (OSError, TimeoutError) as exc:
                log.warning("pod observer: watch failed (%r); retrying", exc)
                await anyio.sleep(0.2)

    async def _until(self, done: Callable[[], bool], timeout: float, what: str) -> None:
        try:
            with anyio.fail_after(timeout):
                while not done():
                    await self._changed.wait()
        except TimeoutError:
            raise TimeoutError(
                f"pod observer: timed out after {timeout}s waiting for {what}"
            ) from None

    async def released(self, uids: Collection[str], timeout: float) -> float:
        """Wait until every pod in ``uids`` is seen released; the moment the last one was."""
        remaining = set(uids).difference(self.released_at)
        read = len(self.release_order)

        def done() -> bool:
            # only the releases since the last look: a scan of every pod still waiting, per
            # wake-up, took the harness half a core at 100k pods, from the API server's share
            nonlocal read
            remaining.difference_update(self.release_order[read:])
            read = len(self.release_order)
            return not remaining

        await self._until(done, timeout, f"{len(uids)} pods released")
        return max((self.released_at[u] for u in uids), default=math.nan)

    async def owner_released(self, owner_uid: str, count: int, timeout: float) -> float:
        """Wait until ``count`` pods of an owner are seen released; when the last one was."""
        times = self.released_by_owner[owner_uid]
        await self._until(lambda: len(times) >= count, timeout, f"{count} released of {owner_uid}")
        return sorted(times)[count - 1]

    async def seen(self, uids: Collection[str], timeout: float) -> None:
        await self._until(lambda: all(u in self.gated for u in uids), timeout, "pods seen")

    async def empty(self, timeout: float) -> None:
        await self._until(lambda: not self.gated, timeout, "an empty namespace")
