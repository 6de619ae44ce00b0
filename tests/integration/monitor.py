"""Watches pods on the real API server and checks "live released <= cap" after every event."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio

from tests.integration.k8s import Kube
from tests.objects import GATE, PODS, gates_of


def live_released(pods: list[dict[str, Any]], gate: str = GATE) -> list[dict[str, Any]]:
    return [
        p
        for p in pods
        if gate not in gates_of(p)
        and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        and not p["metadata"].get("deletionTimestamp")
    ]


class CapMonitor:
    """Sees every pod event of a selector; records each moment the cap was exceeded."""

    def __init__(self, kube: Kube, ns: str, selector: str, cap: int, gate: str = GATE) -> None:
        self.kube, self.ns, self.selector, self.cap, self.gate = kube, ns, selector, cap, gate
        self.pods: dict[str, dict[str, Any]] = {}
        self.violations: list[str] = []
        self.max_seen = 0
        self.events = 0
        self.history: dict[str, list[dict[str, Any]]] = {}  # every state seen, by pod name
        self.synced = anyio.Event()

    def check(self) -> None:
        live = live_released(list(self.pods.values()), self.gate)
        self.max_seen = max(self.max_seen, len(live))
        if len(live) > self.cap:
            names = sorted(p["metadata"]["name"] for p in live)
            self.violations.append(f"{len(live)} released > cap {self.cap}: {names}")

    async def run(self) -> None:
        items, rv = await self.kube.client.list_objects(PODS, self.ns, self.selector)
        self.pods = {p["metadata"]["uid"]: p for p in items}
        for p in items:
            self.history.setdefault(p["metadata"]["name"], []).append(p)
        self.check()
        self.synced.set()
        for _ in range(1000):  # each watch lasts up to 60 s; tests are far shorter
            async for ev in self.kube.client.watch(PODS, self.ns, rv, self.selector, 60, 120):
                obj = ev["object"]
                rv = obj["metadata"]["resourceVersion"]
                if ev["type"] == "BOOKMARK":
                    continue
                self.events += 1
                if ev["type"] == "DELETED":
                    self.pods.pop(obj["metadata"]["uid"], None)
                else:
                    self.pods[obj["metadata"]["uid"]] = obj
                    self.history.setdefault(obj["metadata"]["name"], []).append(obj)
                self.check()

    def released(self) -> list[dict[str, Any]]:
        return live_released(list(self.pods.values()), self.gate)


@asynccontextmanager
async def monitoring(kube: Kube, ns: str, selector: str, cap: int) -> AsyncIterator[CapMonitor]:
    mon = CapMonitor(kube, ns, selector, cap)
    async with anyio.create_task_group() as tg:
        tg.start_soon(mon.run)
        with anyio.fail_after(10):
            await mon.synced.wait()
        try:
            yield mon
        finally:
            tg.cancel_scope.cancel()
    assert not mon.violations, mon.violations
