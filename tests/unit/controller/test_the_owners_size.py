"""The owner's size (docs/safety.md, "The owner's size"): step 2 of the view reads the owner
(or, for a ``select_via`` kind such as RayJob, each RayCluster between) before a freed slot is
refilled; an owner read gone or replaced, or whose size the plugin cannot read, releases
nothing; a release still waiting for a patch slot is not sent once the cache shows a shrink.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import ungater_plugins.job as job_plugin

from tests.fakekube import FakeKube
from tests.lagging import Lagging
from tests.objects import JOBS, WORKLOADS
from tests.polling import eventually, holds_for
from tests.unit.capcheck import (
    config,
    live_released,
    peak_live_released,
)
from tests.unit.controller.viewkit import (
    JOB,
    Recording,
    cached,
    fenced_job,
    free_a_slot,
    gated,
    name,
    released_by_someone,
    standby,
    synced_then_blind,
)
from tests.unit.harness import owner_version, running
from tests.unit.podfactory import (
    NAMESPACE,
    job,
    job_pod,
    workload,
)
from ungater._decide.indexes import OwnerKey
from ungater._kube.client import PODS, Resource
from ungater._kube.kueue import workload_resource
from ungater.plugin_api import KindSpec, hookimpl

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


JOB_RESOURCE = Resource("batch", "v1", "jobs", "Job")


class LabelOnlyJobs:
    """The Job kind as a third-party plugin might declare it: pods found by their label and
    proven by their ownerReference, but no ``owner_resource`` (the owner is never read, so
    its size is unknown and the old rule applies)."""

    @staticmethod
    @hookimpl
    def ungater_kinds() -> list[KindSpec]:
        return [KindSpec(group="batch", kind="Job", pod_label=job_plugin.CONTROLLER_UID_LABEL)]

    ungater_pod_selector = staticmethod(job_plugin.ungater_pod_selector)
    ungater_owns_pod = staticmethod(job_plugin.ungater_owns_pod)
    ungater_pod_set = staticmethod(job_plugin.ungater_pod_set)
    ungater_sort_key = staticmethod(job_plugin.ungater_sort_key)


class _BrokenSize:
    """The Job plugin, except that reading a Job's size raises (a plugin bug)."""

    @staticmethod
    @hookimpl
    def ungater_owner_facts(owner_object: Mapping[str, Any]) -> Mapping[str, Any]:
        raise ValueError("cannot read this Job")


class _Merged:
    """The Job plugin's hooks with ``_BrokenSize``'s owner facts in place of its own."""

    def __init__(self) -> None:
        for attr in dir(job_plugin):
            if attr.startswith("ungater_") and attr != "ungater_owner_facts":
                setattr(self, attr, getattr(job_plugin, attr))
        self.ungater_owner_facts = _BrokenSize.ungater_owner_facts


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


async def test_a_freed_slot_is_refilled_after_reading_the_job_and_its_slice_fresh() -> None:
    """The fence reads the owner as the plugin names it (batch/v1 jobs, kind Job) and the
    slice at the served Workload version; both agree with the caches, so the freed slot is
    refilled. The reads are the decision's own: the caches keep what their watches showed."""
    fake = FakeKube()
    client = Recording(fake)
    j, key, pods = fenced_job(fake)
    async with standby(fake, client=client) as (ctl, _):
        await synced_then_blind(ctl, fake, key, "jobs")
        fake.put(JOBS, j)  # the Job moves on; the cache does not see it
        await free_a_slot(ctl, fake, key, pods[0])
        client.gets.clear()
        decision = (await ctl.reconciler.reconcile(key)).decision
        assert decision is not None and decision.released_names == [name(pods[2])]
        assert not gated(fake, pods[2])
        reads = [r for r in client.gets if r.plural != "pods"]
        assert sorted(reads, key=lambda r: r.plural) == [
            JOB_RESOURCE,
            JOB_RESOURCE,
            workload_resource(ctl.state.workload_version),
            workload_resource(ctl.state.workload_version),
        ]  # two rounds, equal: the moment the decision rests on
        assert ctl.state.workload_version == "v1beta2"
        now = fake.read(JOBS, NAMESPACE, name(j))
        assert now is not None
        assert int(ctl.state.owners.get(key.uid).resource_version) < int(
            now["metadata"]["resourceVersion"]
        )


@pytest.mark.parametrize("how", ["replaced", "gone"])
async def test_a_freed_slot_is_not_refilled_when_the_fresh_job_is_not_ours(how: str) -> None:
    """The owner read fresh is another object of the same name (another UID), or is gone:
    nothing may be released for it."""
    fake = FakeKube()
    client = Recording(fake)
    j, key, pods = fenced_job(fake)
    async with standby(fake, client=client) as (ctl, _):
        await synced_then_blind(ctl, fake, key, "jobs")
        if how in ("replaced", "gone"):
            fake.delete(JOBS, NAMESPACE, name(j))
        if how == "replaced":
            other = job("train", parallelism=3)
            other["metadata"]["uid"] = key.uid + "-other"
            fake.put(JOBS, other)
        await free_a_slot(ctl, fake, key, pods[0])
        client.gets.clear()
        assert (await ctl.reconciler.reconcile(key)).decision is None
        assert JOB_RESOURCE in client.gets  # it was read
        assert gated(fake, pods[2]) and not fake.patches
        assert key not in ctl.state.decisions and not ctl.state.ledger.expectations.pending(key)


async def test_a_freed_slot_whose_job_was_never_cached_is_refilled_after_reading_it() -> None:
    """The Job watch has not shown the Job at all when a released pod fails: an owner never
    the caches do not stop the view from being read, and the view reads the Job."""
    fake = FakeKube()
    client = Recording(fake)
    async with standby(fake, client=client) as (ctl, _):
        fake.drop_events = {"jobs"}
        j, key, pods = fenced_job(fake)
        await cached(ctl, key, fake, 3)
        released_by_someone(fake, pods[0], phase="Failed")
        await cached(ctl, key, fake, 3)
        assert key.uid not in ctl.state.owners
        client.gets.clear()
        decision = (await ctl.reconciler.reconcile(key)).decision
        assert decision is not None and decision.released_names == [name(pods[2])]
        assert JOB_RESOURCE in client.gets
        assert fake.read(JOBS, NAMESPACE, name(j)) is not None


async def test_a_freed_slot_of_a_kind_whose_owner_is_never_read_is_refilled_without_one() -> None:
    """No owner resource and no objects between: there is no owner to read, so the fence
    view reads only the slice, and the freed slot is refilled under it."""
    fake = FakeKube()
    client = Recording(fake)
    _, key, pods = fenced_job(fake)
    async with standby(fake, client=client, plugins={"label-only": LabelOnlyJobs}) as (ctl, _):
        await cached(ctl, key, fake, 3)
        assert ctl.state.kinds[JOB].handler.spec.owner_resource is None
        released_by_someone(fake, pods[0], phase="Failed")
        await cached(ctl, key, fake, 3)
        client.gets.clear()
        decision = (await ctl.reconciler.reconcile(key)).decision
        assert decision is not None and decision.released_names == [name(pods[2])]
        assert [r.plural for r in client.gets if r.plural != "pods"] == ["workloads"]
        assert key.uid not in ctl.state.owners


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


@pytest.mark.injects(ValueError, reason="the plugin's owner_facts hook raises it")
@pytest.mark.anyio
async def test_an_owner_whose_size_cannot_be_read_releases_nothing() -> None:
    """Issue 26, path 4: an owner whose size the plugin could not read was bounded by the slice
    alone.
    """
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


@pytest.mark.anyio
async def test_a_release_waiting_for_a_patch_slot_is_not_sent_past_a_shrink_the_cache_shows() -> (
    None
):
    """Three pods admitted, one patch at a time (``patchConcurrency: 1``). While the first
    patch is out, the Job shrinks to 1 and the cache shows it: the two releases still waiting
    for a slot must not go out (a send is the decision as it was; path 3 for first sends).

    "Path 3" is issue 33's review three, path 3
    (test_a_refused_release_is_not_resent_past_a_shrink_the_cache_already_shows, in
    test_other_writers.py).
    """
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
