"""Watches pods on the real API server and checks "live released <= cap" after every event.

The cap may be one number for every pod seen, or one per owner (the pod's controller UID, or
for JobSet pods the JobSet UID label). The watch survives API server restarts: it relists and
goes on, so the invariant is checked through faults too. A failure of the monitor's own code
is not such a fault: it raises ``MonitorBroken`` out of ``monitoring``, so a test never goes on
believing the cap is checked when the checks stopped.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing, asynccontextmanager
from typing import Any

import anyio

from tests.integration.k8s import Kube
from tests.objects import GATE, PODS, controller_uid, gates_of


def live_released(pods: list[dict[str, Any]], gate: str = GATE) -> list[dict[str, Any]]:
    return [
        p
        for p in pods
        if gate not in gates_of(p)
        and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        and not p["metadata"].get("deletionTimestamp")
    ]


class MonitorBroken(Exception):
    """The monitor's own code failed on what it saw: its cap checks stopped."""


class CapMonitor:
    """Sees every pod event of a selector; records each moment a cap was exceeded."""

    def __init__(
        self,
        kube: Kube,
        ns: str,
        selector: str,
        cap: int | dict[str, int],
        owner_of: Callable[[dict[str, Any]], str] = controller_uid,
        gate: str = GATE,
    ) -> None:
        self.kube, self.ns, self.selector, self.cap, self.gate = kube, ns, selector, cap, gate
        self.owner_of = owner_of
        self.pods: dict[str, dict[str, Any]] = {}
        self.violations: list[str] = []
        self.max_seen = 0
        self.events = 0
        self.relists = 0
        self.history: dict[str, list[dict[str, Any]]] = {}  # every state seen, by pod name
        self.synced = anyio.Event()

    def cap_for(self, owner: str) -> int:
        return self.cap if isinstance(self.cap, int) else self.cap.get(owner, 0)

    def check(self) -> None:
        live = live_released(list(self.pods.values()), self.gate)
        self.max_seen = max(self.max_seen, len(live))
        if isinstance(self.cap, int):
            groups = {"": live}
        else:
            groups = defaultdict(list)
            for p in live:
                groups[self.owner_of(p)].append(p)
        for owner, pods in groups.items():
            cap = self.cap_for(owner)
            if len(pods) > cap:
                names = sorted(p["metadata"]["name"] for p in pods)
                self.violations.append(
                    f"{owner or 'all'}: {len(pods)} released > cap {cap}: {names}"
                )

    def _see(self, obj: dict[str, Any]) -> None:
        self.history.setdefault(obj["metadata"]["name"], []).append(obj)

    def _replace(self, items: list[dict[str, Any]]) -> None:
        try:
            self.pods = {p["metadata"]["uid"]: p for p in items}
            for p in items:
                self._see(p)
            self.relists += 1
            self.check()
        except Exception as exc:
            raise MonitorBroken(f"the monitor failed on a list: {exc!r}") from exc

    def _apply(self, ev: dict[str, Any]) -> str:
        """Apply one watch event and check the cap; the resourceVersion to resume from."""
        try:
            obj = ev["object"]
            rv = str(obj["metadata"]["resourceVersion"])
            if ev["type"] == "BOOKMARK":
                return rv
            self.events += 1
            if ev["type"] == "DELETED":
                self.pods.pop(obj["metadata"]["uid"], None)
            else:
                self.pods[obj["metadata"]["uid"]] = obj
                self._see(obj)
            self.check()
            return rv
        except Exception as exc:
            raise MonitorBroken(f"the monitor failed on a {ev.get('type')} event: {exc!r}") from exc

    async def _list(self) -> str:
        items, rv = await self.kube.client.list_objects(PODS, self.ns, self.selector)
        self._replace(items)
        return rv

    async def run(self) -> None:
        rv = await self._list()
        self.synced.set()
        for _ in range(1000):  # each round is one watch; bounded, and tests are far shorter
            try:
                stream: Any = self.kube.client.watch(PODS, self.ns, rv, self.selector, 60, 120)
                async with aclosing(stream):  # closed here, in this task, even on a failure
                    async for ev in stream:
                        rv = self._apply(ev)
            except MonitorBroken:
                raise  # its own failure: no relist hides it
            except Exception:  # the API server restarts under some tests: relist and go on
                await anyio.sleep(0.2)
                try:
                    rv = await self._list()
                except MonitorBroken:
                    raise
                except Exception:
                    continue
        raise MonitorBroken("the monitor ran out of watch rounds: its checks stopped")

    def released(self) -> list[dict[str, Any]]:
        return live_released(list(self.pods.values()), self.gate)


@asynccontextmanager
async def monitoring(
    kube: Kube, ns: str, selector: str, cap: int | dict[str, int], **kw: Any
) -> AsyncIterator[CapMonitor]:
    mon = CapMonitor(kube, ns, selector, cap, **kw)
    async with anyio.create_task_group() as tg:
        tg.start_soon(mon.run)
        with anyio.fail_after(10):
            await mon.synced.wait()
        try:
            yield mon
        finally:
            tg.cancel_scope.cancel()
    assert not mon.violations, mon.violations
