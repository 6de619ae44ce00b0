"""The demo's own stopwatch on the two gates.

Two watches (the demo namespace's pods and Workloads) note, on the demo process's monotonic
clock, when the demo first saw each Workload slice Admitted, each pod created and each gate gone
from each pod. The Admitted condition's ``lastTransitionTime`` has one-second resolution, too
coarse for releases that take tens of milliseconds; the times here are when the same watcher saw
each change, so the delay of the watch itself is on both sides of every difference. Kueue and
ungater are separate processes writing to the same API server: the demo only reads.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio

from ungater._kube.client import GoneError, KubeClient, Resource

__all__ = ["GateClock", "PodTimes", "wave_table"]

INDEX = "batch.kubernetes.io/job-completion-index"
JOB_UID = "batch.kubernetes.io/controller-uid"
#: each watch is re-opened after the server ends it; more than this many times in one demo
#: means something is wrong
MAX_RESTARTS = 50


@dataclass
class PodTimes:
    """One pod as the demo's watch saw it: when it appeared, when each gate went, when it was
    deleted (all on the demo's monotonic clock), and the gates it has now."""

    name: str
    index: int
    job_uid: str
    seen: float
    gates: frozenset[str]
    lifted: dict[str, float] = field(default_factory=dict)
    deleted: float | None = None


class GateClock:
    """Watches pods and Workloads of one namespace and times the gates of ``gates``."""

    def __init__(self, client: KubeClient, namespace: str, gates: tuple[str, ...]) -> None:
        self.c = client
        self.ns = namespace
        self.gates = gates
        self.pods: dict[str, PodTimes] = {}  # by uid
        self.admitted: dict[str, float] = {}  # Workload name: when the demo saw it Admitted
        self._changed = anyio.Event()

    async def run(self, pods: Resource, workloads: Resource) -> None:
        """Both watches, until cancelled."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._follow, pods, self._on_pod)
            tg.start_soon(self._follow, workloads, self._on_workload)

    async def _follow(self, resource: Resource, on: Callable[[dict[str, Any], str], None]) -> None:
        for _ in range(MAX_RESTARTS):
            items, rv = await self.c.list_objects(resource, self.ns)
            for obj in items:
                on(obj, "ADDED")
            self._notify()
            try:
                async for event in self.c.watch(resource, self.ns, rv, timeout_seconds=600):
                    if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                        on(event["object"], event["type"])
                        self._notify()
            except (GoneError, TimeoutError):  # too old, or silent: list again
                continue
        raise RuntimeError(f"the demo's watch of {resource.plural} ended too often")

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    def _on_pod(self, obj: dict[str, Any], kind: str) -> None:
        now = time.monotonic()
        meta = obj["metadata"]
        gates = frozenset(g["name"] for g in obj["spec"].get("schedulingGates") or ())
        pod = self.pods.get(meta["uid"])
        if pod is None:
            pod = self.pods[meta["uid"]] = PodTimes(
                name=meta["name"],
                index=int((meta.get("annotations") or {}).get(INDEX, -1)),
                job_uid=(meta.get("labels") or {}).get(JOB_UID, ""),
                seen=now,
                gates=gates,
            )
        pod.gates = gates
        for gate in self.gates:
            if gate not in gates:
                pod.lifted.setdefault(gate, now)
        if pod.deleted is None and (kind == "DELETED" or meta.get("deletionTimestamp")):
            pod.deleted = now

    def _on_workload(self, obj: dict[str, Any], kind: str) -> None:
        conditions = (obj.get("status") or {}).get("conditions") or ()
        if kind != "DELETED" and any(
            c.get("type") == "Admitted" and c.get("status") == "True" for c in conditions
        ):
            self.admitted.setdefault(obj["metadata"]["name"], time.monotonic())

    def live(self, job_uid: str) -> list[PodTimes]:
        """The Job's pods not deleted, by completion index."""
        mine = [p for p in self.pods.values() if p.job_uid == job_uid and p.deleted is None]
        return sorted(mine, key=lambda p: p.index)

    async def wait_for(self, done: Callable[[], bool], timeout: float = 60) -> bool:
        """Whether ``done()`` came to hold, checked after each change the watches saw, within
        ``timeout`` seconds."""
        with anyio.move_on_after(timeout):
            while not done():
                await self._changed.wait()
            return True
        return False


def _ms(t: float | None, zero: float) -> str:
    return "-" if t is None else f"{(t - zero) * 1000:+.0f}"


def wave_table(pods: list[PodTimes], zero: float, kueue_gate: str, our_gate: str) -> list[str]:
    """Rows of one release wave: per pod, when it appeared and when each gate went, in ms
    after ``zero`` (the moment the demo saw the slice admitted)."""
    rows = ["   index  pod                  pod seen  Kueue's gate off  ungater's gate off"]
    for p in pods:
        rows.append(
            f"   {p.index:>5}  {p.name:<20} {_ms(p.seen, zero):>8}  "
            f"{_ms(p.lifted.get(kueue_gate), zero):>16}  {_ms(p.lifted.get(our_gate), zero):>18}"
        )
    return rows
