"""The controller never decides on a view older than its own write, nor on a stale owner size.

Each test holds back one watch stream (its events keep their order, as a real stream's do,
but arrive late) to open exactly the window a real cluster opens now and then: a JobSet's pods
seen first through the Job kind's pod watch, a Job's shrink seen after the pod deletions it
caused, a foreign release the pod watch has not shown yet.

Before asserting that nothing was released, each test waits until the controller's caches hold
the state it must not act on and a reconcile of the owner taken after that is done
(``tests/seen.py``), so a slow controller cannot pass for a correct one.
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
from tests.seen import cache_holds, cache_lacks, owner_key, reconciled, waiting
from tests.unit.harness import running
from tests.unit.podfactory import (
    GATE,
    NAMESPACE,
    job,
    job_pod,
    jobset,
    jobset_child_job,
    release,
    workload,
)
from ungater._controller.controller import Controller
from ungater._decide.indexes import OwnerKey
from ungater._kube.client import PODS, Resource
from ungater._model.config import Config

JOBSETS = Resource("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def config(*kinds: tuple[str, str]) -> Config:
    return Config.model_validate(
        {
            "mode": "release",  # the test plays Kueue: no other releaser
            "kinds": [{"group": g, "kind": k} for g, k in kinds],
            "expectationsTimeoutSeconds": 30.0,
            "watch": {"backoffInitialSeconds": 0.01, "backoffMaxSeconds": 0.05},
        }
    )


PLUGINS = {"job": job_plugin, "jobset": jobset_plugin}


def live_released(fake: FakeKube) -> list[str]:
    return sorted(
        p["metadata"]["name"]
        for p in fake.items(PODS, NAMESPACE)
        if GATE not in [g["name"] for g in p["spec"].get("schedulingGates") or []]
        and p["status"]["phase"] not in ("Succeeded", "Failed")
        and not p["metadata"].get("deletionTimestamp")
    )


def pod_patches(fake: FakeKube) -> int:
    return len(fake.patches)


@pytest.mark.anyio
async def test_jobset_pod_seen_first_through_the_job_watch_is_not_released_twice() -> None:
    """The Job kind's pod watch (every Job's pods carry the controller-uid label) shows our
    release of a JobSet's pod before the JobSet kind's watch does. That early view must not
    clear what the JobSet reconcile is waiting for, or the JobSet reconcile re-decides on its
    stale view: a second patch of the same pod, refused and reported as a foreign release, or
    worse, another pod released beyond the cap."""
    fake = FakeKube()
    client = Lagging(fake)
    js = fake.put(JOBSETS, jobset("llm", {"workers": 1}))
    js["spec"]["replicatedJobs"][0]["template"]["spec"] = {"parallelism": 6, "completions": 6}
    js = fake.put(JOBSETS, js)
    child = fake.put(JOBS, jobset_child_job(js, "workers", 0, parallelism=6))
    for i in (0, 5):
        fake.put(PODS, job_pod(child, index=i, created=1 + i))
    held = client.hold("pods", jobset_plugin.JOBSET_UID_LABEL)
    async with running(
        client, config(("batch", "Job"), ("jobset.x-k8s.io", "JobSet")), plugins=PLUGINS
    ) as ctl:
        fake.put(WORKLOADS, workload(js, {"workers": 6}, admitted={"workers": 1}))
        await eventually(lambda: pod_patches(fake) == 1, what="the first release")
        first = [p for p in fake.items(PODS, NAMESPACE) if GATE not in str(p["spec"])]
        # the Job watch shows the release at once; the JobSet watch holds it back
        await eventually(
            lambda: cache_holds(ctl, "pods", first, job_plugin.CONTROLLER_UID_LABEL),
            what="the release seen through the Job kind's pod watch",
        )
        assert not cache_holds(ctl, "pods", first, jobset_plugin.JOBSET_UID_LABEL), "no lag"
        await reconciled(ctl, owner_key(js))  # on the early view
        assert pod_patches(fake) == 1, "a re-patch of a stale view"
        await holds_for(lambda: pod_patches(fake) == 1, 0.5, what="no re-patch of a stale view")
        assert len(live_released(fake)) == 1
        assert ctl.stats.foreign_releases == 0
        held.set()
        await eventually(
            lambda: cache_holds(ctl, "pods", first, jobset_plugin.JOBSET_UID_LABEL),
            what="the JobSet kind's pod watch caught up",
        )
        await reconciled(ctl, owner_key(js))
        assert len(live_released(fake)) == 1
        await holds_for(lambda: len(live_released(fake)) == 1, 0.3, what="cap 1 once caught up")
        assert pod_patches(fake) == 1
        assert ctl.stats.foreign_releases == 0


def shrinking_job(fake: FakeKube) -> dict[str, Any]:
    """An Indexed Job at parallelism 5 with 3 admitted: pods 0-2 released, 3 and 4 gated."""
    j = fake.put(JOBS, job("train", parallelism=5, completions=5))
    for i in range(5):
        pod = job_pod(j, index=i, created=1 + i)
        fake.put(PODS, release(pod) if i < 3 else pod)
    fake.put(WORKLOADS, workload(j, {"main": 5}, admitted={"main": 3}))
    return j


def pod_at(fake: FakeKube, index: int) -> dict[str, Any]:
    return next(
        p
        for p in fake.items(PODS, NAMESPACE)
        if p["metadata"]["annotations"].get("batch.kubernetes.io/job-completion-index")
        == str(index)
    )


def pod_name(fake: FakeKube, index: int) -> str:
    return str(pod_at(fake, index)["metadata"]["name"])


async def at_cap_three(ctl: Controller, fake: FakeKube, j: dict[str, Any]) -> None:
    """The controller has seen the shrinking Job's pods and slice and keeps pods 3 and 4
    gated."""
    await eventually(
        lambda: (
            cache_holds(ctl, "pods", fake.items(PODS, NAMESPACE))
            and cache_holds(ctl, "workloads", fake.items(WORKLOADS, NAMESPACE))
        ),
        what="the pods and the slice cached",
    )
    decision = await reconciled(ctl, owner_key(j), decided=True)
    assert set(waiting(decision)) == {pod_name(fake, 3), pod_name(fake, 4)}, decision
    assert len(live_released(fake)) == 3


def shrink_to_two(fake: FakeKube, j: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Job shrinks to 2 and its controller deletes pod 0 (terminating: it keeps the Job's
    finalizer): the Job and the victim as they are now."""
    shrunk = fake.put(JOBS, {**j, "spec": {**j["spec"], "parallelism": 2}})
    fake.delete(PODS, NAMESPACE, pod_name(fake, 0))
    victim = pod_at(fake, 0)
    assert victim["metadata"].get("deletionTimestamp")
    return shrunk, victim


@pytest.mark.anyio
async def test_scale_down_does_not_refill_slots_the_owner_gave_up() -> None:
    """The Job shrinks 5 -> 2 and its controller deletes released pods one at a time before
    Kueue lowers the slice's count: the freed slots must not be refilled beyond the Job's
    own size."""
    fake = FakeKube()
    j = shrinking_job(fake)
    async with running(fake, config(("batch", "Job")), plugins=PLUGINS) as ctl:
        await at_cap_three(ctl, fake, j)
        shrunk, victim = shrink_to_two(fake, j)  # the Job controller's first victim
        await eventually(
            lambda: cache_holds(ctl, "jobs", [shrunk]) and cache_holds(ctl, "pods", [victim]),
            what="the shrink and the deletion seen",
        )
        decision = await reconciled(ctl, owner_key(j), decided=True)
        assert len(live_released(fake)) <= 2
        assert set(waiting(decision)) == {pod_name(fake, 3), pod_name(fake, 4)}, decision
        await holds_for(
            lambda: len(live_released(fake)) <= 2, 0.5, what="never more than the Job's 2"
        )


@pytest.mark.anyio
async def test_slot_freed_after_the_cached_owner_is_refilled_only_after_a_fresh_read() -> None:
    """As above, but the Job watch lags: the deletion arrives while the cache still holds the
    Job at parallelism 5. The controller reads the Job before refilling and releases nothing
    beyond its new size; once the Job's own watch catches up nothing changes either."""
    fake = FakeKube()
    client = Lagging(fake)
    j = shrinking_job(fake)
    async with running(client, config(("batch", "Job")), plugins=PLUGINS) as ctl:
        await at_cap_three(ctl, fake, j)
        held = client.hold("jobs")
        shrunk, victim = shrink_to_two(fake, j)
        await eventually(lambda: cache_holds(ctl, "pods", [victim]), what="the deletion seen")
        assert not cache_holds(ctl, "jobs", [shrunk]), "the Job watch shows the shrink"
        decision = await reconciled(ctl, owner_key(j), decided=True)
        assert len(live_released(fake)) <= 2
        assert set(waiting(decision)) == {pod_name(fake, 3), pod_name(fake, 4)}, decision
        await holds_for(lambda: len(live_released(fake)) <= 2, 0.5, what="fresh owner read")
        held.set()
        await eventually(lambda: cache_holds(ctl, "jobs", [shrunk]), what="the shrink seen")
        await reconciled(ctl, owner_key(j))
        assert len(live_released(fake)) <= 2
        await holds_for(lambda: len(live_released(fake)) <= 2, 0.2, what="after the watch")
        # the Job grows back while the slot is still free: the freed slot is refilled
        fake.put(JOBS, {**j, "spec": {**j["spec"], "parallelism": 5}})
        await eventually(lambda: len(live_released(fake)) == 3, what="refilled to cap 3")


@pytest.mark.anyio
async def test_a_refused_patch_on_a_lagging_view_backs_off() -> None:
    """Another writer changed the pod (a label), and our pod watch has not shown it yet: every
    guarded patch is refused. The controller must back off per key (not re-patch in a hot
    loop), and the change is no foreign release."""
    fake = FakeKube()
    client = Lagging(fake)
    j = fake.put(JOBS, job("train", parallelism=2, completions=2))
    pods = [fake.put(PODS, job_pod(j, index=i, created=1 + i)) for i in range(2)]
    held = client.hold("pods")  # the pod watch shows nothing from here on

    def relabel(namespace: str, name: str) -> None:
        pod = fake.read(PODS, namespace, name) or {}
        if name == pods[0]["metadata"]["name"] and "touched" not in pod["metadata"]["labels"]:
            pod["metadata"]["labels"]["touched"] = "yes"
            fake.put(PODS, pod)

    fake.before_patch = relabel
    async with running(client, config(("batch", "Job")), plugins=PLUGINS) as ctl:
        fake.put(WORKLOADS, workload(j, {"main": 2}, admitted={"main": 1}))
        start = anyio.current_time()
        await eventually(
            lambda: ctl.stats.patch_conflicts >= 2, what="the refused patch decided again"
        )
        await anyio.sleep(max(0.0, start + 1.0 - anyio.current_time()))  # a 1 s window
        assert ctl.stats.patch_conflicts <= 8, f"{ctl.stats.patch_conflicts} retries in 1 s"
        assert ctl.stats.foreign_releases == 0
        assert pod_patches(fake) == 0  # refused patches are not applied
        assert len(live_released(fake)) == 0
        held.set()


@pytest.mark.anyio
async def test_a_refused_patch_of_a_pod_another_writer_released_counts_it_and_stops() -> None:
    """Another writer removed our gate, and our pod watch has not shown it yet: our guarded
    patch is refused and the read after it shows the release. It is counted once, and from
    then on the pod counts as released in the lagging view too (``Ledger.released_unseen``):
    the cap is full, so nothing is patched again."""
    fake = FakeKube()
    client = Lagging(fake)
    j = fake.put(JOBS, job("train", parallelism=2, completions=2))
    pods = [fake.put(PODS, job_pod(j, index=i, created=1 + i)) for i in range(2)]
    held = client.hold("pods")  # the pod watch shows nothing from here on

    def rogue(namespace: str, name: str) -> None:
        if name == pods[0]["metadata"]["name"] and GATE in str(fake.read(PODS, namespace, name)):
            fake.put(PODS, release(fake.read(PODS, namespace, name) or {}))

    fake.before_patch = rogue
    async with running(client, config(("batch", "Job")), plugins=PLUGINS) as ctl:
        fake.put(WORKLOADS, workload(j, {"main": 2}, admitted={"main": 1}))
        await eventually(lambda: ctl.stats.foreign_releases == 1, what="the foreign release")
        key = OwnerKey(NAMESPACE, j["metadata"]["uid"])
        await eventually(
            lambda: (
                key in ctl.state.decisions and ctl.state.decisions[key].pod_sets[0].in_flight == 1
            ),
            what="a decision counting the other writer's release",
        )
        await holds_for(lambda: ctl.stats.patch_conflicts == 1, 0.5, what="no patch again")
        assert ctl.stats.foreign_releases == 1
        assert len(live_released(fake)) == 1  # the rogue's release alone: cap 1 holds
        held.set()


@pytest.mark.anyio
async def test_an_owner_grown_back_before_the_lowered_slice_is_seen_waits() -> None:
    """The Job shrinks 4 -> 1, its released pods go, Kueue lowers the slice to 1 in place, and
    the Job grows back to 4 (a replacement slice pending) while the Workload watch still shows
    the slice at 4: the three new pods must wait for the new admission. The Workload watch is
    held (not merely late) until the controller has decided on the new pods, so a slow
    controller cannot wait the window out."""
    fake = FakeKube()
    client = Lagging(fake)
    j = fake.put(JOBS, job("train", parallelism=4, completions=4))
    pods = [fake.put(PODS, release(job_pod(j, index=i, created=1 + i))) for i in range(4)]
    wl = fake.put(WORKLOADS, workload(j, {"main": 4}, admitted={"main": 4}))
    async with running(client, config(("batch", "Job")), plugins=PLUGINS) as ctl:
        await eventually(
            lambda: cache_holds(ctl, "pods", pods) and cache_holds(ctl, "workloads", [wl]),
            what="the released pods and the slice cached",
        )
        held = client.hold("workloads")
        shrunk = fake.put(JOBS, {**j, "spec": {**j["spec"], "parallelism": 1}})
        for p in pods[1:]:
            fake.finalize(PODS, NAMESPACE, p["metadata"]["name"])
            fake.delete(PODS, NAMESPACE, p["metadata"]["name"])
        lowered = fake.put(WORKLOADS, workload(j, {"main": 1}, admitted={"main": 4}))  # in place
        await eventually(
            lambda: (
                cache_lacks(ctl, "pods", [p["metadata"]["uid"] for p in pods[1:]])
                and cache_holds(ctl, "jobs", [shrunk])
            ),
            what="the shrink and the deletions seen",
        )
        fake.put(JOBS, {**j, "spec": {**j["spec"], "parallelism": 4}})
        new = [
            fake.put(PODS, job_pod(j, index=i, created=10 + i, seed="again")) for i in range(1, 4)
        ]
        await eventually(lambda: cache_holds(ctl, "pods", new), what="the new pods cached")
        assert not cache_holds(ctl, "workloads", [lowered]), "the Workload watch shows the lowering"
        decision = await reconciled(ctl, owner_key(j), decided=True)
        assert len(live_released(fake)) <= 1
        assert set(waiting(decision)) == {p["metadata"]["name"] for p in new}, decision
        await holds_for(lambda: len(live_released(fake)) <= 1, 0.3, what="cap 1 until admitted")
        held.set()
        await eventually(lambda: cache_holds(ctl, "workloads", [lowered]), what="lowering seen")
        await reconciled(ctl, owner_key(j))
        assert len(live_released(fake)) <= 1


@pytest.mark.anyio
async def test_a_pod_that_ended_before_the_view_showed_our_release_is_not_repatched() -> None:
    """Our release of pod 0 lands, then pod 0 fails, and the pod watch has shown neither when
    the expectation expires. The API server's answer (released, ended) settles it, but the view
    still shows pod 0 gated and live: it must stay in flight, not be patched again, refused,
    and reported as a release by someone else."""
    fake = FakeKube()
    client = Lagging(fake)
    j = fake.put(JOBS, job("train", parallelism=2, completions=2))
    pods = [fake.put(PODS, job_pod(j, index=i, created=1 + i)) for i in range(2)]
    held = client.hold("pods")
    cfg = config(("batch", "Job")).model_copy(update={"expectations_timeout_seconds": 0.2})
    async with running(client, cfg, plugins=PLUGINS) as ctl:
        fake.put(WORKLOADS, workload(j, {"main": 2}, admitted={"main": 1}))
        await eventually(lambda: pod_patches(fake) == 1, what="the first release")
        ended = fake.read(PODS, NAMESPACE, pods[0]["metadata"]["name"]) or {}
        ended["status"]["phase"] = "Failed"
        fake.put(PODS, ended)
        await anyio.sleep(0.3)  # the expectation expires; a Workload event brings a reconcile
        touched = fake.put(
            WORKLOADS, workload(j, {"main": 2}, admitted={"main": 1}, seed="touched")
        )
        await eventually(lambda: cache_holds(ctl, "workloads", [touched]), what="the touch seen")
        await reconciled(ctl, owner_key(j))  # on the stale pod view, the expectation expired
        assert pod_patches(fake) == 1, "a patch on the stale view"
        await holds_for(lambda: pod_patches(fake) == 1, 0.8, what="no patch on the stale view")
        assert ctl.stats.patch_conflicts == 0
        assert ctl.stats.foreign_releases == 0
        held.set()
        # once the view catches up, the failed pod's slot is refilled with pod 1
        await eventually(
            lambda: live_released(fake) == [pods[1]["metadata"]["name"]], what="refill"
        )
        assert ctl.stats.foreign_releases == 0
        # what we wrote is remembered while a view holds the pod, and forgotten with the pod
        first, second = (p["metadata"]["uid"] for p in pods)
        assert ctl.state.ledger.written_pods() == {first, second}
        fake.finalize(PODS, NAMESPACE, pods[0]["metadata"]["name"])
        fake.delete(PODS, NAMESPACE, pods[0]["metadata"]["name"])
        await eventually(
            lambda: ctl.state.ledger.written_pods() == {second}, what="forgotten when gone"
        )
