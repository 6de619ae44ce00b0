"""The whole controller against random histories on the honest fake API server.

A small world model plays Kueue, the Job and JobSet controllers, the kubelet, another releaser
and the network: owners are admitted, grow (owner size first, a replacement slice later: the
old slice is finished a step before the new one is admitted) and shrink (owner size first, its
victims, gated or released, deleted afterwards, the slice's count lowered in place later, and
the owner may grow back at once); released pods fail and are replaced, gated ones are deleted
now and then and recreated; another writer removes our gate now and then (as Kueue's own
ungater would, within the cap); watches are delayed per stream, one stream of one replica is
slow, one replica's pod or Workload watch is held now and then, and watches are cut, expired
with 410 Gone and stalled; pod patches are refused (403/422), fail
(500) or time out, landing at once, after the client gave up, or never; and leadership moves
between replicas (two or more ``Controller`` instances on the same fake, each with its own
client, watches and ``LeaderElector``): a clean hand-over (stop, then the Lease handed back) or
a crash (the standby waits out the Lease), after which a new standby starts.

The promise is checked after EVERY write the fake commits (``FakeKube.observers``), not only
after our patches: per owner, live released pods <= min(the active slice's admitted and spec
counts, the owner's size), the bound being 0 between a slice's Finished and the next admission
(except, for a release decided while its replica's Workload cache did not show that Finished
yet, min(the old slice's cap, the replacement's count): no releaser can close that window, and
Kueue still holds the old slice's quota; docs/testing.md).
Only a write of the world can leave pods above a lowered bound (the owner shrinks before its
controller deletes the victims; a slice finishes under running pods); that excess may only
shrink. A release of ours is excused only when its request reached the server before the bound
went down (no releaser can see the future), or when releases by the other releaser that the
deciding replica's pod view had not shown when it decided account for the excess: the view
(its kind's pod index, or the quorum list it decided on) was older than that write, as read at
the decision itself (``Reconciler.on_decision``). A release the view showed, or any other view
of that replica had shown (its ``foreign_seen``), must have been counted, however recent. At
the end, with the world quiet, every owner must be released exactly to its bound.

Everything runs on a virtual clock (``VirtualTimeLoop``): the world's pauses, the watch delays,
the controller's expectations, backoffs and leases. A seed replays the same world, and a loaded
machine cannot change what the controller sees, only how long the run takes.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest
import ungater_plugins.job as job_plugin
import ungater_plugins.jobset as jobset_plugin

from tests.fakekube import Committed, FakeKube, PatchFault, VirtualTimeLoop, WatchLag
from tests.objects import JOBS, WORKLOADS
from tests.unit.podfactory import (
    GATE,
    NAMESPACE,
    job,
    job_pod,
    jobset,
    jobset_child_job,
    workload,
)
from ungater._controller.controller import Controller
from ungater._controller.reconciler import Reconciler
from ungater._controller.state import KindRuntime
from ungater._decide.decision import PodFacts
from ungater._kube.client import PODS, Resource
from ungater._kube.leader import LeaderElector
from ungater._model.config import Config
from ungater._model.views import FINISHED, ObjectRef
from ungater._plugins.registry import PluginRegistry

JOBSETS = Resource("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet")
COMPLETIONS = 20
KNOWN = 1 << 62  # a pod the deciding replica knew released, whatever its deciding view showed
MAX_SIZE = 7
# CI runs the first 40 (~20 s); `make world SEEDS=200` runs more (WORLD_SEEDS)
SEEDS = range(int(os.environ.get("WORLD_SEEDS", "40")))
# the seeds of the first 40 in which a controller that stops counting the pods it saw the
# other releaser release breaches the cap (17 of the first 200, with PYTHONHASHSEED=0)
PLANTED_SEEDS = (3, 15, 20, 22, 35, 38, 39)
STEPS = 80
VICTIMS_AFTER = 0.25  # s from a shrink to the owner controller's first deletion
LAG = 0.6  # s: one watch stream of one replica of each world is this much behind the others
# s: how late an owner's shrink may reach a replica's owner watch (the per-event delay, a
# reconnect's backoff; plus LAG on the replica whose owner stream is the slow one): a release
# decided on the owner's size as that replica saw it is not held against it for this long.
# Kueue's writes (a slice lowered in place, finished) get no such allowance: the controller
# must fence on them.
OWNER_SEEN = 0.03 + 0.05
CONVERGE = 20.0  # virtual s for the quiet world to be released exactly to its bounds
LEASE = (1.0, 0.8, 0.1)  # s: lease duration, renew deadline, retry period (a crash costs 1 s)


def now() -> float:
    return anyio.current_time()


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("asyncio", {"loop_factory": VirtualTimeLoop})


@dataclass
class Slice:
    seed: str
    created: int
    spec: int
    admitted: int | None = None
    finished: bool = False
    replaces: str | None = None
    name: str = ""


@dataclass
class Owner:
    """One elastic owner as the world knows it: the truth the controller must respect."""

    kind: str  # "job" or "jobset"
    obj: dict[str, Any]  # the Job, or the JobSet
    pod_job: dict[str, Any]  # the Job whose pods these are (the JobSet's child Job)
    pod_set: str
    size: int
    slices: list[Slice] = field(default_factory=list)
    cap: int = 0  # min(spec, admitted) of the active slice; 0 while there is none
    serial: int = 0
    shrunk_at: float = float("-inf")
    allowed: int = 0  # excess over the bound left by the world's own writes (only shrinks)
    # between the old slice's Finished and its replacement's admission: the old slice's name
    # and min(its cap, the replacement's count), the bound of a release decided on the old one
    handover: tuple[str, int] | None = None
    # the pods the other releaser released (by UID): the resourceVersion of its write
    foreign: dict[str, int] = field(default_factory=dict)
    # (resourceVersion of the write, time, cap, size) after every change of cap or size
    bounds: list[tuple[int, float, int, int]] = field(default_factory=list)

    @property
    def uid(self) -> str:
        return str(self.pod_job["metadata"]["uid"])

    @property
    def bound(self) -> int:
        return min(self.cap, self.size)

    def believable(
        self, sent_rv: int, sent_at: float, seen: float = OWNER_SEEN, cap: int | None = None
    ) -> int:
        """The highest bound a releaser could hold when its request reached the server: the
        cap as of that moment (every write up to ``sent_rv`` came first; Kueue's writes get no
        allowance; ``cap``, when given, instead), and the largest size the owner had within
        ``seen`` seconds before it."""
        at, sizes = 0, []
        for rv, t, c, size in self.bounds:  # in order of the writes
            if rv > sent_rv:
                break
            at = c
            if t <= sent_at - seen:
                sizes = [size]  # the size at the start of the window
            else:
                sizes.append(size)
        return min(at if cap is None else cap, max(sizes, default=0))


def gated(pod: dict[str, Any]) -> bool:
    return GATE in [g["name"] for g in pod["spec"].get("schedulingGates") or []]


def live(pod: dict[str, Any]) -> bool:
    return pod["status"]["phase"] not in ("Succeeded", "Failed") and not pod["metadata"].get(
        "deletionTimestamp"
    )


def index_of(pod: dict[str, Any]) -> int:
    return int(pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"])


def release_key(c: Committed) -> tuple[str, str]:
    """A release patch's pod UID and the resourceVersion it tests (the pod's before it): what
    ties its write, a late landing included, to the decision that chose it."""
    return c.obj["metadata"]["uid"], str((c.old or {}).get("metadata", {}).get("resourceVersion"))


def owner_uid(pod: dict[str, Any] | None) -> str:
    labels = ((pod or {}).get("metadata") or {}).get("labels") or {}
    return str(labels.get("batch.kubernetes.io/controller-uid", ""))


class World:
    def __init__(self, fake: FakeKube, rng: random.Random) -> None:
        self.fake = fake
        self.rng = rng
        self.owners: list[Owner] = []
        self.violations: list[str] = []
        self.log: list[str] = []
        self.checks = 0
        self.foreign_pods: set[str] = set()  # released by the other releaser
        self.slow: tuple[str, str] = ("", "")  # the slow stream: (plural, client)
        self.replicas: dict[str, Replica] = {}  # by name, every replica started
        fake.observers.append(self.audit)

    def owner_seen(self, by: str) -> float:
        """How long an owner's shrink may take to reach the replica that wrote ``by``."""
        plural, client = self.slow
        slow = plural in ("jobs", "jobsets") and by.partition(":")[2] == client
        return OWNER_SEEN + (LAG if slow else 0.0)

    # -- reading the truth ---------------------------------------------------------------------

    def pods(self, o: Owner) -> list[dict[str, Any]]:
        return [
            p
            for p in self.fake.objects.values()
            if p.get("kind") == "Pod" and owner_uid(p) == o.uid
        ]

    def released_live(self, o: Owner) -> int:
        return sum(1 for p in self.pods(o) if live(p) and not gated(p))

    def audit(self, c: Committed) -> None:
        """After every committed write: judge each change of an owner's excess over its bound
        (see the module docstring)."""
        self.checks += 1
        t = now()
        ours = c.by.startswith(("patch:", "late:"))
        released = (
            c.plural == "pods"
            and c.old is not None
            and gated(c.old)
            and not gated(c.obj)
            and live(c.obj)
        )
        for o in self.owners:
            excess = self.released_live(o) - o.bound
            if excess <= o.allowed:
                o.allowed = max(0, excess)
                continue
            if not (ours and released and owner_uid(c.obj) == o.uid):
                o.allowed = excess  # the world lowered the bound under released pods
                continue
            unseen = self.unseen_foreign(o, c)
            n = excess + o.bound
            sent = (c.sent_rv or 0, c.sent_at or 0.0)  # always set on a patch's commit
            could = o.believable(*sent, self.owner_seen(c.by), self.handover_cap(o, c))
            if n <= could + unseen:
                o.allowed = excess  # within what it could know when it decided and sent it
                continue
            self.violations.append(
                f"t={t:.3f} rv={c.rv}: {c.by} released {c.obj['metadata']['name']} "
                f"(sent at {c.sent_at:.3f}): {o.kind} {o.obj['metadata']['name']} has "
                f"{n} released live pods, bound {o.bound} (cap {o.cap}, size {o.size}); could "
                f"know {could}; the other releaser's releases it had not seen {unseen} of "
                f"{self.foreign_counted(o)}; hand-over {o.handover}; lags "
                f"{[(x.plural, x.client, x.selector, x.delay) for x in self.fake._lags]}; bounds "
                f"{[(rv, round(bt, 3), bc, bs) for rv, bt, bc, bs in o.bounds[-4:]]}; history: {self.log[-12:]}"
            )
            o.allowed = excess  # one report per breach

    def foreign_counted(self, o: Owner) -> dict[str, int]:
        """The other releaser's releases of ``o`` that count now (live and released): pod UID
        to the resourceVersion of its write."""
        counted = {p["metadata"]["uid"] for p in self.pods(o) if live(p) and not gated(p)}
        return {uid: rv for uid, rv in o.foreign.items() if uid in counted}

    def unseen_foreign(self, o: Owner, c: Committed) -> int:
        """How many of the other releaser's releases that count now (live and released) the
        replica that made our release ``c`` had not seen when it DECIDED that release: its
        view of the pod (the deciding kind's pod index, or the quorum list it decided on) was
        older than the other releaser's write, or did not hold the pod. Only those can excuse
        an excess: a release it had seen is one the decision had to count, however recent.
        0 for a write of ours no recorded decision made (``Replica.pods_seen``)."""
        replica = self.replicas.get(c.by.partition(":")[2])
        seen = replica.pods_seen.get(release_key(c)) if replica is not None else None
        if seen is None:
            return 0
        return sum(1 for uid, rv in self.foreign_counted(o).items() if seen.get(uid, -1) < rv)

    def handover_cap(self, o: Owner, c: Committed) -> int | None:
        """The cap of a release of ours that lands between the old slice's Finished and its
        replacement's admission, if its replica's Workload cache had not shown the Finished
        when it decided that release: min(the old slice's cap, the replacement's count),
        quota Kueue still holds. None (the cap as of the request's arrival, 0 once the
        Finished was written) for any other release, in particular one decided on a cache
        that showed the Finished."""
        if o.handover is None:
            return None
        old, cap = o.handover
        replica = self.replicas.get(c.by.partition(":")[2])
        if replica is None or release_key(c) not in replica.finished_seen:
            return None
        return None if old in replica.finished_seen[release_key(c)] else cap

    def record(self, o: Owner, rv: int | None = None) -> None:
        """Note a change of ``o``'s cap or size, made visible by the next write (or ``rv``)."""
        o.bounds.append((self.fake.rv + 1 if rv is None else rv, now(), o.cap, o.size))

    # -- the owners' controllers ------------------------------------------------------------

    def add_job(self, name: str, size: int) -> Owner:
        j = self.fake.put(JOBS, job(name, parallelism=size, completions=COMPLETIONS))
        o = Owner("job", j, j, "main", size)
        self.record(o, self.fake.rv)
        self.owners.append(o)
        self.sync_pods(o)
        return o

    def add_jobset(self, name: str, size: int) -> Owner:
        js = jobset(name, {"workers": 1})
        js["spec"]["replicatedJobs"][0]["template"]["spec"] = {
            "parallelism": size,
            "completions": COMPLETIONS,
        }
        js = self.fake.put(JOBSETS, js)
        child = jobset_child_job(js, "workers", 0, parallelism=size)
        child["spec"]["completions"] = COMPLETIONS
        child = self.fake.put(JOBS, child)
        o = Owner("jobset", js, child, "workers", size)
        self.record(o, self.fake.rv)
        self.owners.append(o)
        self.sync_pods(o)
        return o

    def resize(self, o: Owner, size: int) -> None:
        if size < o.size:
            o.shrunk_at = now()
        o.size = size
        self.record(o)  # before the write: the audit of that write sees it
        if o.kind == "job":
            o.obj["spec"]["parallelism"] = size
            o.obj = o.pod_job = self.fake.put(JOBS, o.obj)
        else:
            o.obj["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"] = size
            o.obj = self.fake.put(JOBSETS, o.obj)
            o.pod_job["spec"]["parallelism"] = size
            o.pod_job = self.fake.put(JOBS, o.pod_job)

    def sync_pods(self, o: Owner, gradual: bool = True) -> None:
        """The Job controller: finalize ended pods, delete extra ones (``gradual``: one at a
        time, and not at once after a shrink), create missing ones."""
        pods = self.pods(o)
        for p in pods:
            if not live(p):
                self.fake.finalize(PODS, NAMESPACE, p["metadata"]["name"])
                self.fake.delete(PODS, NAMESPACE, p["metadata"]["name"])
        active = [p for p in pods if live(p)]
        extra = len(active) - o.size
        if extra > 0 and gradual:
            extra = 1 if now() - o.shrunk_at >= VICTIMS_AFTER else 0
        if extra > 0:
            # its own choice of victims, released ones first as often as not
            if self.rng.random() < 0.5:
                active.sort(key=gated)
            else:
                self.rng.shuffle(active)
            for p in active[:extra]:
                self.fake.delete(PODS, NAMESPACE, p["metadata"]["name"])  # terminating
        taken = {index_of(p) for p in active}
        missing = [i for i in range(COMPLETIONS) if i not in taken][: max(0, -extra)]
        for i in missing:
            o.serial += 1
            self.fake.put(PODS, job_pod(o.pod_job, index=i, created=o.serial, seed=str(o.serial)))

    # -- Kueue ----------------------------------------------------------------------------------

    def write_slice(self, o: Owner, s: Slice) -> None:
        raw = workload(
            o.obj,
            {o.pod_set: s.spec},
            admitted=None if s.admitted is None else {o.pod_set: s.admitted},
            created=s.created,
            finished=s.finished,
            replacement_for=s.replaces,
            seed=s.seed,
        )
        s.name = raw["metadata"]["name"]
        self.fake.put(WORKLOADS, raw)

    def kueue(self, o: Owner) -> str:
        """One step of Kueue for ``o``: admit (the first slice maybe partially), finish the old
        slice and then admit its replacement, create a replacement for a grown owner, or lower
        the active slice's count in place for a shrunk one."""
        active = next((s for s in reversed(o.slices) if s.admitted and not s.finished), None)
        pending = o.slices[-1] if o.slices and o.slices[-1].admitted is None else None
        if pending is not None:
            if active is not None and pending.replaces is not None:
                active.finished = True  # a few ms before the new one is admitted
                # no active slice: nothing may be newly released, but by a releaser whose
                # cache has not shown the Finished yet, within quota Kueue still holds
                o.handover = (active.name, min(o.cap, pending.spec))
                o.cap = 0
                self.record(o)
                self.write_slice(o, active)
                return "finish old slice"
            first = pending.replaces is None
            pending.admitted = self.rng.randint(max(1, pending.spec // 2), pending.spec)
            if not first:
                pending.admitted = pending.spec  # a replacement is admitted whole
            o.cap = min(pending.spec, pending.admitted)
            o.handover = None
            self.record(o)
            self.write_slice(o, pending)
            return f"admit {pending.admitted} of {pending.spec}"
        if active is None:
            return "idle"
        if o.size > active.spec:
            n = len(o.slices)
            s = Slice(f"s{n}", 10 * n, o.size, replaces=f"{NAMESPACE}/{active.name}")
            o.slices.append(s)
            self.write_slice(o, s)
            return f"replacement slice {o.size}"
        if o.size < active.spec and sum(1 for p in self.pods(o) if live(p)) <= o.size:
            # only once the owner's controller has deleted its extra pods
            active.spec = o.size  # status.admission keeps the old count
            o.cap = min(active.spec, active.admitted or 0)
            self.record(o)
            self.write_slice(o, active)
            return f"lower in place to {o.size}"
        return "idle"

    def start(self, o: Owner) -> None:
        s = Slice("", 0, o.size)
        o.slices.append(s)
        self.write_slice(o, s)

    # -- another releaser -------------------------------------------------------------------

    def foreign_release(self, o: Owner) -> str:
        """Another releaser (Kueue's own ungater) removes our gate from one gated pod, only
        while the truth has room for it."""
        if self.released_live(o) >= o.bound:
            return "foreign writer: no room"
        waiting = [p for p in self.pods(o) if live(p) and gated(p)]
        if not waiting:
            return "foreign writer: nothing gated"
        p = self.rng.choice(waiting)
        written = self.fake.foreign_release(NAMESPACE, p["metadata"]["name"], GATE)
        assert written is not None  # gated and live in the truth just now
        o.foreign[p["metadata"]["uid"]] = int(written["metadata"]["resourceVersion"])
        self.foreign_pods.add(p["metadata"]["name"])
        return f"foreign writer released {index_of(p)}"

    # -- one random step ----------------------------------------------------------------------

    def step(self, faults: Faults) -> str:
        o = self.rng.choice(self.owners)
        # no resize while a slice is pending or the last shrink's pods are still going
        steady = (not o.slices or o.slices[-1].admitted is not None) and sum(
            1 for p in self.pods(o) if live(p)
        ) <= o.size
        roll = self.rng.random()
        if roll < 0.25:
            return self.kueue(o)
        if roll < 0.33 and o.size < MAX_SIZE and (steady or self.rng.random() < 0.5):
            # half the time also while the last shrink's victims are still going
            self.resize(o, self.rng.randint(o.size + 1, MAX_SIZE))
            self.sync_pods(o)
            return f"scale up to {o.size}"
        if roll < 0.5 and steady and o.size > 1:
            self.resize(o, self.rng.randint(1, o.size - 1))
            return f"scale down to {o.size}"  # its pods go in later job controller steps
        if roll < 0.58:
            running = [p for p in self.pods(o) if live(p) and not gated(p)]
            if running:
                p = self.rng.choice(running)
                p["status"]["phase"] = "Failed"
                self.fake.put(PODS, p)
                return f"pod {index_of(p)} failed"
        if roll < 0.76:
            self.sync_pods(o)
            return "job controller"
        if roll < 0.82:
            for p in self.pods(o):
                if live(p) and not gated(p) and p["status"]["phase"] == "Pending":
                    p["status"]["phase"] = "Running"
                    self.fake.put(PODS, p)
            return "kubelet"
        if roll < 0.86:
            return self.foreign_release(o)
        if roll < 0.89:
            # someone deletes a gated pod; the Job controller recreates its index later, a
            # new pod that may order before gated pods a releaser already chose
            waiting = [p for p in self.pods(o) if live(p) and gated(p)]
            if waiting:
                p = self.rng.choice(waiting)
                self.fake.delete(PODS, NAMESPACE, p["metadata"]["name"])
                return f"gated pod {index_of(p)} deleted"
        return faults.network()


class Faults:
    """The network's and the API server's faults for one world, drawn from its RNG."""

    def __init__(self, fake: FakeKube, rng: random.Random, cluster: Cluster) -> None:
        self.fake = fake
        self.rng = rng
        self.cluster = cluster
        self.held: list[WatchLag] = []
        self.on = True
        fake.patch_policy = self.patch

    def patch(self, namespace: str, name: str, client: str) -> PatchFault | None:
        if not self.on:
            return None
        roll = self.rng.random()
        if roll < 0.04:
            return PatchFault.refused(self.rng.choice([403, 422]))
        if roll < 0.08:
            return PatchFault.errored()
        if roll < 0.16:
            answer = self.rng.uniform(0.05, 0.5)
            status = self.rng.choice([None, 504])
            landing = self.rng.random()
            if landing < 0.35:
                return PatchFault.timed_out(answer, self.rng.uniform(0, answer), status=status)
            if landing < 0.8:  # after the client gave up, maybe after its expectation expired
                lands = answer + self.rng.uniform(0.01, 4.0)
                return PatchFault.timed_out(answer, lands, status=status)
            return PatchFault.timed_out(answer, None, status=status)  # never
        return None

    def network(self) -> str:
        fault = self.rng.random()
        if fault < 0.25:
            self.fake.cut_watches()
            return "cut watches"
        if fault < 0.45:
            self.fake.expire_watches(self.rng.choice(["pods", "workloads", "jobs", None]))
            return "410 Gone"
        if fault < 0.55:
            self.fake.stall_watches("pods")
            return "stall pod watches"
        if fault < 0.8:
            return self.hold_one_watch()
        return self.cluster.change_leader(self)

    def hold_one_watch(self) -> str:
        """One replica's pod watch of one kind (or its Workload watch) goes silent for a while,
        its other streams and the other replicas' flowing: two watches of the same objects
        disagree."""
        replica = self.rng.choice(self.cluster.replicas)
        if self.rng.random() < 0.75:
            plural = "pods"
            selector = self.rng.choice(["batch.kubernetes.io/controller-uid", "jobset", ""])
        else:
            plural, selector = "workloads", ""
        seconds = self.hold(plural, replica.name, selector, self.rng.uniform(0.2, 2.5))
        return f"hold {plural} watch of {replica.name} ({selector or 'all'}) for {seconds:.2f}s"

    def hold(self, plural: str, client: str, selector: str, seconds: float) -> float:
        lag = self.fake.lag_watches(plural, client=client, selector=selector)
        asyncio.get_running_loop().call_later(seconds, lag.release)
        self.held.append(lag)
        return seconds

    def quiet(self) -> None:
        self.on = False
        for lag in self.held:
            lag.release()


CONFIG = {
    "mode": "release",  # the world plays Kueue: no other releaser on its gate
    "kinds": [
        {"group": "batch", "kind": "Job"},
        {"group": "jobset.x-k8s.io", "kind": "JobSet"},
    ],
    "expectationsTimeoutSeconds": 1.5,
    "watch": {
        "backoffInitialSeconds": 0.01,
        "backoffMaxSeconds": 0.05,
        "silenceSeconds": 1.0,
    },
    "releaseBlocked": {"initialBackoffSeconds": 0.5, "maxBackoffSeconds": 2.0},
    "standDown": {"foreignReleases": 10_000},
}


class Replica:
    """One ``ungater run`` process: its own client (watches, patches), controller and
    elector, composed as the app composes them (``ungater._controller.manager.serve``)."""

    def __init__(self, fake: FakeKube, name: str) -> None:
        self.name = name
        self.client = fake.client(name)
        registry = PluginRegistry.from_modules({"job": job_plugin, "jobset": jobset_plugin})
        self.ctl = Controller(Config.model_validate(CONFIG), self.client, registry, clock=now)
        self.elector = LeaderElector(self.client, NAMESPACE, "ungater", name, *LEASE, clock=now)
        self.stop = anyio.Event()
        self.scope = anyio.CancelScope()
        self.done = anyio.Event()
        self.called_foreign: list[str] = []  # pods this replica reported released by another
        # (pod UID, the resourceVersion its release patch tests) -> the owner's Workloads this
        # replica's Workload cache showed Finished when that release was decided (read from
        # the cache itself, not from what the decision made of it)
        self.finished_seen: dict[tuple[str, str], frozenset[str]] = {}
        # the same key -> the resourceVersion at which the deciding view held each pod, by pod
        # UID: the deciding kind's pod index, and the quorum list of the owner's pods when the
        # decision was made on one (a new term's proof); the newer of the two per pod
        self.pods_seen: dict[tuple[str, str], dict[str, int]] = {}
        listed: dict[Any, dict[str, int]] = {}  # owner key -> its pods' last quorum list
        view = self.ctl.reconciler.view
        quorum_snapshot = view.quorum_snapshot

        async def reading(key: Any, rt: Any, owner: Any, in_flight: Any) -> Any:
            snapshot = await quorum_snapshot(key, rt, owner, in_flight)
            listed[key] = {p.uid: int(p.resource_version) for p in snapshot.pods}
            return snapshot

        view.quorum_snapshot = reading  # type: ignore[method-assign]

        def decided(key: Any, decision: Any) -> None:
            # called right after the decision, with no await between: the caches it decided on
            finished = frozenset(
                w.name
                for w in self.ctl.state.workloads.for_owner(key.uid)
                if w.condition_true(FINISHED)
            )
            rt = self.ctl.state.kind_of(key)
            pods = {u: int(p.resource_version) for u, p in rt.pods.by_uid.items()} if rt else {}
            for uid, rv in listed.get(key, {}).items():
                pods[uid] = max(rv, pods.get(uid, -1))
            for (
                uid
            ) in self.ctl.state.ledger.foreign_pods():  # another view of the replica showed it
                pods[uid] = KNOWN
            for r in decision.releases:
                self.finished_seen[(r.pod.uid, r.pod.resource_version)] = finished
                self.pods_seen[(r.pod.uid, r.pod.resource_version)] = pods

        self.ctl.reconciler.on_decision = decided
        self.ctl.notices.on_foreign_release = lambda pod: self.called_foreign.append(pod.name)

    async def run(self) -> None:
        try:
            with self.scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self.elector.run)
                    await self.ctl.run(self.stop, self.elector)
                    with anyio.CancelScope(shield=True):
                        await self.elector.release()
                    tg.cancel_scope.cancel()
        finally:
            self.done.set()


class Cluster:
    """The replicas: one leads, one waits; a leader change stops (cleanly or by a crash) the
    leader and starts a new standby."""

    def __init__(
        self, fake: FakeKube, world: World, rng: random.Random, tg: anyio.abc.TaskGroup
    ) -> None:
        self.fake = fake
        self.world = world
        self.rng = rng
        self.tg = tg
        self.replicas: list[Replica] = []
        self.all: list[Replica] = []
        self.changes = 0
        self.due: float | None = None  # when a planned leader change happens

    async def add(self) -> Replica:
        r = Replica(self.fake, f"r{len(self.all)}")
        self.world.replicas[r.name] = r
        self.replicas.append(r)
        self.all.append(r)
        self.tg.start_soon(r.run)
        with anyio.fail_after(5):
            await r.ctl.ready.wait()
        return r

    def change_leader(self, faults: Faults) -> str:
        """The leader goes now; or (half the time) the standbys' pod watches fall silent now
        and the leader goes while they still are (``due``), so the new leader takes over on a
        pod view that missed the old leader's last releases and the pods created meanwhile."""
        if self.due is not None or self.changes >= 3:
            return "no leader change"
        if self.rng.random() < 0.5:
            seconds = self.rng.uniform(1.0, 3.0)
            for r in self.replicas:
                if not r.elector.is_leader:
                    faults.hold("pods", r.name, "", seconds)
            self.due = now() + self.rng.uniform(0.3, seconds - 0.2)
            return f"standby pod watches silent for {seconds:.2f}s, leader goes at {self.due:.3f}"
        return self.hand_over()

    def tick(self) -> str | None:
        """The leader change a silent standby was waiting for, once due."""
        if self.due is None or now() < self.due:
            return None
        self.due = None
        return self.hand_over()

    def hand_over(self) -> str:
        leader = next((r for r in self.replicas if r.elector.is_leader), None)
        if leader is None:
            return "no leader change"
        self.changes += 1
        self.replicas.remove(leader)
        if self.rng.random() < 0.5:
            leader.stop.set()
            how = "hands over"
        else:
            leader.scope.cancel()
            how = "crashes"
        self.tg.start_soon(self.add)
        return f"leader {leader.name} {how}"

    def stop_all(self) -> None:
        for r in self.all:
            r.scope.cancel()


def converged(world: World) -> bool:
    return all(
        world.released_live(o) == o.bound and sum(1 for p in world.pods(o) if live(p)) == o.size
        for o in world.owners
    )


async def play(seed: int, settle: bool = True) -> tuple[World, Cluster]:
    """One world of ``seed``: its random history, then (``settle``, and no breach of the cap
    found) the quiet world the controller must release exactly to its bounds."""
    rng = random.Random(seed)
    random.seed(seed)  # the electors' retry jitter
    fake = FakeKube(seed=seed, max_delay=0.03, strict=True, bookmark_interval=0.15)
    # one stream of one replica is slow all along: an owner watch behind the pod watch is the
    # scale-down window, a pod watch behind the others' the double-view and refill windows
    slow = ["jobs", "pods", "jobsets", "jobs", "workloads", "jobs"][seed % 6]
    world = World(fake, rng)
    world.slow = (slow, rng.choice(["r0", "r1"]))
    fake.lag_watches(slow, client=world.slow[1], delay=LAG)
    owners = [world.add_job("train", rng.randint(2, 6)), world.add_jobset("llm", rng.randint(2, 6))]
    async with anyio.create_task_group() as tg:
        cluster = Cluster(fake, world, rng, tg)
        faults = Faults(fake, rng, cluster)
        await cluster.add()
        await cluster.add()
        for o in owners:
            world.start(o)
        for _ in range(STEPS):
            world.log.append(f"{now():.3f} {world.step(faults)}")
            change = cluster.tick()
            if change is not None:
                world.log.append(f"{now():.3f} {change}")
            await anyio.sleep(rng.uniform(0, 0.04))
        if settle and not world.violations:
            # quiet world: no more faults; Kueue and the Job controllers catch up, then the
            # controller must too, within CONVERGE virtual seconds
            faults.quiet()
            for _ in range(8):
                for o in owners:
                    world.kueue(o)
                    world.sync_pods(o, gradual=False)
            for _ in range(int(CONVERGE / 0.05)):  # polled on the virtual clock, not wall time
                if converged(world):
                    break
                await anyio.sleep(0.05)
        cluster.stop_all()
    return world, cluster


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.anyio
async def test_random_histories_never_exceed_the_cap_and_converge(seed: int) -> None:
    world, cluster = await play(seed)
    assert not world.violations, f"seed {seed}: {world.violations[0]}"
    assert converged(world), f"seed {seed}: not every owner released to its bound: " + str(
        [(o.kind, world.released_live(o), o.cap, o.size) for o in world.owners]
    )
    # the other releaser's releases may be reported; our own (an old leader's, a late landing
    # of ours) must not be
    false = {(r.name, p) for r in cluster.all for p in r.called_foreign} - {
        (r.name, p) for r in cluster.all for p in world.foreign_pods
    }
    assert not false, (
        f"seed {seed}: reported released by another, but released by us: {sorted(false)}; "
        f"leader changes: {cluster.changes}; late patches: "
        f"{[(p.name, p.client, p.state) for p in world.fake.late_patches]}"
    )


@pytest.mark.anyio
async def test_the_world_catches_a_controller_that_stops_counting_the_other_releasers_pods(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The oracle's own check (issue 33): a controller whose decisions leave out the pods it
    has seen released by another (``foreign_seen``) releases into their slots. The world used
    to excuse any excess within 2.5 virtual seconds of another release, about its whole
    history, and passed all 200 seeds with this bug; it now excuses only releases the deciding
    replica's pod view had not shown, and must report it."""
    facts_of = Reconciler._facts

    def blind(
        self: Reconciler, rt: KindRuntime, owner: ObjectRef, snapshot: Any, bounds: Any
    ) -> tuple[list[PodFacts], Mapping[str, int] | None]:
        facts, desired = facts_of(self, rt, owner, snapshot, bounds)
        return [f for f in facts if not self.s.ledger.released_unseen(f.pod.uid, None)], desired

    monkeypatch.setattr(Reconciler, "_facts", blind)
    caught = []
    for seed in PLANTED_SEEDS:
        world, _ = await play(seed, settle=False)
        caught += [f"seed {seed}: {v}" for v in world.violations]
    assert caught, f"no breach reported in seeds {PLANTED_SEEDS} with the planted bug"
    # at least one of them with no unseen release of the other releaser to excuse it
    assert any("had not seen 0 of {'" in v for v in caught), caught[0]
