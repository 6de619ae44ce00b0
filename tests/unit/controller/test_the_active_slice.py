"""The active slice (docs/safety.md, "The active slice"): step 2 of the view reads each cached
live slice of the owner; a slice lowered in place, finished, gone, replaced or owned by another
controller since the Workload watch last showed it caps the decision as read, never as cached.
"""

from __future__ import annotations

from typing import Any

import pytest

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
    _sized,
    cached,
    fenced_job,
    free_a_slot,
    gated,
    released_by_someone,
    setup,
    standby,
    synced_owner,
    synced_then_blind,
)
from tests.unit.harness import owner_version, running
from tests.unit.podfactory import (
    GATE,
    NAMESPACE,
    job,
    job_pod,
    workload,
)
from ungater._decide.indexes import OwnerKey
from ungater._kube.client import PODS, ApiError

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


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


async def test_a_slice_lowered_in_place_is_honoured_from_the_fresh_read() -> None:
    """Kueue lowered the slice to 1 after pod 0 failed; the Workload watch has not shown it.
    The fresh read shows the lowered slice and the freed slot stays free."""
    fake = FakeKube()
    j, key, pods = fenced_job(fake)
    async with standby(fake) as (ctl, _):
        await synced_then_blind(ctl, fake, key, "workloads")
        await free_a_slot(ctl, fake, key, pods[0])
        lowered = fake.put(WORKLOADS, workload(j, {"main": 3}, admitted={"main": 1}))
        decision = (await ctl.reconciler.reconcile(key)).decision
        assert decision is not None and not decision.releases
        assert gated(fake, pods[2]) and not fake.patches
        assert decision.pod_sets[0].cap == 1, lowered


async def test_a_job_shrunk_and_grown_back_unseen_by_the_caches_is_capped_by_its_fresh_slice() -> (
    None
):
    """Issue 40's first path: the Job shrank, its released pod went, Kueue lowered the slice
    to 1 and the Job grew back, all unseen by the Job and Workload watches. The pod watch shows
    the failed pod; the view reads the lowered slice, so the one released pod left fills it."""
    fake = FakeKube()
    j, key, pods = setup(fake, pods=3, admitted=3, released=2)
    async with standby(fake) as (ctl, _):
        await cached(ctl, key, fake, 3)
        await synced_owner(ctl, key)
        fake.drop_events = {"jobs", "workloads"}
        fake.put(WORKLOADS, workload(j, {"main": 1}, admitted={"main": 3}))
        released_by_someone(fake, pods[0], phase="Failed")
        await cached(ctl, key, fake, 3)
        decision = (await ctl.reconciler.reconcile(key)).decision
        assert decision is not None and not decision.releases
        assert gated(fake, pods[2]) and not fake.patches


@pytest.mark.anyio
async def test_a_shrink_that_deletes_gated_pods_is_capped_by_the_slice_read() -> None:
    """Issue 26, path 3: an owner shrank by deleting *gated* pods, Kueue lowered its slice in
    place, and the owner grew back before the Workload watch showed the lowering: the old,
    larger count was used. Checked over the fake's whole history, in resourceVersion order.
    """
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
async def test_the_view_never_falls_back_to_a_cached_slice_it_did_not_read() -> None:
    """The Workload watch stalls after S2 (6) was admitted and before it shows S1 finished. The
    Job shrinks 6 -> 2 (pods deleted: the fence is armed), S2 is lowered in place to 2, the Job
    grows to 3 (S3 admitted at 3, S2 finished), then to 5 (S4 pending). The fence re-reads S2,
    finds it finished, and must not then decide on the cached S1 (4), which it never read.

    Issue 33, review three, path 2: the shrink fence re-read the active slice, found it
    finished, and fell back to an older cached slice it never read.
    """
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


@pytest.mark.parametrize("how", ["replaced", "gone"])
async def test_a_freed_slot_is_not_refilled_when_the_fresh_slice_is_not_ours(how: str) -> None:
    """The slice read fresh is gone, or another Workload of the same name (another UID, even
    one admitting more): no slice is active in the view, and nothing is released."""
    fake = FakeKube()
    j, key, pods = fenced_job(fake)
    async with standby(fake) as (ctl, _):
        await synced_then_blind(ctl, fake, key, "workloads")
        old = ctl.state.workloads.for_owner(key.uid)[0]
        fake.delete(WORKLOADS, NAMESPACE, old.name)
        if how == "replaced":
            other = workload(j, {"main": 3}, admitted={"main": 3})
            other["metadata"]["uid"] = old.uid + "-other"
            fake.put(WORKLOADS, other)
        await free_a_slot(ctl, fake, key, pods[0])
        decision = (await ctl.reconciler.reconcile(key)).decision
        assert decision is not None and not decision.releases and decision.active_slice is None
        assert gated(fake, pods[2]) and not fake.patches


async def test_a_slice_read_back_under_another_owner_is_no_longer_this_owners() -> None:
    """The slice read fresh names another controller (its ownerReference was changed): it is
    not this owner's slice any more, and nothing is released for this one on its count."""
    fake = FakeKube()
    _, key, pods = fenced_job(fake)
    other = fake.put(JOBS, job("other", parallelism=1))
    async with standby(fake) as (ctl, _):
        await synced_then_blind(ctl, fake, key, "workloads")
        (old,) = ctl.state.workloads.for_owner(key.uid)
        reowned = fake.read(WORKLOADS, NAMESPACE, old.name)
        assert reowned is not None
        reowned["metadata"]["ownerReferences"] = workload(other, {"main": 1})["metadata"][
            "ownerReferences"
        ]
        fake.put(WORKLOADS, reowned)
        await free_a_slot(ctl, fake, key, pods[0])
        decision = (await ctl.reconciler.reconcile(key)).decision
        assert decision is not None and not decision.releases and decision.active_slice is None
        assert gated(fake, pods[2]) and not fake.patches
