"""The controller end to end against the in-memory API server: caches, queue, expectations,
patching and fault handling, with the real Job plugin."""

from __future__ import annotations

from typing import Any

import pytest
import ungater_plugins.job as job_plugin

from tests.fakekube import FakeKube
from tests.objects import (
    GATE,
    JOBS,
    PODS,
    WORKLOADS,
    gates_of,
    job_pod,
    ungated,
    with_phase,
    workload,
)
from tests.polling import eventually, holds_for
from tests.seen import seen_then_reconciled
from tests.unit.controller.fake_jobs import NS, make_config, pods, released_indexes, setup_job
from tests.unit.harness import running
from ungater._controller.controller import Controller
from ungater._model.errors import StartupError
from ungater._plugins.registry import PluginRegistry


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def live_released(fake: FakeKube) -> int:
    return sum(
        1 for p in ungated(pods(fake)) if p["status"]["phase"] not in ("Succeeded", "Failed")
    )


@pytest.mark.anyio
async def test_releases_exactly_the_admitted_count_in_index_order() -> None:
    fake = FakeKube()
    owner = setup_job(fake, 4)
    fake.put(WORKLOADS, workload(owner, "train-a", count=4, admitted=2))
    async with running(fake, make_config()) as ctl:
        await eventually(lambda: released_indexes(fake) == [0, 1], what="indexes 0 and 1")
        # both releases seen, and a reconcile decided on them since: nothing more to release
        await seen_then_reconciled(ctl, owner, "pods", fake.items(PODS, NS))
        await holds_for(lambda: released_indexes(fake) == [0, 1], 0.3)
    assert len(fake.patches) == 2


@pytest.mark.anyio
async def test_not_admitted_or_finished_or_evicted_releases_nothing() -> None:
    fake = FakeKube()
    a = setup_job(fake, 2, "pending")
    b = setup_job(fake, 2, "done")
    c = setup_job(fake, 2, "evicted")
    fake.put(WORKLOADS, workload(a, "pending-a", count=2))
    fake.put(WORKLOADS, workload(b, "done-a", count=2, admitted=2, finished=True))
    fake.put(WORKLOADS, workload(c, "evicted-a", count=2, admitted=2, evicted=True))
    async with running(fake, make_config()) as ctl:
        await eventually(lambda: ctl.stats.reconciles >= 3)
        await holds_for(lambda: not fake.patches, 0.3)


@pytest.mark.anyio
async def test_scale_up_through_a_replacement_slice() -> None:
    fake = FakeKube()
    owner = setup_job(fake, 4)
    fake.put(WORKLOADS, workload(owner, "train-a", count=4, admitted=4))
    async with running(fake, make_config()):
        await eventually(lambda: released_indexes(fake) == [0, 1, 2, 3])
        fake.put(JOBS, {**owner, "spec": {"parallelism": 6, "completionMode": "Indexed"}})
        for i in (4, 5):
            fake.put(PODS, job_pod(owner, i))
        fake.put(
            WORKLOADS, workload(owner, "train-b", count=6, replaces="train-a", slice_name="train-a")
        )
        await holds_for(lambda: live_released(fake) == 4, 0.2, what="new pods wait for admission")
        fake.put(
            WORKLOADS,
            workload(
                owner, "train-b", count=6, admitted=6, replaces="train-a", slice_name="train-a"
            ),
        )
        fake.put(WORKLOADS, workload(owner, "train-a", count=4, admitted=4, finished=True))
        await eventually(lambda: released_indexes(fake) == [0, 1, 2, 3, 4, 5])


@pytest.mark.anyio
async def test_finished_pod_frees_its_slot_from_pod_events_alone() -> None:
    fake = FakeKube()
    owner = setup_job(fake, 3)
    fake.put(WORKLOADS, workload(owner, "train-a", count=3, admitted=2))
    async with running(fake, make_config()):
        await eventually(lambda: released_indexes(fake) == [0, 1])
        first = fake.read(PODS, NS, job_pod(owner, 0)["metadata"]["name"])
        assert first is not None
        fake.put(PODS, with_phase(first, "Succeeded"))
        await eventually(lambda: released_indexes(fake) == [0, 1, 2])
        await holds_for(lambda: live_released(fake) <= 2, 0.2)


@pytest.mark.anyio
async def test_in_place_scale_down_caps_at_the_spec_count() -> None:
    fake = FakeKube()
    owner = setup_job(fake, 4)
    fake.put(WORKLOADS, workload(owner, "train-a", count=2, admitted=4))  # spec lowered in place
    async with running(fake, make_config()):
        await eventually(lambda: released_indexes(fake) == [0, 1])
        await holds_for(lambda: released_indexes(fake) == [0, 1], 0.2)


@pytest.mark.anyio
async def test_foreign_pod_with_copied_labels_is_never_released() -> None:
    fake = FakeKube()
    owner = setup_job(fake, 1)
    intruder = job_pod(owner, 5)
    intruder["metadata"]["name"] = "intruder"
    intruder["metadata"]["ownerReferences"] = []
    fake.put(PODS, intruder)
    fake.put(WORKLOADS, workload(owner, "train-a", count=3, admitted=3))
    async with running(fake, make_config()):
        await eventually(lambda: released_indexes(fake) == [0])
        await holds_for(lambda: GATE in gates_of(fake.read(PODS, NS, "intruder") or {}), 0.2)


@pytest.mark.anyio
async def test_only_our_gate_is_removed() -> None:
    fake = FakeKube()
    owner = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "t", "namespace": NS, "uid": "u-t"},
        "spec": {"parallelism": 1, "completionMode": "Indexed"},
    }
    fake.put(JOBS, owner)  # an owner whose size is not known releases nothing
    fake.put(PODS, job_pod(owner, 0, gates=["example.com/other", GATE, "example.com/third"]))
    fake.put(WORKLOADS, workload(owner, "t-a", count=1, admitted=1))
    async with running(fake, make_config()):
        await eventually(lambda: GATE not in gates_of(pods(fake)[0]))
        assert gates_of(pods(fake)[0]) == ["example.com/other", "example.com/third"]


@pytest.mark.anyio
async def test_lost_watch_events_never_over_release_and_expire() -> None:
    """Our patches land but the pod watch never shows them. The controller counts the two pods
    as in flight: when the admission grows by one it releases exactly one more, at once, not
    three; when the expectations expire it reads the pods from the API server, sees them
    released and keeps counting them (no re-patch of a released pod, no false foreign
    release)."""
    fake = FakeKube(strict=True)
    owner = setup_job(fake, 4)
    fake.put(WORKLOADS, workload(owner, "train-a", count=4, admitted=2))
    cfg = make_config(
        expectationsTimeoutSeconds=1.5,
        watch={"backoffInitialSeconds": 0.01, "backoffMaxSeconds": 0.05, "silenceSeconds": 60},
    )

    def lose_pod_events(ns: str, name: str) -> None:
        fake.drop_events = {"pods"}  # from our first patch on, no pod event reaches us

    fake.before_patch = lose_pod_events
    async with running(fake, cfg) as ctl:
        await eventually(lambda: len(fake.patches) == 2, what="two releases")
        assert released_indexes(fake) == [0, 1]
        assert all(GATE in gates_of(p) for p in ctl_pods(ctl)), "the cache never saw them"
        fake.put(WORKLOADS, workload(owner, "train-a", count=4, admitted=3))
        await eventually(lambda: released_indexes(fake) == [0, 1, 2], what="one more, at once")
        assert ctl.state.ledger.expectations.expired_total == 0, "before any expired"
        await holds_for(
            lambda: released_indexes(fake) == [0, 1, 2], 0.6, what="the two still in flight"
        )
        await eventually(
            lambda: ctl.state.ledger.expectations.expired_total >= 2, timeout=5, what="expiry"
        )
        await holds_for(lambda: live_released(fake) == 3, 2.0, what="cap 3 across re-expiry")
        assert len(fake.patches) == 3
        assert ctl.stats.patch_conflicts == 0
        assert ctl.stats.foreign_releases == 0


def ctl_pods(ctl: Controller) -> list[dict[str, Any]]:
    """The pods as the controller's Job pod cache holds them (gates only)."""
    (rt,) = ctl.state.kinds.values()
    return [
        {"spec": {"schedulingGates": [{"name": g} for g in p.gates]}}
        for p in rt.pods.by_uid.values()
    ]


@pytest.mark.anyio
async def test_watch_cuts_resume_and_compaction_relists() -> None:
    """A cut watch resumes from its resourceVersion (the change made while it was down is
    replayed, no relist); a 410 Gone mid-stream after the history was compacted relists, and
    the relist both adds what changed and removes what vanished while no event came."""
    fake = FakeKube(seed=3, max_delay=0.02, strict=True)
    owner = setup_job(fake, 4)
    async with running(fake, make_config()) as ctl:
        lists = sum(r.stats.lists for r in ctl.reflectors)
        fake.cut_watches()
        fake.put(WORKLOADS, workload(owner, "train-a", count=4, admitted=2))
        await eventually(lambda: released_indexes(fake) == [0, 1], what="replayed admission")
        assert sum(r.stats.watch_restarts for r in ctl.reflectors) >= 1
        assert sum(r.stats.lists for r in ctl.reflectors) == lists, "a cut must not relist"
        await eventually(
            lambda: len(ctl_pods(ctl)) == 4 and len(ctl.state.ledger.expectations) == 0
        )
        # now nothing reaches the watches: a released pod goes, the admission grows, and the
        # history that would replay it is compacted under the open streams
        fake.drop_events = True
        fake.delete(PODS, NS, job_pod(owner, 0)["metadata"]["name"])
        fake.put(WORKLOADS, workload(owner, "train-a", count=4, admitted=3))
        fake.drop_events = False
        assert fake.expire_watches() == len(ctl.reflectors)
        await eventually(lambda: released_indexes(fake) == [1, 2, 3], what="relisted view")
        assert all(r.stats.relists_gone == 1 for r in ctl.reflectors)
        assert len(ctl_pods(ctl)) == 3, "the relist dropped the deleted pod"
        await holds_for(lambda: live_released(fake) == 3, 0.3)


@pytest.mark.anyio
async def test_conflicting_writer_is_handled_without_double_counting() -> None:
    """Another writer removes the gate between our decision and our patch: the test op makes the
    patch fail (422), and the controller re-decides instead of releasing an extra pod."""
    fake = FakeKube()
    owner = setup_job(fake, 3)

    def sneak(ns: str, name: str) -> None:
        pod = fake.read(PODS, ns, name)
        if pod is not None and GATE in gates_of(pod):
            pod["spec"]["schedulingGates"] = []
            fake.before_patch = None
            fake.put(PODS, pod)

    fake.before_patch = sneak
    fake.put(WORKLOADS, workload(owner, "train-a", count=3, admitted=2))
    async with running(fake, make_config()) as ctl:
        await eventually(lambda: live_released(fake) == 2)
        await holds_for(lambda: live_released(fake) == 2, 0.3)
        assert ctl.stats.patch_conflicts >= 1
        assert ctl.stats.foreign_releases == 1


@pytest.mark.anyio
async def test_deleted_during_patch_counts_nothing() -> None:
    fake = FakeKube()
    owner = setup_job(fake, 3)

    def vanish(ns: str, name: str) -> None:
        fake.before_patch = None
        fake.delete(PODS, ns, name)

    fake.before_patch = vanish
    fake.put(WORKLOADS, workload(owner, "train-a", count=3, admitted=2))
    async with running(fake, make_config()) as ctl:
        await eventually(lambda: live_released(fake) == 2)
        assert ctl.stats.patch_gone == 1
        await holds_for(lambda: live_released(fake) == 2, 0.2)


@pytest.mark.anyio
async def test_malformed_workload_is_skipped_and_others_work() -> None:
    fake = FakeKube()
    bad = setup_job(fake, 2, "bad")
    good = setup_job(fake, 2, "good")
    broken = workload(bad, "bad-a", count=2, admitted=2)
    broken["status"]["admission"]["podSetAssignments"] = [{"name": "other", "count": 2}]
    fake.put(WORKLOADS, broken)
    nostatus = workload(bad, "bad-b", count=2)
    nostatus["spec"]["podSets"][0].pop("count")
    fake.put(WORKLOADS, nostatus)
    fake.put(WORKLOADS, workload(good, "good-a", count=2, admitted=2))
    async with running(fake, make_config()) as ctl:
        await eventually(lambda: len(fake.patches) == 2)
        await holds_for(lambda: len(fake.patches) == 2, 0.2)
        assert {n for _, n, _ in fake.patches} == {
            job_pod(good, i)["metadata"]["name"] for i in (0, 1)
        }
        assert ctl.stats.reconcile_errors == 0


@pytest.mark.anyio
async def test_workload_api_falls_back_to_v1beta1() -> None:
    fake = FakeKube(served={"kueue.x-k8s.io": ["v1beta1"]})
    ctl = Controller(make_config(), fake, PluginRegistry.from_modules({"job": job_plugin}))
    await ctl.start()
    assert ctl.state.workload_version == "v1beta1"


@pytest.mark.anyio
async def test_missing_kueue_is_a_startup_error() -> None:
    fake = FakeKube(served={})
    ctl = Controller(make_config(), fake, PluginRegistry.from_modules({"job": job_plugin}))
    with pytest.raises(StartupError, match="Kueue"):
        await ctl.start()


def test_kind_without_plugin_is_a_startup_error() -> None:
    config = make_config(kinds=[{"group": "example.com", "kind": "Widget"}])
    with pytest.raises(StartupError, match="Widget"):
        Controller(config, FakeKube(), PluginRegistry.from_modules({"job": job_plugin}))


def test_a_plugin_that_failed_to_load_skips_only_its_kinds() -> None:
    registry = PluginRegistry.from_modules({"job": job_plugin})
    from ungater._plugins.registry import PluginInfo

    registry.plugins["raycluster"] = PluginInfo(
        "raycluster", "ungater", "0.1.0", error="import failed"
    )
    config = make_config(
        kinds=[{"group": "batch", "kind": "Job"}, {"group": "ray.io", "kind": "RayCluster"}]
    )
    ctl = Controller(config, FakeKube(), registry)
    assert [str(k) for k in ctl.state.kinds] == ["Job.batch"]
    assert ctl.stats.skipped_kinds == ["RayCluster.ray.io"]
    strict = make_config(kinds=[{"group": "batch", "kind": "Job"}], plugins={"failOnError": True})
    with pytest.raises(StartupError, match="raycluster"):
        Controller(strict, FakeKube(), registry)
