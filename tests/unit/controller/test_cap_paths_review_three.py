"""Four paths a third review found on the project's own fake (issue 33), one test each, each
written to fail on the code before its fix (docs/safety.md names the mechanism that closes it).

1. An expectation expired for a pod the deciding cache never held (released on a new term's
   quorum reads), and was dropped unread: the next decision released another pod.
2. The shrink fence re-read the active slice, found it finished, and fell back to an older
   cached slice it never read.
3. A refused release was resent after the cache already showed the owner shrunk below it.
4. A standby turned leader reported the old leader's releases as foreign in the event-loop
   turns between leading and knowing its term's start.

Each test checks the cap over the fake's whole history, in resourceVersion order.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
import ungater_plugins.job as job_plugin
import ungater_plugins.jobset as jobset_plugin

from tests.fakekube import FakeKube
from tests.lagging import Lagging
from tests.objects import JOBS, WORKLOADS
from tests.polling import eventually, holds_for
from tests.unit.capcheck import (
    CONFIG_MAPS,
    HandOver,
    Term,
    config,
    live_released,
    peak_live_released,
)
from tests.unit.harness import owner_facts, owner_version, running
from tests.unit.podfactory import (
    GATE,
    NAMESPACE,
    job,
    job_pod,
    jobset,
    jobset_child_job,
    workload,
)
from ungater._decide.indexes import OwnerKey
from ungater._kube.client import PODS, Resource


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def term_behind_every_cache(fake: FakeKube, elector: HandOver, ctl: Any) -> None:
    """A term that starts at a write none of the caches sees (the Lease's): every owner is
    unproven until a read, or every cache passing that write, shows otherwise."""
    fake.put(CONFIG_MAPS, {"metadata": {"name": "lease", "namespace": NAMESPACE}})
    elector.go.set()
    await eventually(lambda: ctl.state.freshness.term_rv > 0, what="the term")


# -- 1. an expectation for a pod the cache never held --------------------------------------------


@pytest.mark.anyio
async def test_an_expired_expectation_for_a_pod_the_cache_never_held_is_settled_by_a_read() -> None:
    """A new term; the pod watch sees one event after the term's start, then stays open but
    silent. Pod 0 is created gated and the slice admits 1. The Job cache is behind the term's
    start, so the release is decided on quorum reads and picks pod 0, which the pod cache never
    held. A bookmark then carries every cache past the term's start (no owner needs a proof any
    more), and pod 0's expectation expires: it must be settled from the API server, not dropped
    because the cache has no pod 0, or the next decision releases pod 1 beside it."""
    fake = FakeKube()
    client = Lagging(fake)
    j = fake.put(JOBS, job("train", parallelism=2, completions=2))
    elector = HandOver(fake)
    async with running(client, config(), elector=elector) as ctl:
        rt = ctl.state.kinds[next(iter(ctl.state.kinds))]
        await term_behind_every_cache(fake, elector, ctl)
        fake.put(PODS, job_pod(j, index=1, created=2))  # the pod watch moves past the term
        await eventually(lambda: len(rt.pods) == 1, what="pod 1 in the cache")
        held = client.hold("pods")  # ... and then goes silent
        fake.put(PODS, job_pod(j, index=0, created=1))
        fake.put(WORKLOADS, workload(j, {"main": 2}, admitted={"main": 1}))
        await eventually(lambda: live_released(fake) == 1, what="pod 0 released")
        assert ctl.stats.proof_reads >= 1 and len(rt.pods) == 1
        fake.bookmark()  # the Job and Workload caches pass the term: every owner is proven
        await anyio.sleep(0.3)  # pod 0's expectation (0.2 s) expires, the pod still unseen
        fake.put(JOBS, {**j, "status": {"active": 1}})  # the Job's status wakes its owner key
        await holds_for(lambda: live_released(fake) == 1, 0.8, what="cap 1, pod 0 unseen")
        assert ctl.state.ledger.expectations.expired_total >= 1, (
            ctl.stats,
            len(ctl.state.ledger.expectations),
            ctl.state.freshness.proven,
        )
        held.set()
        await holds_for(lambda: live_released(fake) == 1, 0.3, what="cap 1 once caught up")
    assert peak_live_released(fake) == 1


# -- 2. the view reads every slice it would decide on -------------------------------------------


def _sized(j: dict[str, Any], parallelism: int) -> dict[str, Any]:
    return {**j, "spec": {**j["spec"], "parallelism": parallelism}}


def _finished(fake: FakeKube, wl: dict[str, Any]) -> dict[str, Any]:
    now = fake.read(WORKLOADS, NAMESPACE, wl["metadata"]["name"]) or {}
    now["status"]["conditions"].append(
        {"type": "Finished", "status": "True", "reason": "WorkloadSliceReplaced"}
    )
    return fake.put(WORKLOADS, now)


def _slice(
    j: dict[str, Any], count: int, seed: str, after: dict[str, Any] | None, **kw: Any
) -> Any:
    replaced = f"{NAMESPACE}/{after['metadata']['name']}" if after is not None else None
    return workload(j, {"main": count}, seed=seed, replacement_for=replaced, **kw)


@pytest.mark.anyio
async def test_the_view_never_falls_back_to_a_cached_slice_it_did_not_read() -> None:
    """The Workload watch stalls after S2 (6) was admitted and before it shows S1 finished. The
    Job shrinks 6 -> 2 (pods deleted: the fence is armed), S2 is lowered in place to 2, the Job
    grows to 3 (S3 admitted at 3, S2 finished), then to 5 (S4 pending). The fence re-reads S2,
    finds it finished, and must not then decide on the cached S1 (4), which it never read."""
    fake = FakeKube()
    client = Lagging(fake)
    j = fake.put(JOBS, job("train", parallelism=4, completions=8))
    pods = [fake.put(PODS, job_pod(j, index=i, created=1 + i)) for i in range(4)]
    async with running(client, config()) as ctl:
        s1 = fake.put(WORKLOADS, _slice(j, 4, "", None, admitted={"main": 4}))
        await eventually(lambda: live_released(fake) == 4, what="S1's 4 released")
        j = fake.put(JOBS, _sized(j, 6))
        pods += [fake.put(PODS, job_pod(j, index=i, created=1 + i)) for i in (4, 5)]
        s2 = fake.put(WORKLOADS, _slice(j, 6, "s2", s1, admitted={"main": 6}, created=10))
        await eventually(lambda: live_released(fake) == 6, what="S2's 6 released")
        held = [client.hold(plural) for plural in ("workloads", "jobs", "pods")]
        _finished(fake, s1)
        j = fake.put(JOBS, _sized(j, 2))
        for p in pods[2:]:
            fake.delete(PODS, NAMESPACE, p["metadata"]["name"])
        start = fake.rv  # 2 live from here on; S3 will admit 3
        lowered = fake.read(WORKLOADS, NAMESPACE, s2["metadata"]["name"]) or {}
        lowered["spec"]["podSets"][0]["count"] = 2
        lowered["status"]["admission"]["podSetAssignments"][0]["count"] = 2
        fake.put(WORKLOADS, lowered)
        j = fake.put(JOBS, _sized(j, 3))
        _finished(fake, s2)
        s3 = fake.put(WORKLOADS, _slice(j, 3, "s3", s2, admitted={"main": 3}, created=20))
        fake.put(PODS, job_pod(j, index=2, created=30, seed="again"))
        j = fake.put(JOBS, _sized(j, 5))
        fake.put(WORKLOADS, _slice(j, 5, "s4", s3, created=40))
        for i in (3, 4):
            fake.put(PODS, job_pod(j, index=i, created=30 + i, seed="again"))
        for gate in held[1:]:  # the Jobs and the pods come through; the Workloads do not
            gate.set()
        key = OwnerKey(NAMESPACE, j["metadata"]["uid"])
        rt = ctl.state.kinds[next(iter(ctl.state.kinds))]
        await eventually(
            lambda: (
                sum(not p.deleting for p in rt.pods.by_uid.values()) == 5
                and owner_version(ctl, key.uid) == int(j["metadata"]["resourceVersion"])
            ),
            what="the grown Job and its pods in the caches",
        )
        await holds_for(lambda: live_released(fake) <= 3, 0.4, what="at most S3's 3")
        held[0].set()
        await eventually(lambda: live_released(fake) == 3, what="S3's third pod")
        await holds_for(lambda: live_released(fake) == 3, 0.3, what="S3's 3 once caught up")
    assert peak_live_released(fake, since=start) == 3


# -- 3. a resend decides nothing the caches no longer support ------------------------------------

OTHER_GATE = "example.com/other-gate"


class ShrinkBeforeResend:
    """A client that, after our release of ``name`` is refused, holds the read the resend is
    built on until ``ready()`` says the controller's caches show the owner shrunk."""

    def __init__(self, inner: FakeKube, name: str) -> None:
        self.inner = inner
        self.name = name
        self.refused = False
        self.ready: Any = None

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)

    async def json_patch(self, resource: Any, namespace: Any, name: str, ops: Any) -> Any:
        try:
            return await self.inner.json_patch(resource, namespace, name, ops)
        except Exception:
            if name == self.name:
                self.refused = True
            raise

    async def get(self, resource: Any, namespace: Any, name: str, *a: Any, **kw: Any) -> Any:
        if name == self.name and self.refused and self.ready is not None:
            await eventually(self.ready, timeout=5, what="the shrink in the caches")
        return await self.inner.get(resource, namespace, name, *a, **kw)


@pytest.mark.anyio
async def test_a_refused_release_is_not_resent_past_a_shrink_the_cache_already_shows() -> None:
    """Pod 2 carries another writer's gate beside ours; that writer removes its gate first, so
    our release is refused on the changed version. Before the resend goes out the Job shrinks
    3 -> 2 and the cache shows it (the shrink fence armed): the resend must not go out."""
    fake = FakeKube()
    j = fake.put(JOBS, job("train", parallelism=3, completions=3))
    pods = [fake.put(PODS, job_pod(j, index=i, created=1 + i)) for i in range(3)]
    two = pods[2]
    two["spec"]["schedulingGates"].append({"name": OTHER_GATE})
    two = fake.put(PODS, two)
    client = ShrinkBeforeResend(fake, two["metadata"]["name"])

    def other_writer_first(namespace: str, name: str) -> None:
        if name != client.name or fake.before_patch is None:
            return
        fake.before_patch = None
        now = fake.read(PODS, NAMESPACE, name) or {}
        now["spec"]["schedulingGates"] = [
            g for g in now["spec"]["schedulingGates"] if g["name"] != OTHER_GATE
        ]
        fake.put(PODS, now)  # the other writer's release: our patch now tests a stale version
        fake.put(JOBS, _sized(j, 2))  # ... and the Job shrinks to 2

    async with running(client, config()) as ctl:
        key = OwnerKey(NAMESPACE, j["metadata"]["uid"])
        client.ready = lambda: (
            owner_facts(ctl, key.uid)
            and (
                owner_version(ctl, key.uid)
                >= int(fake.read(JOBS, NAMESPACE, "train")["metadata"]["resourceVersion"])
            )
        )
        fake.before_patch = other_writer_first
        fake.put(WORKLOADS, workload(j, {"main": 3}, admitted={"main": 3}))
        await eventually(lambda: client.refused, what="pod 2's release refused")
        await eventually(lambda: live_released(fake) >= 2, what="pods 0 and 1 released")
        await holds_for(lambda: live_released(fake) == 2, 0.5, what="cap 2: the Job's size")
    assert peak_live_released(fake) == 2


# -- 4. the term's start is known from the moment it leads ---------------------------------------


class EagerTerm:
    """An elector as the real one behaves: ``is_leader`` and ``term`` turn true at once, and the
    controller's ``fn(term)`` runs later (``enter``), after other tasks had their turns."""

    def __init__(self, fake: FakeKube) -> None:
        self.fake = fake
        self.is_leader = False
        self.term: Any = None
        self.enter = anyio.Event()

    def begin(self) -> None:
        self.term = Term(1, anyio.Event(), str(self.fake.rv))
        self.is_leader = True

    async def run_while_leading(self, fn: Any) -> None:
        await self.enter.wait()
        await fn(self.term)


@pytest.mark.anyio
async def test_the_old_leaders_release_seen_as_the_term_begins_is_not_foreign() -> None:
    """A standby's lagging pod watch delivers the old leader's release between the moment the
    standby leads and the moment its workers start: that release predates the term."""
    fake = FakeKube()
    j = fake.put(JOBS, job("train", parallelism=1, completions=1))
    fake.put(PODS, job_pod(j, index=0, created=1))
    standby_client = Lagging(fake)
    elector = EagerTerm(fake)
    async with running(standby_client, config(), elector=elector) as standby:
        held = standby_client.hold("pods")
        async with running(fake, config()):  # the old leader
            fake.put(WORKLOADS, workload(j, {"main": 1}, admitted={"main": 1}))
            await eventually(lambda: live_released(fake) == 1, what="the old leader's release")
        fake.put(CONFIG_MAPS, {"metadata": {"name": "lease", "namespace": NAMESPACE}})
        elector.begin()  # leading from here; the workers start later
        held.set()
        rt = standby.state.kinds[next(iter(standby.state.kinds))]
        await eventually(
            lambda: all(not p.has_gate(GATE) for p in rt.pods.by_uid.values()),
            what="the standby saw the old leader's release",
        )
        elector.enter.set()
        await holds_for(lambda: live_released(fake) == 1, 0.3, what="nothing more released")
        assert standby.stats.foreign_releases == 0


# -- 5. another writer's release one view has shown counts in every view ------------------------

JOBSETS = Resource("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet")


@pytest.mark.anyio
async def test_a_release_by_another_writer_that_one_view_showed_counts_in_a_view_that_lags() -> (
    None
):
    """A JobSet's pods are in two pod watches of ours (the Job kind's and the JobSet kind's).
    Another writer releases pod 5; the Job kind's watch shows it, the JobSet kind's lags. The
    slice admits 1: the JobSet decision, on its lagging view, must count pod 5 (the replica
    knows it runs) and not release pod 0 beside it. Found by the world test (seed 84) once its
    oracle excused only what the deciding replica could not know."""
    fake = FakeKube()
    client = Lagging(fake)
    js = fake.put(JOBSETS, jobset("llm", {"workers": 1}))
    js["spec"]["replicatedJobs"][0]["template"]["spec"] = {"parallelism": 6, "completions": 6}
    js = fake.put(JOBSETS, js)
    child = fake.put(JOBS, jobset_child_job(js, "workers", 0, parallelism=6))
    pods = {i: fake.put(PODS, job_pod(child, index=i, created=1 + i)) for i in (0, 5)}
    kinds = [{"group": "batch", "kind": "Job"}, {"group": "jobset.x-k8s.io", "kind": "JobSet"}]
    plugins = {"job": job_plugin, "jobset": jobset_plugin}
    async with running(client, config(kinds=kinds), plugins=plugins) as ctl:
        held = client.hold("pods", jobset_plugin.JOBSET_UID_LABEL)
        fake.foreign_release(NAMESPACE, pods[5]["metadata"]["name"], GATE)
        await eventually(lambda: ctl.stats.foreign_releases == 1, what="seen via the Job kind")
        key = OwnerKey(NAMESPACE, js["metadata"]["uid"])
        fake.put(WORKLOADS, workload(js, {"workers": 6}, admitted={"workers": 1}))
        await eventually(lambda: key in ctl.state.decisions, what="the JobSet decided on")
        await holds_for(lambda: live_released(fake) == 1, 0.5, what="cap 1, pod 5 counted")
        held.set()
        await holds_for(lambda: live_released(fake) == 1, 0.3, what="cap 1 once caught up")
    assert peak_live_released(fake) == 1


@pytest.mark.anyio
async def test_an_expired_expectation_for_a_never_held_pod_that_is_gone_is_forgotten() -> None:
    """As in path 1, pod 0 is released on a new term's quorum reads and the pod cache never
    holds it; then it is deleted. When its expectation expires the read finds it gone: the
    ledger forgets it (nothing kept for a pod no view will ever show) and the owner is decided
    on again, releasing pod 1 into the freed slot."""
    fake = FakeKube()
    client = Lagging(fake)
    j = fake.put(JOBS, job("train", parallelism=2, completions=2))
    elector = HandOver(fake)
    async with running(client, config(), elector=elector) as ctl:
        rt = ctl.state.kinds[next(iter(ctl.state.kinds))]
        await term_behind_every_cache(fake, elector, ctl)
        fake.put(PODS, job_pod(j, index=1, created=2))
        await eventually(lambda: len(rt.pods) == 1, what="pod 1 in the cache")
        client.hold("pods")  # from here the pod watch is silent
        zero = fake.put(PODS, job_pod(j, index=0, created=1))
        fake.put(WORKLOADS, workload(j, {"main": 2}, admitted={"main": 1}))
        await eventually(lambda: live_released(fake) == 1, what="pod 0 released")
        uid0 = zero["metadata"]["uid"]
        assert ctl.state.ledger.locate(uid0) is not None
        fake.delete(PODS, NAMESPACE, zero["metadata"]["name"])
        fake.finalize(PODS, NAMESPACE, zero["metadata"]["name"])
        await anyio.sleep(0.3)  # the expectation (0.2 s) expires
        fake.put(JOBS, {**j, "status": {"active": 0}})  # wakes the owner
        await eventually(
            lambda: live_released(fake) == 1 and not ctl.state.ledger.is_ours(uid0),
            what="pod 1 released, pod 0 forgotten",
        )
        assert ctl.state.ledger.locate(uid0) is None and ctl.state.ledger.is_gone(uid0)


# -- 6 and 7, found while writing docs/safety.md ------------------------------------------------


class ShrinkDuringTheFirstPatch:
    """A client whose first pod patch is answered only once the Job has shrunk to 1 and the
    controller's owner cache shows it; the other patches wait for a slot meanwhile."""

    def __init__(self, inner: FakeKube, j: dict[str, Any]) -> None:
        self.inner = inner
        self.j = j
        self.ctl: Any = None
        self.first = True

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)

    async def json_patch(self, resource: Any, namespace: Any, name: str, ops: Any) -> Any:
        if resource.plural == "pods" and self.first:
            self.first = False
            shrunk = self.inner.put(JOBS, {**self.j, "spec": {**self.j["spec"], "parallelism": 1}})
            rv = int(shrunk["metadata"]["resourceVersion"])
            uid = self.j["metadata"]["uid"]
            await eventually(lambda: owner_version(self.ctl, uid) >= rv, what="the shrink cached")
        return await self.inner.json_patch(resource, namespace, name, ops)


@pytest.mark.anyio
async def test_a_release_waiting_for_a_patch_slot_is_not_sent_past_a_shrink_the_cache_shows() -> (
    None
):
    """Three pods admitted, one patch at a time (``patchConcurrency: 1``). While the first
    patch is out, the Job shrinks to 1 and the cache shows it: the two releases still waiting
    for a slot must not go out (a send is the decision as it was; path 3 for first sends)."""
    fake = FakeKube()
    j = fake.put(JOBS, job("train", parallelism=3, completions=3))
    for i in range(3):
        fake.put(PODS, job_pod(j, index=i, created=1 + i))
    client = ShrinkDuringTheFirstPatch(fake, j)
    async with running(client, config(client={"patchConcurrency": 1})) as ctl:
        client.ctl = ctl
        fake.put(WORKLOADS, workload(j, {"main": 3}, admitted={"main": 3}))
        await eventually(lambda: not client.first and live_released(fake) >= 1, what="one out")
        await holds_for(lambda: live_released(fake) == 1, 0.5, what="the Job's size: 1")
    assert peak_live_released(fake) == 1


@pytest.mark.anyio
async def test_a_slice_touched_after_the_pods_went_is_read_anew_with_the_owner() -> None:
    """The Job shrinks 4 -> 2 (its owner watch then lags), pods 2 and 3 go. An unrelated write
    to the slice is seen, so the cached slice is newer than the victims' going; then Kueue
    lowers the slice to 2 (not seen) and the Job grows back to 4 with two new pods. The view
    reads the owner (grown back) and the slice: without the slice, the old count (4) releases
    4 pods for a slice of 2."""
    fake = FakeKube()
    client = Lagging(fake)
    j = fake.put(JOBS, job("train", parallelism=4, completions=4))
    pods = [fake.put(PODS, job_pod(j, index=i, created=1 + i)) for i in range(4)]
    async with running(client, config()) as ctl:
        wl = fake.put(WORKLOADS, workload(j, {"main": 4}, admitted={"main": 4}))
        await eventually(lambda: live_released(fake) == 4, what="4 released")
        key = OwnerKey(NAMESPACE, j["metadata"]["uid"])
        held_jobs = client.hold("jobs")
        fake.put(JOBS, {**j, "spec": {**j["spec"], "parallelism": 2}})
        for p in pods[2:]:
            fake.finalize(PODS, NAMESPACE, p["metadata"]["name"])
            fake.delete(PODS, NAMESPACE, p["metadata"]["name"])
        rt = ctl.state.kinds[next(iter(ctl.state.kinds))]
        await eventually(lambda: len(rt.pods) == 2, what="the victims gone from the cache")
        start = fake.rv
        touched = fake.read(WORKLOADS, NAMESPACE, wl["metadata"]["name"]) or {}
        touched["metadata"].setdefault("labels", {})["touched"] = "yes"
        touched = fake.put(WORKLOADS, touched)
        rt = ctl.state.kinds[next(iter(ctl.state.kinds))]
        await eventually(
            lambda: any(
                w.resource_version == touched["metadata"]["resourceVersion"]
                for w in ctl.state.workloads.for_owner(key.uid)
            ),
            what="the touched slice cached",
        )
        held_wls = client.hold("workloads")
        lowered = fake.read(WORKLOADS, NAMESPACE, wl["metadata"]["name"]) or {}
        lowered["spec"]["podSets"][0]["count"] = 2
        lowered["status"]["admission"]["podSetAssignments"][0]["count"] = 2
        fake.put(WORKLOADS, lowered)
        fake.put(JOBS, {**j, "spec": {**j["spec"], "parallelism": 4}})
        for i in (2, 3):
            fake.put(PODS, job_pod(j, index=i, created=10 + i, seed="again"))
        await eventually(
            lambda: sum(p.has_gate(GATE) for p in rt.pods.by_uid.values()) == 2,
            what="the new pods cached",
        )
        await holds_for(lambda: live_released(fake) == 2, 0.5, what="the lowered slice's 2")
        held_jobs.set()
        held_wls.set()
        await holds_for(lambda: live_released(fake) == 2, 0.3, what="2 once caught up")
    assert peak_live_released(fake, since=start) == 2


@pytest.mark.anyio
async def test_an_owner_proven_by_a_matching_read_needs_no_more_reads_in_its_term() -> None:
    """A new term whose Job cache stays behind its start: the first release of an owner is
    decided on quorum reads, which match the cache, so the owner is proven; its next release
    in the same term (a scale-up) is decided on the cache alone, while another owner still
    pays for its own reads."""
    fake = FakeKube()
    jobs = [fake.put(JOBS, job(n, parallelism=2, completions=8)) for n in ("train", "eval")]
    for j in jobs:
        for i in range(2):
            fake.put(PODS, job_pod(j, index=i, created=1 + i))
    elector = HandOver(fake)
    async with running(fake, config(), elector=elector) as ctl:
        await term_behind_every_cache(fake, elector, ctl)
        first = fake.put(WORKLOADS, workload(jobs[0], {"main": 2}, admitted={"main": 1}))
        await eventually(lambda: live_released(fake) == 1, what="the first release")
        assert ctl.stats.proof_reads == 1
        assert ctl.state.freshness.proven == {OwnerKey(NAMESPACE, jobs[0]["metadata"]["uid"])}
        grown = fake.read(WORKLOADS, NAMESPACE, first["metadata"]["name"]) or {}
        grown["status"]["admission"]["podSetAssignments"][0]["count"] = 2
        fake.put(WORKLOADS, grown)
        await eventually(lambda: live_released(fake) == 2, what="the second release")
        assert ctl.stats.proof_reads == 1  # proven: the cache alone decided
        fake.put(WORKLOADS, workload(jobs[1], {"main": 2}, admitted={"main": 1}))
        await eventually(lambda: live_released(fake) == 3, what="the other Job's release")
        assert ctl.stats.proof_reads == 2
