"""The four ways a correct-looking controller released more than its cap (issue 26), one test
each, every one written to fail on the code before its fix.

1. A new leader decided on a standby cache whose pod watch lagged: it never saw the pod the old
   leader had just released, and released another.
2. A patch whose client gave up (a timeout) landed later, after the pod had been counted as
   gated again and another pod released in its place.
3. An owner shrank by deleting *gated* pods, Kueue lowered its slice in place, and the owner grew
   back before the Workload watch showed the lowering: the old, larger count was used.
4. An owner whose size the plugin could not read was bounded by the slice alone.

Each test checks the invariant over the API server's whole history, in resourceVersion order:
no moment, not only the end, may show more live released pods than the cap.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anyio
import pytest
import ungater_plugins.job as job_plugin

import ungater._controller.controller as controller_module
from tests.fakekube import FakeKube
from tests.lagging import Lagging
from tests.objects import JOBS, WORKLOADS
from tests.polling import eventually, holds_for
from tests.unit.capcheck import (
    CONFIG_MAPS,
    HandOver,
    config,
    live_released,
    peak_live_released,
)
from tests.unit.harness import owner_version, running
from tests.unit.podfactory import NAMESPACE, job, job_pod, workload
from ungater._decide.indexes import OwnerKey
from ungater._kube.client import PODS, ApiError
from ungater.plugin_api import hookimpl


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_a_new_leader_on_a_lagging_cache_does_not_release_past_the_old_leaders_release() -> (
    None
):
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


@pytest.fixture
def quick_catch_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """A term's catch-up in tens of milliseconds instead of seconds."""
    monkeypatch.setattr(controller_module, "CATCH_UP_AFTER_S", 0.05)
    monkeypatch.setattr(controller_module, "CATCH_UP_TICK_S", 0.01)


def _lists(ctl: Any) -> int:
    return sum(r.stats.lists for r in ctl.reflectors)


def _caught_up(ctl: Any) -> bool:
    return all(int(r.resource_version) >= ctl.state.freshness.term_rv for r in ctl.reflectors)


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
        assert ctl.stats.proof_reads == 0 and ctl.state.freshness.proven is None


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


# -- 2. a patch that lands after the client gave up ----------------------------------------------


class LatePatches:
    """A client whose patches of the named pods time out on the client's side and land later
    (``delay`` s after they were sent), as an API server can commit a write after it answered
    504 or after the client stopped waiting."""

    def __init__(self, inner: FakeKube, names: set[str], delay: float) -> None:
        self.inner = inner
        self.names = names
        self.delay = delay
        self.landed: list[str] = []
        self.refused_late: list[str] = []
        self.landing = ""  # the pod whose late patch is being applied now
        self._tg: Any = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def json_patch(self, resource: Any, namespace: Any, name: str, ops: Any) -> Any:
        if name not in self.names:
            return await self.inner.json_patch(resource, namespace, name, ops)
        self.names.discard(name)
        assert self._tg is not None

        async def land() -> None:
            await anyio.sleep(self.delay)
            self.landing = name
            try:
                await self.inner.json_patch(resource, namespace, name, ops)
                self.landed.append(name)
            except ApiError:
                self.refused_late.append(name)

        self._tg.start_soon(land)
        raise TimeoutError("the client gave up waiting (fake)")


@pytest.mark.anyio
async def test_a_patch_that_lands_after_a_timeout_is_counted_until_it_can_no_longer_land() -> None:
    fake = FakeKube()
    j = fake.put(JOBS, job("train", parallelism=2, completions=2))
    idx1 = fake.put(PODS, job_pod(j, index=1, created=2))
    client = LatePatches(fake, {idx1["metadata"]["name"]}, delay=1.0)
    async with anyio.create_task_group() as landings:
        client._tg = landings
        async with running(client, config()) as ctl:
            fake.put(WORKLOADS, workload(j, {"main": 2}, admitted={"main": 1}))
            await eventually(lambda: ctl.stats.patch_errors == 1, what="the timed-out patch")
            # a pod that comes first in order appears; the expectation of the timed-out patch
            # expires (expectationsTimeoutSeconds) while the pod still looks gated
            fake.put(PODS, job_pod(j, index=0, created=1))
            await anyio.sleep(1.2)  # the first patch's late landing has come and gone
            await eventually(lambda: live_released(fake) == 1, what="one pod released")
            await holds_for(lambda: live_released(fake) == 1, 0.3, what="cap 1")
    assert peak_live_released(fake) == 1
    # the late write either landed before anything else was released, or was made unable to
    assert len(client.landed) + len(client.refused_late) == 1


# -- 3. a shrink whose victims were gated pods ---------------------------------------------------


@pytest.mark.anyio
async def test_a_shrink_that_deletes_gated_pods_is_capped_by_the_slice_read() -> None:
    fake = FakeKube()
    client = Lagging(fake)
    j = fake.put(JOBS, job("train", parallelism=4, completions=4))
    pods = [fake.put(PODS, job_pod(j, index=i, created=1 + i)) for i in range(4)]
    refused = {p["metadata"]["name"] for p in pods[2:]}

    def webhook(namespace: str, name: str) -> None:  # refuses pods 2 and 3 for good
        if name in refused:
            raise ApiError(403, 'admission webhook "deny.example" denied the request: no')

    fake.before_patch = webhook
    cfg = config(releaseBlocked={"initialBackoffSeconds": 60, "maxBackoffSeconds": 60})
    async with running(client, cfg) as ctl:
        wl = fake.put(WORKLOADS, workload(j, {"main": 4}, admitted={"main": 4}))
        await eventually(lambda: live_released(fake) == 2, what="pods 0 and 1 released")
        await eventually(lambda: ctl.stats.patch_blocked == 2, what="pods 2 and 3 refused")
        held_jobs, held_wls = client.hold("jobs"), client.hold("workloads")
        # the Job shrinks to 2, its controller deletes the gated pods, Kueue lowers the slice
        fake.put(JOBS, {**j, "spec": {**j["spec"], "parallelism": 2}})
        for p in pods[2:]:
            fake.delete(PODS, NAMESPACE, p["metadata"]["name"])
        lowered = fake.read(WORKLOADS, NAMESPACE, wl["metadata"]["name"]) or {}
        lowered["spec"]["podSets"][0]["count"] = 2
        fake.put(WORKLOADS, lowered)
        # ... and grows back to 4 before our Job and Workload watches show any of it
        fake.put(JOBS, {**j, "spec": {**j["spec"], "parallelism": 4}})
        fake.before_patch = None
        for i in (4, 5):
            fake.put(PODS, job_pod(j, index=i - 2, created=10 + i, seed="again"))
        key = OwnerKey(NAMESPACE, j["metadata"]["uid"])
        await eventually(
            lambda: len(ctl.state.decisions[key].pod_sets[0].waiting) >= 2,
            what="the new pods decided on",
        )
        await holds_for(lambda: live_released(fake) == 2, 0.4, what="cap 2 of the lowered slice")
        held_jobs.set()
        held_wls.set()
        await holds_for(lambda: live_released(fake) == 2, 0.3, what="cap 2 once caught up")
    assert peak_live_released(fake) == 2


@pytest.mark.anyio
async def test_an_owner_that_shrank_and_grew_back_with_no_pod_deleted_is_capped_by_the_slice_read() -> (
    None
):
    """The Job shrinks 4 -> 2 before its controller made pods 2 and 3 (no pod goes), Kueue
    lowers the slice in place, and the Job grows back: the owner watch shows both changes, the
    Workload watch neither. The owner's change alone must fence the slice."""
    fake = FakeKube()
    client = Lagging(fake)
    j = fake.put(JOBS, job("train", parallelism=4, completions=4))
    for i in range(2):
        fake.put(PODS, job_pod(j, index=i, created=1 + i))
    async with running(client, config()) as ctl:
        wl = fake.put(WORKLOADS, workload(j, {"main": 4}, admitted={"main": 4}))
        await eventually(lambda: live_released(fake) == 2, what="pods 0 and 1 released")
        held = client.hold("workloads")
        fake.put(JOBS, {**j, "spec": {**j["spec"], "parallelism": 2}})
        lowered = fake.read(WORKLOADS, NAMESPACE, wl["metadata"]["name"]) or {}
        lowered["spec"]["podSets"][0]["count"] = 2
        fake.put(WORKLOADS, lowered)
        grown = fake.put(JOBS, {**j, "spec": {**j["spec"], "parallelism": 4}})
        key = OwnerKey(NAMESPACE, j["metadata"]["uid"])
        await eventually(
            lambda: owner_version(ctl, key.uid) == int(grown["metadata"]["resourceVersion"]),
            what="the owner watch showed the Job grown back",
        )
        for i in (2, 3):
            fake.put(PODS, job_pod(j, index=i, created=10 + i))
        await eventually(
            lambda: len(ctl.state.decisions[key].pod_sets[0].waiting) == 2, what="pods 2, 3 decided"
        )
        await holds_for(lambda: live_released(fake) == 2, 0.4, what="cap 2 of the lowered slice")
        held.set()
    assert peak_live_released(fake) == 2


# -- 4. an owner whose size cannot be read -------------------------------------------------------


class _BrokenSize:
    """The Job plugin, except that reading a Job's size raises (a plugin bug)."""

    @staticmethod
    @hookimpl
    def ungater_owner_facts(owner_object: Mapping[str, Any]) -> Mapping[str, Any]:
        raise ValueError("cannot read this Job")


@pytest.mark.injects(ValueError, reason="the plugin's owner_facts hook raises it")
@pytest.mark.anyio
async def test_an_owner_whose_size_cannot_be_read_releases_nothing() -> None:
    fake = FakeKube()
    j = fake.put(JOBS, job("train", parallelism=1, completions=1))
    for i in range(2):
        fake.put(PODS, job_pod(j, index=i, created=1 + i))
    async with running(fake, config(), plugins={"job": _Merged()}) as ctl:
        # a slice still admitting 2 while the Job wants 1 (a scale-down Kueue has not seen)
        fake.put(WORKLOADS, workload(j, {"main": 2}, admitted={"main": 2}))
        key = OwnerKey(NAMESPACE, j["metadata"]["uid"])
        await eventually(lambda: key in ctl.state.decisions, what="a decision for the Job")
        await holds_for(lambda: live_released(fake) == 0, 0.3, what="nothing released")
        report = ctl.state.decisions[key].pod_sets[0]
        assert report.cap == 0
        assert "size" in report.problem and "cannot read this Job" in report.problem
        assert ctl.stats.plugin_errors >= 1


class _Merged:
    """The Job plugin's hooks with ``_BrokenSize``'s owner facts in place of its own."""

    def __init__(self) -> None:
        for name in dir(job_plugin):
            if name.startswith("ungater_") and name != "ungater_owner_facts":
                setattr(self, name, getattr(job_plugin, name))
        self.ungater_owner_facts = _BrokenSize.ungater_owner_facts


@pytest.mark.anyio
async def test_an_unanswered_release_whose_fence_is_refused_stays_in_flight() -> None:
    """As above, but a policy refuses the fence (our annotation) for good: the timed-out
    release can still land at any time, so it keeps its slot, and the pod that comes first in
    order waits instead of being released beside it."""
    fake = FakeKube()
    j = fake.put(JOBS, job("train", parallelism=2, completions=2))
    idx1 = fake.put(PODS, job_pod(j, index=1, created=2))
    client = LatePatches(fake, {idx1["metadata"]["name"]}, delay=1.5)
    fences: list[str] = []

    def policy(namespace: str, name: str) -> None:
        if name == idx1["metadata"]["name"] and client.landing != name:
            fences.append(name)
            raise ApiError(403, "pods is forbidden: annotations are managed by the platform")

    async with anyio.create_task_group() as landings:
        client._tg = landings
        async with running(client, config()) as ctl:
            fake.put(WORKLOADS, workload(j, {"main": 2}, admitted={"main": 1}))
            await eventually(lambda: ctl.stats.patch_errors == 1, what="the timed-out patch")
            fake.before_patch = policy
            fake.put(PODS, job_pod(j, index=0, created=1))
            await eventually(lambda: len(fences) >= 1, what="a fence refused")
            key = OwnerKey(NAMESPACE, j["metadata"]["uid"])
            await eventually(
                lambda: (
                    key in ctl.state.decisions
                    and ctl.state.decisions[key].pod_sets[0].in_flight == 1
                ),
                what="a decision counting the unanswered release",
            )
            assert live_released(fake) == 0
            await eventually(lambda: client.landed, timeout=5, what="the late landing")
            fake.before_patch = None
            await holds_for(lambda: live_released(fake) == 1, 0.5, what="cap 1")
    assert peak_live_released(fake) == 1
