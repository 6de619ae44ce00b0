"""The whole controller against random histories on the honest fake API server.

A small world model plays Kueue, the Job and JobSet controllers and the kubelet: owners are
admitted, grow (owner size first, a replacement slice later: the old slice is finished a step
before the new one is admitted) and shrink (owner size and pod deletions first, the slice's
count lowered in place later); released pods fail and are replaced; watches are delayed per
stream, cut, expired with 410 Gone and stalled. A JobSet's pods carry the Job labels too, so
the Job kind's pod watch sees them beside the JobSet kind's.

After every pod patch the controller makes, the patched pod's owner must not have more released
live pods than min(the count of its last active slice, its own desired size). A shrink is the
one change that lowers that bound, and the owner's controller deletes the extra pods one by one
afterwards (no sooner than ``VICTIMS_AFTER``), exactly when a releaser that trusts its old view
of the owner refills the freed slots; a patch that lands within ``GRACE`` of the shrink may have
been decided before it (no releaser can see the future) and is not held against it. At the
end, with the world quiet, every owner must be released exactly to its cap.
Seeded: a failure names its seed, and re-running that seed replays the same world steps.
"""

from __future__ import annotations

import random
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest
import ungater_plugins.job as job_plugin
import ungater_plugins.jobset as jobset_plugin

from tests.fakekube import FakeKube
from tests.objects import JOBS, WORKLOADS
from tests.polling import eventually
from tests.unit.podfactory import (
    GATE,
    NAMESPACE,
    job,
    job_pod,
    jobset,
    jobset_child_job,
    workload,
)
from ungater._config import Config
from ungater._controller import Controller
from ungater._kube import PODS, Resource
from ungater._registry import PluginRegistry

JOBSETS = Resource("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet")
COMPLETIONS = 20
MAX_SIZE = 7
SEEDS = range(12)
STEPS = 60
VICTIMS_AFTER = 0.25  # s from a shrink to the owner controller's first deletion
GRACE = 0.15  # s after a shrink in which a landing patch may have been decided before it
LAG = 0.6  # s: one watch stream of each world is this much behind the others
# An owner that grows back before the Workload watch shows Kueue's in-place lowering of its
# slice would be released to the stale, higher slice count: no view the controller holds can
# tell (the lowering is a write of Kueue's, not ours). Real clusters keep these seconds apart;
# the world waits until every stream has caught up. (Known window; see docs/testing.md.)
REGROWTH = LAG + 0.2


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


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
    cap: int = 0  # min(spec, admitted) of the last active slice; 0 before the first admission
    serial: int = 0
    shrunk_at: float = float("-inf")
    lowered_at: float = float("-inf")

    @property
    def uid(self) -> str:
        return str(self.pod_job["metadata"]["uid"])


def gated(pod: dict[str, Any]) -> bool:
    return GATE in [g["name"] for g in pod["spec"].get("schedulingGates") or []]


def live(pod: dict[str, Any]) -> bool:
    return pod["status"]["phase"] not in ("Succeeded", "Failed") and not pod["metadata"].get(
        "deletionTimestamp"
    )


def index_of(pod: dict[str, Any]) -> int:
    return int(pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"])


class World:
    def __init__(self, fake: FakeKube, rng: random.Random) -> None:
        self.fake = fake
        self.rng = rng
        self.owners: list[Owner] = []
        self.violations: list[str] = []
        self.log: list[str] = []

    # -- reading the truth ---------------------------------------------------------------------

    def pods(self, o: Owner) -> list[dict[str, Any]]:
        return [
            p
            for p in self.fake.items(PODS, NAMESPACE)
            if p["metadata"]["labels"].get("batch.kubernetes.io/controller-uid") == o.uid
        ]

    def released_live(self, o: Owner) -> int:
        return sum(1 for p in self.pods(o) if live(p) and not gated(p))

    def owner_of(self, pod_name: str) -> Owner | None:
        pod = self.fake.read(PODS, NAMESPACE, pod_name)
        uid = (
            (pod or {})
            .get("metadata", {})
            .get("labels", {})
            .get("batch.kubernetes.io/controller-uid")
        )
        return next((o for o in self.owners if o.uid == uid), None)

    def check(self, when: str, o: Owner) -> None:
        n, bound = self.released_live(o), min(o.cap, o.size)
        if n > bound and time.monotonic() - o.shrunk_at > GRACE:
            self.violations.append(
                f"{when}: {o.kind} {o.obj['metadata']['name']}: {n} released live pods, "
                f"cap {o.cap}, size {o.size}; history: {self.log[-6:]}"
            )

    # -- the owners' controllers ------------------------------------------------------------

    def add_job(self, name: str, size: int) -> Owner:
        j = self.fake.put(JOBS, job(name, parallelism=size, completions=COMPLETIONS))
        o = Owner("job", j, j, "main", size)
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
        self.owners.append(o)
        self.sync_pods(o)
        return o

    def resize(self, o: Owner, size: int) -> None:
        if size < o.size:
            o.shrunk_at = time.monotonic()
        o.size = size
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
            extra = 1 if time.monotonic() - o.shrunk_at >= VICTIMS_AFTER else 0
        if extra > 0:
            # its own choice of victims, released ones first as often as not
            if self.rng.random() < 0.7:
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
                self.write_slice(o, active)
                return "finish old slice"
            first = pending.replaces is None
            pending.admitted = self.rng.randint(max(1, pending.spec // 2), pending.spec)
            if not first:
                pending.admitted = pending.spec  # a replacement is admitted whole
            self.write_slice(o, pending)
            o.cap = min(pending.spec, pending.admitted)
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
            self.write_slice(o, active)
            o.lowered_at = time.monotonic()
            o.cap = min(active.spec, active.admitted or 0)
            return f"lower in place to {o.size}"
        return "idle"

    def start(self, o: Owner) -> None:
        s = Slice("", 0, o.size)
        o.slices.append(s)
        self.write_slice(o, s)

    # -- one random step ----------------------------------------------------------------------

    def step(self) -> str:
        o = self.rng.choice(self.owners)
        # no resize while a slice is pending or the last shrink's pods are still going, nor
        # before every watch can have shown Kueue's last in-place lowering (see REGROWTH)
        steady = (
            (not o.slices or o.slices[-1].admitted is not None)
            and sum(1 for p in self.pods(o) if live(p)) <= o.size
            and time.monotonic() - o.lowered_at > REGROWTH
        )
        roll = self.rng.random()
        if roll < 0.25:
            return self.kueue(o)
        if roll < 0.33 and steady and o.size < MAX_SIZE:
            self.resize(o, self.rng.randint(o.size + 1, MAX_SIZE))
            self.sync_pods(o)
            return f"scale up to {o.size}"
        if roll < 0.53 and steady and o.size > 1:
            self.resize(o, self.rng.randint(1, o.size - 1))
            return f"scale down to {o.size}"  # its pods go in later job controller steps
        if roll < 0.63:
            running = [p for p in self.pods(o) if live(p) and not gated(p)]
            if running:
                p = self.rng.choice(running)
                p["status"]["phase"] = "Failed"
                self.fake.put(PODS, p)
                return f"pod {index_of(p)} failed"
        if roll < 0.85:
            self.sync_pods(o)
            return "job controller"
        if roll < 0.92:
            for p in self.pods(o):
                if live(p) and not gated(p) and p["status"]["phase"] == "Pending":
                    p["status"]["phase"] = "Running"
                    self.fake.put(PODS, p)
            return "kubelet"
        fault = self.rng.random()
        if fault < 0.45:
            self.fake.cut_watches()
            return "cut watches"
        if fault < 0.8:
            self.fake.expire_watches(self.rng.choice(["pods", "workloads", "jobs", None]))
            return "410 Gone"
        self.fake.stall_watches("pods")
        return "stall pod watches"


class CheckedFake(FakeKube):
    """Checks the cap right after every pod patch lands (the controller's only pod write)."""

    world: World | None = None

    async def json_patch(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        out = await super().json_patch(*args, **kwargs)
        owner = self.world.owner_of(args[2]) if self.world is not None else None
        if self.world is not None and owner is not None:
            self.world.check(f"after patching {args[2]}", owner)
        return out


@asynccontextmanager
async def running(client: FakeKube) -> AsyncIterator[Controller]:
    cfg = Config.model_validate(
        {
            "mode": "release",  # the test plays Kueue: no other releaser
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
        }
    )
    registry = PluginRegistry.from_modules({"job": job_plugin, "jobset": jobset_plugin})
    ctl = Controller(cfg, client, registry)
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(ctl.run, stop)
        with anyio.fail_after(5):
            await ctl.ready.wait()
        try:
            yield ctl
        finally:
            stop.set()


def converged(world: World) -> bool:
    return all(
        world.released_live(o) == min(o.cap, o.size)
        and sum(1 for p in world.pods(o) if live(p)) == o.size
        for o in world.owners
    )


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.anyio
async def test_random_histories_never_exceed_the_cap_and_converge(seed: int) -> None:
    rng = random.Random(seed)
    # one stream of each world is slow: an owner watch behind the pod watch is the scale-down
    # window, a pod watch behind the others the double-view and refill windows
    slow = ["jobs", "pods", "jobsets", "jobs", "workloads", "jobs"][seed % 6]
    fake = CheckedFake(
        seed=seed, max_delay=0.03, strict=True, bookmark_interval=0.15, lag={slow: LAG}
    )
    world = World(fake, rng)
    fake.world = world
    owners = [world.add_job("train", rng.randint(2, 6)), world.add_jobset("llm", rng.randint(2, 6))]
    async with running(fake) as ctl:
        for o in owners:
            world.start(o)
        for _ in range(STEPS):
            world.log.append(world.step())
            await anyio.sleep(rng.uniform(0, 0.04))
        assert not world.violations, f"seed {seed}: {world.violations[0]}"
        # quiet world: Kueue and the Job controllers catch up, then the controller must too
        for _ in range(8):
            for o in owners:
                world.kueue(o)
                world.sync_pods(o, gradual=False)
        await eventually(
            lambda: converged(world),
            timeout=10,
            what=f"seed {seed}: every owner released to its cap "
            + str([(o.kind, world.released_live(o), o.cap, o.size) for o in owners]),
        )
        assert not world.violations, f"seed {seed}: {world.violations[0]}"
        assert ctl.stats.foreign_releases == 0, f"seed {seed}: a false foreign release"
