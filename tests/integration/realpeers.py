"""Helpers for the tests on the real peers (Kueue, the KubeRay operator, the JobSet controller).

:class:`SliceWatch` records every event of the namespace's pods, Workloads and owners, then
replays them in resourceVersion order (one etcd: one order) and checks, at every moment ungater
released a pod, that the live pods without ungater's gate are within the active slice's cap and
the owner's own size.  It also counts, at the end of each step, what each releaser released:
ungater's gate (``UNGATER_GATE``, put in the templates by the tests) and Kueue's own
``kueue.x-k8s.io/elastic-job``, which the real Kueue removes itself: the default Kueue (v0.19.2,
or ``$UNGATER_KUEUE_VERSION``) with its ElasticJobUngater up to the admitted count, in pod name
order; v0.17.1, which the JobSet and audit tests ask for (``kueue_version`` marker), with its
alpha ElasticJobUngater, past the admitted count in some stories (kueue#11977).  The two counts
side by side are the differential record.

The record is judged only whole: it is a ``record.Record``, kept through ``bench.gapwatch``'s
loop (a 410, an ``ERROR`` event, running out of watch rounds or being stopped with the watch
down is a :class:`Gap`; a cut resumes), and ``replay()`` and ``excess()`` raise
:class:`IncompleteHistory` on any gap, naming it. The cap at each release comes from the
server's own slices and owner, through ``capjudge`` (the product's slice order); ``slice_watch``
ends the record at ``caught_up()``, judges it, and fails when it judged no release at all.
A failure of the recorder's own bookkeeping on an event raises :class:`RecorderBroken` out of the
watch task at once.
"""

from __future__ import annotations

import http.client
import json
import ssl
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import yaml
from anyio.abc import TaskGroup

from bench.gapwatch import Gap, IncompleteHistory, RecorderBroken, WatchSettings
from tests.integration.capjudge import (
    Event,
    is_live,
    judge,
    owner_slice,
    released_by,
    slice_caps,
)
from tests.integration.k8s import Kube
from tests.integration.record import Record
from tests.objects import PODS, WORKLOADS, controller_uid
from ungater._kube.client import Resource

__all__ = [
    "KUEUE_GATE",
    "UNGATER_GATE",
    "Event",
    "Excess",
    "Gap",
    "IncompleteHistory",
    "RecorderBroken",
    "SliceWatch",
    "StepRecord",
    "active_slice_of",
    "as_kueue",
    "chain_cap",
    "controller_uid",
    "elastic_raycluster",
    "gate_policy_in_force",
    "is_live",
    "kueue_pod_set",
    "ray_cluster_spec",
    "released_by",
    "slice_caps",
    "slice_watch",
]

UNGATER_GATE = "example.com/ungater"
KUEUE_GATE = "kueue.x-k8s.io/elastic-job"
SLICE_NAME = "kueue.x-k8s.io/workload-slice-name"
REPLACES = "kueue.x-k8s.io/workload-slice-replacement-for"

VAP = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
BINDINGS = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"


def as_kueue(plane: Any, method: str, path: str, body: Any, content_type: str) -> int:
    """One request under Kueue's own service account (its token from its kubeconfig)."""
    kubeconfig = yaml.safe_load(plane.peers.kubeconfigs["kueue"].read_text())
    token = kubeconfig["users"][0]["user"]["token"]
    context = ssl.create_default_context(cafile=str(plane.ca_path))
    conn = http.client.HTTPSConnection(
        "127.0.0.1", plane.apiserver_port, timeout=10, context=context
    )
    try:
        headers = {"Authorization": f"Bearer {token}", "Content-Type": content_type}
        conn.request(method, path, body=json.dumps(body).encode(), headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


@contextmanager
def gate_policy_in_force(
    plane: Any, ns: str, docs: Sequence[dict[str, Any]], probe_labels: dict[str, str]
) -> Iterator[None]:
    """Create admission policies and bindings (``docs``) and return once they are in force:
    a dry-run removal of Kueue's gate, under Kueue's account, from a probe pod in ``ns`` with
    ``probe_labels`` is refused (the API server loads a new policy a moment after it is
    created). Everything made is deleted on the way out."""
    probe_name = "policy-probe"
    probe = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": probe_name, "labels": probe_labels},
        "spec": {
            "schedulingGates": [{"name": KUEUE_GATE}],
            "containers": [{"name": "c", "image": "registry.invalid/probe:1"}],
        },
    }
    made: list[str] = []
    pod = f"/api/v1/namespaces/{ns}/pods/{probe_name}"
    try:
        for doc in docs:
            path = VAP if doc["kind"] == "ValidatingAdmissionPolicy" else BINDINGS
            status, body = plane.request("POST", path, doc)
            assert status == 201, body
            made.append(f"{path}/{doc['metadata']['name']}")
        status, body = plane.request("POST", f"/api/v1/namespaces/{ns}/pods", probe)
        assert status == 201, body
        made.append(pod)
        removal = [{"op": "remove", "path": "/spec/schedulingGates/0"}]
        for _ in range(120):  # 30 s at most
            code = as_kueue(
                plane, "PATCH", f"{pod}?dryRun=All", removal, "application/json-patch+json"
            )
            if code in (403, 422):
                break
            time.sleep(0.25)
        else:
            raise AssertionError("the admission policy was not in force after 30 s")
        plane.request("DELETE", pod)
        made.remove(pod)
        yield
    finally:
        for path in reversed(made):
            plane.request("DELETE", path)


def ray_cluster_spec(
    replicas: int,
    *,
    gates: Sequence[str] = (UNGATER_GATE,),
    autoscaling: bool = False,
    hosts: int | None = None,
) -> dict[str, Any]:
    """A RayCluster spec: a head and one worker group ``workers``, 1 CPU per pod, ``gates``
    in every pod template; ``autoscaling``: in-tree autoscaling on (KubeRay then deletes only
    the workers named in ``workersToDelete``, and Kueue counts workers only with it on)."""

    def template() -> dict[str, Any]:
        ray = {
            "name": "ray",
            "image": "registry.invalid/ray:2",
            "resources": {"requests": {"cpu": "1"}},
        }
        spec: dict[str, Any] = {"containers": [ray]}
        if gates:
            spec["schedulingGates"] = [{"name": g} for g in gates]
        return {"spec": spec}

    group: dict[str, Any] = {
        "groupName": "workers",
        "replicas": replicas,
        "minReplicas": 0,
        "maxReplicas": 20,
        "rayStartParams": {},
        "template": template(),
    }
    if hosts is not None:
        group["numOfHosts"] = hosts
    spec: dict[str, Any] = {
        "headGroupSpec": {"rayStartParams": {}, "template": template()},
        "workerGroupSpecs": [group],
    }
    if autoscaling:
        spec["enableInTreeAutoscaling"] = True
    return spec


def elastic_raycluster(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A RayCluster in the test's LocalQueue, marked elastic for Kueue."""
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {
            "name": name,
            "labels": {"kueue.x-k8s.io/queue-name": "user-queue"},
            "annotations": {"kueue.x-k8s.io/elastic-job": "true"},
        },
        "spec": spec,
    }


#: owner kind -> (resource, desired size per pod set of the raw object)
SizeOf = Callable[[dict[str, Any]], dict[str, int]]


def kueue_pod_set(pod: dict[str, Any]) -> str:
    """The pod set Kueue stamped on the pod's template."""
    return str(pod["metadata"].get("labels", {}).get("kueue.x-k8s.io/podset", ""))


def chain_cap(workloads: list[dict[str, Any]], owner_uid: str) -> dict[str, int] | None:
    """The caps of the slice that bounds the owner's pods (``capjudge.owner_slice``: the
    product's active slice, or the slice a not yet admitted replacement finished); ``None``
    when there is none."""
    bound = owner_slice(workloads, owner_uid)
    return slice_caps(bound) if bound is not None else None


def active_slice_of(workloads: list[dict[str, Any]], owner_uid: str) -> dict[str, Any] | None:
    """The owner's active slice as the product names it: the newest admitted slice, neither
    finished nor evicted (``capjudge.owner_slice`` without the hand-over)."""
    return owner_slice(workloads, owner_uid, handover=False)


#: the recorder's watch rounds per resource (``bench.gapwatch.WatchSettings``)
WATCH_ROUNDS = WatchSettings().rounds


@dataclass
class Excess:
    """A span, in resourceVersion order, during which one pod set of the owner had more live pods
    without a gate than its active slice admits (``limit``: min(spec count, admitted count) of
    the newest admitted slice that is neither finished nor evicted). ``start``/``end`` are when
    the watch received the events that opened and closed it (monotonic; ``end`` None: still
    open); ``released`` holds every set of live released pod names seen during it, in order."""

    workload: str
    pod_set: str
    limit: int
    start_rv: int
    start: float
    released: list[frozenset[str]] = field(default_factory=list)
    end_rv: int | None = None
    end: float | None = None

    def seconds(self, now: float | None = None) -> float:
        end = self.end if self.end is not None else (now or time.monotonic())
        return end - self.start

    def line(self) -> str:
        most = max(len(r) for r in self.released)
        until = f"rv {self.end_rv}" if self.end_rv is not None else "the end"
        return (
            f"{self.workload}/{self.pod_set}: up to {most} live released for {self.limit}, "
            f"rv {self.start_rv} to {until} (at {self.start:.2f}, {self.seconds():.2f}s)"
        )


@dataclass
class StepRecord:
    step: str
    admitted: dict[str, int]
    ungater: dict[str, int]
    kueue: dict[str, int]
    seconds: float  # until ungater's count matched what was admitted
    kueue_seconds: float | None  # until Kueue's did; None: not within the wait

    def line(self) -> str:
        kueue = (
            f"after {self.kueue_seconds:.1f}s"
            if self.kueue_seconds is not None
            else "NOT matched within the wait"
        )
        return (
            f"{self.step}: admitted {self.admitted}; ungater released {self.ungater} after "
            f"{self.seconds:.1f}s; Kueue released {self.kueue} {kueue}"
        )


@dataclass
class SliceWatch(Record):
    """The record of one owner's story (its pods, the namespace's Workloads, the owner's
    resource), judged whole by ``replay`` and ``excess``."""

    owner_res: Resource
    owner_uid: str
    size_of: SizeOf
    pod_set_of: Callable[[dict[str, Any]], str]
    owner_of_pod: Callable[[dict[str, Any]], str]
    steps: list[StepRecord] = field(default_factory=list)
    owner_name: str = ""
    kueue_excess: list[str] = field(default_factory=list)
    judged: int = 0  # releases of ungater's gate the last replay judged

    def __post_init__(self) -> None:
        self.sources.update(
            {"pod": (PODS, ""), "workload": (WORKLOADS, ""), "owner": (self.owner_res, "")}
        )

    async def record(self, tg: TaskGroup) -> None:
        """Start the three watches in ``tg``; return once each has listed."""
        await self.start(tg, dict(self.sources))

    # ------------------------------------------------------------------ replay
    def replay(self, gate: str = UNGATER_GATE) -> list[str]:
        """Replay every event in resourceVersion order; at each moment a pod lost ``gate``
        (was released), check the live released pods of its pod set against the cap the
        server's slices and the owner set then (``capjudge.judge``). Returns the moments it was
        exceeded, and keeps how many releases it judged in ``judged`` (for ungater's gate);
        raises ``IncompleteHistory`` when the record has a gap."""
        found = judge(
            self.events,
            self.gaps,
            gate,
            owner_of_pod=self.owner_of_pod,
            pod_set_of=self.pod_set_of,
            size_of=lambda _resource, owner: self.size_of(owner),
            only_owner=self.owner_uid,
        )
        if gate == UNGATER_GATE:
            self.judged = found.judged
        return found.violations

    def excess(self, gate: str = KUEUE_GATE) -> list[Excess]:
        """Replay every event in resourceVersion order and return the spans during which a pod
        set had more live pods without ``gate`` than the owner's active slice admits, whoever
        removed the gate (a span ends when the count is back within the limit, or the active
        slice changes); raises :class:`IncompleteHistory` when the record has a gap."""
        self.check_complete()
        pods: dict[str, dict[str, Any]] = {}
        workloads: dict[str, dict[str, Any]] = {}
        open_: dict[str, Excess] = {}
        out: list[Excess] = []
        seen: set[tuple[int, str]] = set()
        for ev in sorted(self.events, key=lambda e: e.rv):
            uid = ev.obj["metadata"]["uid"]
            if (ev.rv, uid) in seen or ev.resource == "owner":
                continue
            seen.add((ev.rv, uid))
            if ev.resource == "workload":
                target = workloads
            elif self.owner_of_pod(ev.obj) == self.owner_uid:
                target = pods
            else:
                continue
            if ev.kind == "DELETED":
                target.pop(uid, None)
            else:
                target[uid] = ev.obj
            active = active_slice_of(list(workloads.values()), self.owner_uid)
            caps = slice_caps(active) if active is not None else {}
            name = active["metadata"]["name"] if active is not None else ""
            released: dict[str, set[str]] = {}
            for p in released_by(list(pods.values()), gate):
                released.setdefault(self.pod_set_of(p), set()).add(p["metadata"]["name"])
            for pod_set in sorted(set(open_) | set(caps)):
                names = frozenset(released.get(pod_set, ()))
                over = pod_set in caps and len(names) > caps[pod_set]
                current = open_.get(pod_set)
                if current is not None and (not over or current.workload != name):
                    current.end_rv, current.end = ev.rv, ev.at
                    out.append(open_.pop(pod_set))
                    current = None
                if not over:
                    continue
                if current is None:
                    current = open_[pod_set] = Excess(name, pod_set, caps[pod_set], ev.rv, ev.at)
                if not current.released or current.released[-1] != names:
                    current.released.append(names)
        out.extend(open_.values())
        return sorted(out, key=lambda x: x.start_rv)

    # ------------------------------------------------------------------ steps
    async def counts(self) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
        """Now, from a fresh list: (admitted = min(cap, size), ungater's, Kueue's released)."""
        pods = [
            p for p in await self.kube.list(PODS, self.ns) if self.owner_of_pod(p) == self.owner_uid
        ]
        workloads = await self.kube.list(WORKLOADS, self.ns)
        owner = await self.kube.get(self.owner_res, self.ns, self.owner_name)
        caps = chain_cap(workloads, self.owner_uid) or {}
        sizes = self.size_of(owner) if owner is not None else {}
        admitted = {ps: min(caps.get(ps, 0), n) for ps, n in sizes.items()}
        ours: dict[str, int] = {ps: 0 for ps in sizes}
        theirs: dict[str, int] = {ps: 0 for ps in sizes}
        for p in released_by(pods, UNGATER_GATE):
            ours[self.pod_set_of(p)] = ours.get(self.pod_set_of(p), 0) + 1
        for p in released_by(pods, KUEUE_GATE):
            theirs[self.pod_set_of(p)] = theirs.get(self.pod_set_of(p), 0) + 1
        return admitted, ours, theirs

    async def settle(
        self,
        step: str,
        *,
        timeout: float = 60,
        expect: dict[str, int] | None = None,
        kueue_wait: float = 5.0,
    ) -> StepRecord:
        """Wait until ungater's released count equals what is admitted (and ``expect`` if
        given) and stays so for a moment; record the step with Kueue's count beside it."""
        started = time.monotonic()
        deadline = started + timeout
        stable_since: float | None = None
        last: tuple[dict[str, int], dict[str, int], dict[str, int]] = ({}, {}, {})
        for _ in range(int(timeout / 0.1) + 10):
            last = await self.counts()
            admitted, ours, _ = last
            good = ours == admitted and (expect is None or admitted == expect)
            now = time.monotonic()
            if good:
                stable_since = stable_since or now
                if now - stable_since >= 1.0:
                    break
            else:
                stable_since = None
            if now > deadline:
                raise AssertionError(
                    f"step {step!r}: admitted {admitted} (expected {expect}), ungater released "
                    f"{ours}, Kueue released {last[2]} after {timeout}s"
                )
            await anyio.sleep(0.1)
        admitted, ours, theirs = last
        seconds = time.monotonic() - started - 1.0
        kueue_seconds: float | None = seconds if theirs == admitted else None
        # Kueue's own gate: how long until it released as much (it reacts to job and Workload
        # events, not to pods), bounded so that a stall costs a test at most a few seconds
        for _ in range(int(kueue_wait / 0.2) + 1):
            if kueue_seconds is not None or time.monotonic() - started > seconds + 1 + kueue_wait:
                break
            await anyio.sleep(0.2)
            _, _, theirs = await self.counts()
            if theirs == admitted:
                kueue_seconds = time.monotonic() - started - 1.0
        record = StepRecord(step, admitted, ours, theirs, seconds, kueue_seconds)
        self.steps.append(record)
        print(record.line())
        return record


@asynccontextmanager
async def slice_watch(
    kube: Kube,
    ns: str,
    owner_res: Resource,
    owner: dict[str, Any],
    *,
    size_of: SizeOf,
    pod_set_of: Callable[[dict[str, Any]], str],
    owner_of_pod: Callable[[dict[str, Any]], str],
) -> AsyncIterator[SliceWatch]:
    watch = SliceWatch(
        kube,
        ns,
        owner_res,
        owner["metadata"]["uid"],
        size_of,
        pod_set_of,
        owner_of_pod,
        owner_name=owner["metadata"]["name"],
    )
    async with anyio.create_task_group() as tg:
        await watch.record(tg)
        try:
            yield watch
            # the record ends with everything written so far, not what a fixed wait caught
            await watch.finish()
        finally:
            tg.cancel_scope.cancel()
    kueue = watch.replay(KUEUE_GATE)
    for line in kueue:
        print(f"differential: Kueue over its cap: {line}")
    watch.kueue_excess = kueue
    violations = watch.replay(UNGATER_GATE)
    assert not violations, violations
    assert watch.judged > 0, "the replay judged no release of ungater's gate: it proves nothing"
    print(f"slice watch: {watch.judged} releases of ungater's gate judged, none past the cap")
