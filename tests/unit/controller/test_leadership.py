"""Leadership (docs/safety.md, "Leadership"): a new term's owners are decided on quorum reads
until proven; the caches left behind the term's start are relisted once another moved past it;
the term's start comes from the elector, so the old leader's releases seen as the term begins
are not foreign; a replica that lost the Lease patches nothing.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

import ungater._controller.controller as controller_module
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
from tests.unit.controller.viewkit import cached, gated, setup, standby, term_behind_every_cache
from tests.unit.harness import running
from tests.unit.podfactory import (
    GATE,
    NAMESPACE,
    job,
    job_pod,
    workload,
)
from ungater._decide.indexes import OwnerKey
from ungater._kube.client import PODS

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def quick_catch_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """A term's catch-up in tens of milliseconds instead of seconds."""
    monkeypatch.setattr(controller_module, "CATCH_UP_AFTER_S", 0.05)
    monkeypatch.setattr(controller_module, "CATCH_UP_TICK_S", 0.01)


def _lists(ctl: Any) -> int:
    return sum(r.stats.lists for r in ctl.reflectors)


def _caught_up(ctl: Any) -> bool:
    return all(int(r.resource_version) >= ctl.state.freshness.term_rv for r in ctl.reflectors)


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
async def test_a_new_leader_on_a_lagging_cache_does_not_release_past_the_old_leaders_release() -> (
    None
):
    """Issue 26, path 1: a new leader decided on a standby cache whose pod watch lagged: it
    never saw the pod the old leader had just released, and released another. Checked over
    the fake's whole history, in resourceVersion order.
    """
    fake = FakeKube()
    j = fake.put(JOBS, job("train", parallelism=2, completions=2))
    fake.put(PODS, job_pod(j, index=1, created=2))
    standby_client = Lagging(fake)
    standby_elector = HandOver(fake)
    async with running(standby_client, config(), elector=standby_elector) as standby:
        held = standby_client.hold("pods")  # the standby's pod watch goes quiet from here
        async with running(fake, config()) as leader:
            fake.put(PODS, job_pod(j, index=0, created=1))
            wl = fake.put(WORKLOADS, workload(j, {"main": 2}, admitted={"main": 1}))
            await eventually(lambda: live_released(fake) == 1, what="the leader's release")
            assert leader.stats.released == 1
        # the leader is gone; the standby takes over with a cache that never saw pod 0
        key = OwnerKey(NAMESPACE, j["metadata"]["uid"])
        assert len(standby.state.kinds[next(iter(standby.state.kinds))].pods) == 1
        before = standby.stats.reconciles
        standby_elector.go.set()
        await eventually(
            lambda: standby.stats.reconciles > before and key in standby.state.decisions,
            what="the new leader decided for the Job",
        )
        await holds_for(lambda: live_released(fake) == 1, 0.3, what="cap 1 after the hand-over")
        held.set()
        await holds_for(lambda: live_released(fake) == 1, 0.3, what="cap 1 once caught up")
        assert peak_live_released(fake) == 1
        # the old leader's release is not someone else's
        assert standby.stats.foreign_releases == 0
        assert wl["metadata"]["name"] in str(standby.state.decisions[key].active_slice)
        reads = standby.stats.proof_reads
        assert reads >= 1
        # once every cache has seen past the term's start, no owner needs a proof any more
        other = fake.put(JOBS, job("eval", parallelism=1, completions=1))
        fake.put(PODS, job_pod(other, index=0, created=3))
        fake.put(WORKLOADS, workload(other, {"main": 1}, admitted={"main": 1}))
        await eventually(lambda: live_released(fake) == 2, what="the second Job's pod")
        assert standby.stats.proof_reads == reads


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
        assert ctl.state.freshness.confirmed == {OwnerKey(NAMESPACE, jobs[0]["metadata"]["uid"])}
        grown = fake.read(WORKLOADS, NAMESPACE, first["metadata"]["name"]) or {}
        grown["status"]["admission"]["podSetAssignments"][0]["count"] = 2
        fake.put(WORKLOADS, grown)
        await eventually(lambda: live_released(fake) == 2, what="the second release")
        assert ctl.stats.proof_reads == 1  # proven: the cache alone decided
        fake.put(WORKLOADS, workload(jobs[1], {"main": 2}, admitted={"main": 1}))
        await eventually(lambda: live_released(fake) == 3, what="the other Job's release")
        assert ctl.stats.proof_reads == 2


@pytest.mark.anyio
async def test_a_new_leader_relists_the_caches_left_behind_its_term_then_reads_no_proofs(
    quick_catch_up: None,
) -> None:
    """A cache that sees no change (here the Jobs and Workloads, while the pods move) never
    passes the term's start by its watch: without a relist every owner of the term would be
    proven by reads of its own."""
    fake = FakeKube()
    j = fake.put(JOBS, job("train", parallelism=1, completions=1))
    elector = HandOver(fake)
    async with running(fake, config(), elector=elector) as ctl:
        rt = ctl.state.kinds[next(iter(ctl.state.kinds))]
        fake.put(CONFIG_MAPS, {"metadata": {"name": "lease", "namespace": NAMESPACE}})
        lists = _lists(ctl)
        elector.go.set()  # the term starts past every cache (a write none of them sees)
        await eventually(lambda: ctl.state.freshness.term_rv > 0, what="the term")
        fake.put(PODS, job_pod(j, index=0, created=1))  # the pod cache moves on
        await eventually(lambda: len(rt.pods) == 1, what="the pod in the cache")
        await eventually(lambda: _caught_up(ctl), what="every cache past the term's start")
        assert _lists(ctl) - lists == len(ctl.reflectors) - 1  # all but the pod cache
        fake.put(WORKLOADS, workload(j, {"main": 1}, admitted={"main": 1}))
        await eventually(lambda: live_released(fake) == 1, what="the release")
        assert ctl.stats.proof_reads == 0 and ctl.state.freshness.confirmed is None


@pytest.mark.anyio
async def test_a_quiet_term_relists_nothing_until_one_of_its_caches_moves(
    quick_catch_up: None,
) -> None:
    """Relisting what nothing changes is wasted reads (a quiet pod cache of 100k pods is an
    initial sync's worth): the caches left behind are relisted only once another one moved
    past the term's start, and a cache that was past it from the start (listed after the
    Lease write) has not moved."""
    fake = FakeKube()
    j = fake.put(JOBS, job("train", parallelism=1, completions=1))
    elector = HandOver(fake)
    async with running(fake, config(), elector=elector) as ctl:
        rt = ctl.state.kinds[next(iter(ctl.state.kinds))]
        fake.put(PODS, job_pod(j, index=0, created=1))  # after the lists: only the pods see it
        await eventually(lambda: len(rt.pods) == 1, what="the pod in the cache")
        lists = _lists(ctl)
        before = {r.name: r.stats.lists for r in ctl.reflectors}
        elector.go.set()  # the term starts at the pod's write: the pod cache is past it, unmoved
        await eventually(lambda: ctl.state.freshness.term_rv > 0, what="the term")
        await holds_for(lambda: _lists(ctl) == lists, 0.3, what="no relist in a quiet term")
        fake.put(WORKLOADS, workload(j, {"main": 1}, admitted={"main": 1}))  # this one moves
        await eventually(lambda: live_released(fake) == 1, what="the release")
        assert ctl.stats.proof_reads == 1  # the owner's first release, before the catch-up
        await eventually(lambda: _caught_up(ctl), what="every cache past the term's start")
        relisted = [r.name for r in ctl.reflectors if r.stats.lists > before[r.name]]
        assert relisted == ["jobs.batch@*"]  # the Workloads and the pods moved by themselves


@pytest.mark.anyio
async def test_the_old_leaders_release_seen_as_the_term_begins_is_not_foreign() -> None:
    """A standby's lagging pod watch delivers the old leader's release between the moment the
    standby leads and the moment its workers start: that release predates the term.

    Issue 33, review three, path 4: a standby turned leader reported the old leader's
    releases as foreign in the event-loop turns between leading and knowing its term's
    start.
    """
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


async def test_patches_skipped_after_leadership_was_lost_ask_for_no_retry() -> None:
    """Leadership went between deciding and patching: nothing is in flight or ours, and the
    reconcile ends quietly (the next leader decides)."""
    fake = FakeKube()
    _, key, pods = setup(fake, pods=2, admitted=2)
    async with standby(fake) as (ctl, elector):
        await cached(ctl, key, fake, 2)
        elector.is_leader = False
        decision = (await ctl.reconciler.reconcile(key)).decision
        assert decision is not None and len(decision.releases) == 2
        assert not ctl.state.ledger.expectations.pending(key) and not ctl.state.ledger.ours()
        assert all(gated(fake, p) for p in pods) and ctl.stats.released == 0
