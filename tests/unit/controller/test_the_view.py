"""The view (docs/safety.md, "What a view is" and "The pods"): the pods first, from the
cache; then every bound read fresh, together, in rounds repeated until two agree; a read that
fails fails the reconcile. A pod that changed between the view and the patch (gone, replaced,
terminating) is caught by the guarded patch and its owner decided again.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.fakekube import FakeKube
from tests.objects import JOBS, WORKLOADS
from tests.unit.controller.viewkit import (
    Recording,
    cached,
    fenced_job,
    free_a_slot,
    gated,
    name,
    script,
    setup,
    standby,
    synced_owner,
    synced_then_blind,
    uid,
)
from tests.unit.podfactory import (
    NAMESPACE,
    job,
    job_pod,
    workload,
)
from ungater._controller.reconciler import Retry
from ungater._controller.view import SNAPSHOT_ROUNDS
from ungater._decide.indexes import OwnerKey
from ungater._decide.refusals import PatchOutcome
from ungater._kube.client import PODS, ApiError

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_releases_into_new_capacity_read_the_owner_and_slice_after_the_pods() -> None:
    """Admission fills a slice's capacity: the decision still rests on the view (the pods
    from the cache, then the Job and its slice read fresh, together: one round, which finds
    them as the caches held them at the pods' snapshot)."""
    fake = FakeKube()
    client = Recording(fake)
    _, key, _ = setup(fake, pods=2, admitted=2)
    async with standby(fake, client=client) as (ctl, _):
        await cached(ctl, key, fake, 2)
        await synced_owner(ctl, key)
        client.gets.clear()
        decision = (await ctl.reconciler.reconcile(key)).decision
        assert decision is not None and len(decision.released_names) == 2
        reads = sorted(r.plural for r in client.gets if r.plural != "pods")
        assert reads == ["jobs", "workloads"]


async def test_the_bounds_are_read_until_two_rounds_agree_and_nothing_goes_when_they_never_do() -> (
    None
):
    """Bounds read at different moments can combine into a cap that was never true (the
    explorer's resize-no-delete, RayJob, depth 6: a slice read before Kueue lowered it beside
    a RayCluster read after it grew back). The view reads every bound again until two rounds
    show the same versions; an owner whose version moves at every read never gets a release,
    and the reconcile gives up (the worker backs off)."""
    fake = FakeKube()
    client = Recording(fake)
    _, key, pods = fenced_job(fake)
    async with standby(fake, client=client) as (ctl, _):
        await synced_then_blind(ctl, fake, key, "jobs")
        await free_a_slot(ctl, fake, key, pods[0])
        reads = [0]

        def moving(obj: dict[str, Any]) -> dict[str, Any]:
            reads[0] += 1
            obj["metadata"]["resourceVersion"] = str(1000 + reads[0])
            return obj

        client.rewrite["jobs"] = moving
        assert (await ctl.reconciler.reconcile(key)).retry == Retry.MOVING
        assert reads[0] == 1 + SNAPSHOT_ROUNDS
        assert gated(fake, pods[2]) and not fake.patches
        del client.rewrite["jobs"]
        decision = (await ctl.reconciler.reconcile(key)).decision
        assert decision is not None and decision.released_names == [name(pods[2])]


@pytest.mark.parametrize("failing", ["jobs", "workloads"])
async def test_a_view_read_that_fails_refills_nothing_and_fails_the_reconcile(
    failing: str,
) -> None:
    """One of the two reads the fence sends at once fails (a 500): the decision may not fall
    back on the stale view, so the freed slot stays empty and the reconcile fails with that
    error itself (not an exception group), for the worker's backoff."""
    fake = FakeKube()
    client = Recording(fake)
    j, key, pods = fenced_job(fake)
    async with standby(fake, client=client) as (ctl, _):
        await synced_then_blind(ctl, fake, key, "jobs")
        fake.put(JOBS, j)
        await free_a_slot(ctl, fake, key, pods[0])

        def fail(obj: Any) -> Any:
            raise ApiError(500, "Internal Server Error", "")

        client.rewrite[failing] = fail
        with pytest.raises(ApiError) as raised:
            await ctl.reconciler.reconcile(key)
        assert raised.value.status == 500
        assert gated(fake, pods[2])


@pytest.mark.parametrize(
    "error", [ApiError(404, "Not Found"), ApiError(409, "Conflict")], ids=["gone", "conflict"]
)
async def test_a_pod_gone_or_changed_under_the_patch_retries_the_owner(error: ApiError) -> None:
    """The cache was behind the server: re-decide (the outcome asks the worker to back off
    that key); the pod is no longer in flight nor ours."""
    fake = FakeKube()
    _, key, pods = setup(fake, pods=1, admitted=1)
    async with standby(fake) as (ctl, _):
        await cached(ctl, key, fake, 1)
        script(fake, {name(pods[0]): error})
        assert (await ctl.reconciler.reconcile(key)).retry == Retry.CHANGED
        assert not ctl.state.ledger.expectations.pending(key) and not ctl.state.ledger.ours()


async def test_a_pod_that_started_terminating_under_the_patch_keeps_its_gate_and_re_decides() -> (
    None
):
    """The pod started terminating after the view the decision read: the patch tests that
    view's version, so it is refused: no release, no gate removed from a pod that runs
    nothing, the owner re-decided (``Retry.CHANGED``), nothing left in flight or ours."""
    fake = FakeKube()
    j = fake.put(JOBS, job("train", parallelism=1))
    raw = job_pod(j, index=0)
    raw["metadata"]["finalizers"] = ["example.com/keep"]
    p = fake.put(PODS, raw)
    fake.put(WORKLOADS, workload(j, {"main": 1}, admitted={"main": 1}))
    key = OwnerKey(NAMESPACE, j["metadata"]["uid"])
    async with standby(fake) as (ctl, _):
        await cached(ctl, key, fake, 1)
        fake.drop_events = {"pods"}
        fake.delete(PODS, NAMESPACE, name(p))  # terminating, still gated
        assert (await ctl.reconciler.reconcile(key)).retry == Retry.CHANGED
        assert ctl.stats.released == 0 and ctl.stats.patch_conflicts == 1
        assert gated(fake, p)
        assert not ctl.state.ledger.expectations.pending(key) and not ctl.state.ledger.ours()
        assert not ctl.state.ledger.uncertain_pods()


async def test_a_release_landing_on_a_terminating_pod_re_decides_and_keeps_it_expected() -> None:
    """The patch landed on a pod being deleted (outcome ``deleting``): no release, but the
    owner is re-decided (``Retry.CHANGED``) and the pod stays expected and ours, no longer
    uncertain (the answer came)."""
    fake = FakeKube()
    j = fake.put(JOBS, job("train", parallelism=1))
    p = fake.put(PODS, job_pod(j, index=0))
    fake.put(WORKLOADS, workload(j, {"main": 1}, admitted={"main": 1}))
    key = OwnerKey(NAMESPACE, j["metadata"]["uid"])
    async with standby(fake) as (ctl, _):
        await cached(ctl, key, fake, 1)

        async def landed_on_a_terminating_pod(
            releases: Any, rt: Any, **_: Any
        ) -> dict[str, PatchOutcome]:
            return {r.pod.uid: PatchOutcome.DELETING for r in releases}

        ctl.reconciler.patcher.release_all = landed_on_a_terminating_pod  # type: ignore[method-assign]
        assert (await ctl.reconciler.reconcile(key)).retry == Retry.CHANGED
        assert ctl.stats.released == 0
        assert ctl.state.ledger.expectations.pending(key) == {
            uid(p)
        } and ctl.state.ledger.ours() == {uid(p)}
        assert not ctl.state.ledger.uncertain_pods()
