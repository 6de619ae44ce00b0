"""The integration tests' cap monitor: it records every event of the test's pods, the namespace's
Workloads and the pods' owners, and judges each release against the cap the server's own
objects set at that moment: min(spec count, admitted count) of the owner's active slice, bounded
by the owner's own size (``capjudge``). No test states a cap: a test that admits more than it
should, or a release that comes before the admission that justifies it, is judged as the server
shows it.

The record is a ``record.Record``: a cut watch (the API server restarting under a test, a proxy
cutting connections) resumes from the last resourceVersion seen; a 410, an ``ERROR`` event,
running out of watch rounds or being stopped with the watch down is a gap, and a record with a
gap is never judged (``IncompleteHistory``), so a release hidden in it cannot pass unseen. A
failure of the record's own bookkeeping raises ``MonitorBroken`` out of ``monitoring`` at once.
On the way out of ``monitoring`` the record is brought up to the server's present
(``Record.finish``) before it is judged; the judgement fails on any release past the cap, and
on judging fewer releases than ``min_judged`` (a monitor that judged nothing proved nothing).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio

from bench.gapwatch import RecorderBroken
from bench.timeline import job_sizes, raycluster_sizes
from tests.integration.capjudge import Judgement, judge, released_by
from tests.integration.k8s import JOBSETS, RAYCLUSTERS
from tests.integration.record import Record
from tests.objects import GATE, JOBS, PODS, WORKLOADS, controller_uid
from ungater._kube.client import Resource

#: a failure of the monitor's own code: its record stopped being kept
MonitorBroken = RecorderBroken

SizeOf = Callable[[dict[str, Any]], dict[str, int]]


def live_released(pods: list[dict[str, Any]], gate: str = GATE) -> list[dict[str, Any]]:
    return released_by(pods, gate)


def job_size(job: dict[str, Any]) -> dict[str, int]:
    """What the Job controller keeps: min(parallelism, completions - succeeded), 0 suspended."""
    return dict(job_sizes(job))


def raycluster_size(rc: dict[str, Any]) -> dict[str, int]:
    """What KubeRay keeps: the head, and per worker group its replicas times its hosts."""
    return dict(raycluster_sizes(rc))


def jobset_size(js: dict[str, Any]) -> dict[str, int]:
    """Per replicated Job: replicas x min(parallelism, completions), 0 while suspended."""
    spec = js.get("spec") or {}
    out = {}
    for r in spec.get("replicatedJobs") or ():
        job = r["template"]["spec"]
        per_job = min(int(job.get("parallelism", 1)), int(job.get("completions", 1)))
        out[r["name"]] = 0 if spec.get("suspend") else int(r.get("replicas", 1)) * per_job
    return out


JOB_OWNERS: Mapping[Resource, SizeOf] = {JOBS: job_size}
JOBSET_OWNERS: Mapping[Resource, SizeOf] = {JOBSETS: jobset_size}
RAYCLUSTER_OWNERS: Mapping[Resource, SizeOf] = {RAYCLUSTERS: raycluster_size}


def _labels(pod: dict[str, Any]) -> dict[str, str]:
    return pod["metadata"].get("labels") or {}


def kueue_pod_set(pod: dict[str, Any]) -> str:
    """The pod set Kueue's webhook stamps, or ``main`` (a Job's only pod set) without one."""
    return _labels(pod).get("kueue.x-k8s.io/podset") or "main"


def jobset_uid(pod: dict[str, Any]) -> str:
    return _labels(pod).get("jobset.sigs.k8s.io/jobset-uid", "")


def ray_pod_set(pod: dict[str, Any]) -> str:
    """Kueue's pod set of a Ray pod: ``head``, or its worker group's name in lower case."""
    labels = _labels(pod)
    if labels.get("ray.io/node-type") == "head":
        return "head"
    return labels.get("ray.io/group", "").lower()


@dataclass
class CapMonitor(Record):
    """The record of one test's pods (``selector``), the namespace's Workloads and the owners'
    resources (``owners``: resource -> its own size per pod set), and its judgement."""

    selector: str
    owners: Mapping[Resource, SizeOf] = field(default_factory=lambda: dict(JOB_OWNERS))
    owner_of: Callable[[dict[str, Any]], str] = controller_uid
    pod_set_of: Callable[[dict[str, Any]], str] = kueue_pod_set
    gate: str = GATE
    violations: list[str] = field(default_factory=list)
    judged: int = 0  # releases the last judgement judged

    def __post_init__(self) -> None:
        self.sources.update({"pod": (PODS, self.selector), "workload": (WORKLOADS, "")})
        for res in self.owners:
            self.sources[res.plural] = (res, "")

    def judge(self) -> Judgement:
        """Judge the record as it is (``IncompleteHistory`` on a gap); keep the outcome."""
        sizes = {res.plural: size for res, size in self.owners.items()}
        found = judge(
            self.events,
            self.gaps,
            self.gate,
            owner_of_pod=self.owner_of,
            pod_set_of=self.pod_set_of,
            size_of=lambda resource, owner: sizes[resource](owner),
        )
        self.violations, self.judged = found.violations, found.judged
        return found

    async def verdict(self) -> list[str]:
        """Mid-test: bring the record up to the server's present, then judge it whole; the
        releases past the cap so far."""
        await self.finish()
        return self.judge().violations

    def released(self) -> list[dict[str, Any]]:
        """The live released pods as the record last showed them."""
        return live_released(list(self._known.get("pod", {}).values()), self.gate)

    @property
    def history(self) -> dict[str, list[dict[str, Any]]]:
        """Every state of each pod the record holds, by pod name, in the order received."""
        out: dict[str, list[dict[str, Any]]] = {}
        for ev in self.events:
            if ev.resource == "pod" and ev.kind != "DELETED":
                out.setdefault(ev.obj["metadata"]["name"], []).append(ev.obj)
        return out

    @property
    def max_seen(self) -> int:
        """The most live released pods of the selector at once, in resourceVersion order."""
        pods: dict[str, dict[str, Any]] = {}
        most = 0
        for ev in sorted((e for e in self.events if e.resource == "pod"), key=lambda e: e.rv):
            uid = ev.obj["metadata"]["uid"]
            if ev.kind == "DELETED":
                pods.pop(uid, None)
            else:
                pods[uid] = ev.obj
            most = max(most, len(live_released(list(pods.values()), self.gate)))
        return most


@asynccontextmanager
async def monitoring(
    kube: Any,
    ns: str,
    selector: str,
    *,
    owners: Mapping[Resource, SizeOf] = JOB_OWNERS,
    owner_of: Callable[[dict[str, Any]], str] = controller_uid,
    pod_set_of: Callable[[dict[str, Any]], str] = kueue_pod_set,
    gate: str = GATE,
    min_judged: int = 1,
) -> AsyncIterator[CapMonitor]:
    """Record while the body runs (from a complete first list of every source on); then bring
    the record to the present, judge it, and fail on a gap, on a release past the cap, or on
    fewer than ``min_judged`` releases judged."""
    mon = CapMonitor(
        kube,
        ns,
        selector,
        owners=dict(owners),
        owner_of=owner_of,
        pod_set_of=pod_set_of,
        gate=gate,
    )
    async with anyio.create_task_group() as tg:
        await mon.start(tg, dict(mon.sources))
        try:
            yield mon
            await mon.finish()
        finally:
            tg.cancel_scope.cancel()
    found = mon.judge()
    print(
        f"cap monitor: {found.judged} releases judged, {len(found.violations)} past the cap "
        f"({sum(mon.interruptions.values())} watch failures, {mon.recovered} revisions read "
        "back after a 410)"
    )
    assert not found.violations, found.violations
    assert found.judged >= min_judged, (
        f"the monitor judged {found.judged} releases (fewer than {min_judged}): it proved nothing"
    )
