"""What a reconcile does beyond the cap, one ``reconcile(key)`` at a time on a controller whose
workers never start (``viewkit.standby``): owners without slices, owners of kinds not
configured, a kind in audit mode, the ``Released`` Event and release metrics, stalled pods, and
pod set updates carried into the release patch. Written to kill the mutants of
``ungater/_controller/reconciler.py`` the whole-controller tests left alive (docs/testing.md).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.clock import ManualClock
from tests.fakekube import FakeKube
from tests.objects import JOBS, WORKLOADS
from tests.polling import eventually
from tests.unit.controller.viewkit import (
    cached,
    config,
    events_of,
    gated,
    name,
    refused_for_good,
    released_by_someone,
    rt_of,
    samples,
    script,
    setup,
    standby,
    synced_owner,
    uid,
)
from tests.unit.podfactory import (
    NAMESPACE,
    job,
    job_pod,
    jobset,
    workload,
)
from ungater._controller.reconciler import Outcome
from ungater._decide.indexes import OwnerKey
from ungater._kube.client import PODS
from ungater._model.views import parse_workload
from ungater._observe.events import released_message

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def with_updates(wl: dict[str, Any], *checks: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    """The Workload with admission checks, each Ready with one pod set update for main."""
    wl["status"]["admissionChecks"] = [
        {
            "name": check,
            "state": "Ready",
            "message": "",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
            "podSetUpdates": [{"name": "main", **update}],
        }
        for check, update in checks
    ]
    return wl


POOL = {"cloud.google.com/gke-nodepool": "pool-a"}


async def test_a_release_is_announced_per_pod_set_with_its_count_and_latency() -> None:
    """Three pods of pod set main released: one ``Released`` Event on the Workload saying so,
    the released counter labelled by kind and pod set, one latency per pod (from the
    slice's Admitted condition)."""
    fake = FakeKube()
    _, key, _ = setup(fake, pods=4, admitted=3)
    async with standby(fake) as (ctl, _):
        await cached(ctl, key, fake, 4)
        await ctl.reconciler.reconcile(key)
        assert samples(ctl.metrics, "ungater_pods_released_total") == {
            (("kind", "Job.batch"), ("pod_set", "main")): 3.0
        }
        assert samples(ctl.metrics, "ungater_release_latency_seconds_count") == {(): 3.0}
        released = await eventually(lambda: events_of(fake, "Released"), timeout=3)
        slice_ = ctl.state.workloads.for_owner(key.uid)[0]
        assert [
            (e["involvedObject"]["kind"], e["involvedObject"]["uid"], e["message"])
            for e in released
        ] == [("Workload", slice_.uid, released_message(3, "main"))]


async def test_released_pods_feed_the_wait_histogram_from_when_room_was_made() -> None:
    """Each released pod's wait counts from the later of its arrival and the last room made
    for its owner (here the slice's admission, after the pods arrived)."""
    fake = FakeKube()
    clock = ManualClock(1000.0)
    j = fake.put(JOBS, job("train", parallelism=3))
    pods = [fake.put(PODS, job_pod(j, index=i)) for i in range(3)]
    key = OwnerKey(NAMESPACE, j["metadata"]["uid"])
    async with standby(fake, clock=clock) as (ctl, _):
        await eventually(lambda: len(rt_of(ctl).pods) == 3, timeout=5)
        clock.now += 100  # the pods waited 100 s for an admission
        fake.put(WORKLOADS, workload(j, {"main": 3}, admitted={"main": 2}))
        await cached(ctl, key, fake, 3)
        clock.now += 2  # then 2 s for us
        await ctl.reconciler.reconcile(key)
        wait = samples(ctl.metrics, "ungater_release_wait_seconds_count")
        total = samples(ctl.metrics, "ungater_release_wait_seconds_sum")
        assert wait == {(("kind", "Job.batch"),): 2.0}
        assert total == {(("kind", "Job.batch"),): 4.0}
        assert sum(not gated(fake, p) for p in pods) == 2


async def test_a_releasable_pod_kept_gated_by_a_refusal_shows_as_stalled_once_past_the_threshold() -> (
    None
):
    """Issue 40: whoever releases, a pod the cap allows that stays gated shows. A refused
    release keeps pod 1 gated; once that has lasted audit.stallSeconds the kind's
    ``ungater_stalled_pods`` counts it, and a decision with nothing held clears it."""
    fake = FakeKube()
    clock = ManualClock(1000.0)
    _, key, pods = setup(fake, pods=2, admitted=2)
    async with standby(fake, clock=clock) as (ctl, _):
        await cached(ctl, key, fake, 2)
        script(fake, {name(pods[1]): refused_for_good()})
        await ctl.reconciler.reconcile(key)
        assert ctl.state.blocked.get(uid(pods[1])) is not None
        stalled = {(("kind", "Job.batch"),): 1.0}
        assert samples(ctl.metrics, "ungater_stalled_pods") == {(("kind", "Job.batch"),): 0.0}
        clock.now += 31.0  # past audit.stallSeconds (30)
        await ctl.reconciler.reconcile(key)
        assert samples(ctl.metrics, "ungater_stalled_pods") == stalled
        released_by_someone(fake, pods[1])
        await cached(ctl, key, fake, 2)
        await ctl.reconciler.reconcile(key)
        assert samples(ctl.metrics, "ungater_stalled_pods") == {(("kind", "Job.batch"),): 0.0}


async def test_an_owner_without_slices_is_forgotten_and_the_others_are_kept() -> None:
    """Its Workload went: the owner's expectations, last decision, audit state and slice
    hand-over notice go with it (even a second time, when nothing is left); another owner's
    stay."""
    fake = FakeKube()
    _, gone_key, _ = setup(fake, pods=1, admitted=1, name="a")
    _, kept_key, _ = setup(fake, pods=1, admitted=1, name="b")
    async with standby(fake) as (ctl, _):
        await eventually(
            lambda: len(rt_of(ctl).pods) == 2 and len(ctl.state.workloads) == 2, timeout=5
        )
        fake.drop_events = {"pods"}  # the releases stay expected
        tracker = ctl.state.auditor.tracker
        for key in (gone_key, kept_key):
            await ctl.reconciler.reconcile(key)
            assert ctl.state.ledger.expectations.pending(key) and key in ctl.state.decisions
            tracker.releasable_since(key, ["u"], 1.0)
            ctl.notices._inactive_since[key] = 1.0
        (wl,) = ctl.state.workloads.for_owner(gone_key.uid)
        fake.delete(WORKLOADS, NAMESPACE, wl.name)
        await eventually(lambda: not ctl.state.workloads.for_owner(gone_key.uid), timeout=3)
        for _ in range(2):
            assert (await ctl.reconciler.reconcile(gone_key)) == Outcome()
        assert (
            not ctl.state.ledger.expectations.pending(gone_key)
            and gone_key not in ctl.state.decisions
        )
        assert tracker.releasable_since(gone_key, ["u"], 2.0) == {"u": 2.0}  # seen anew
        assert gone_key not in ctl.notices._inactive_since
        assert ctl.state.ledger.expectations.pending(kept_key) and kept_key in ctl.state.decisions
        assert tracker.releasable_since(kept_key, ["u"], 2.0) == {"u": 1.0}  # remembered
        assert ctl.notices._inactive_since[kept_key] == 1.0


async def test_an_owner_of_a_kind_not_configured_is_left_alone() -> None:
    """A cached Workload whose owner is a JobSet, with only Jobs configured (the watch would
    not show it; the cache is handed it): no decision, no error."""
    fake = FakeKube()
    js = jobset("llm", {"workers": 1})
    key = OwnerKey(NAMESPACE, js["metadata"]["uid"])
    async with standby(fake) as (ctl, _):
        wl = workload(js, {"workers": 1}, admitted={"workers": 1})
        ctl.state.workloads.on_change(None, parse_workload(wl))
        assert (await ctl.reconciler.reconcile(key)).decision is None
        assert key not in ctl.state.decisions and not fake.patches


async def test_a_kind_in_audit_mode_is_decided_and_recorded_but_never_patched() -> None:
    """``mode: audit`` on the kind: the reconcile makes the same decision (two pods
    releasable), records it, and patches nothing."""
    fake = FakeKube()
    _, key, pods = setup(fake, pods=3, admitted=2)
    cfg = config(kinds=[{"group": "batch", "kind": "Job", "mode": "audit"}])
    async with standby(fake, cfg) as (ctl, _):
        await cached(ctl, key, fake, 3)
        decision = (await ctl.reconciler.reconcile(key)).decision
        assert decision is not None
        assert decision.released_names == [name(pods[0]), name(pods[1])]
        assert ctl.state.decisions[key] is decision
        assert all(gated(fake, p) for p in pods) and not fake.patches
        assert not ctl.state.ledger.expectations.pending(key) and ctl.stats.released == 0


async def test_audit_mode_bounds_what_would_be_released_by_the_owners_size() -> None:
    """The Job shrank to 1 while its slice still admits 2: release mode would refill nothing,
    and audit mode's decision (what release mode would do) says the same."""
    fake = FakeKube()
    j, key, pods = setup(fake, pods=2, admitted=2, released=1)
    j["spec"]["parallelism"] = 1
    fake.put(JOBS, j)
    cfg = config(kinds=[{"group": "batch", "kind": "Job", "mode": "audit"}])
    async with standby(fake, cfg) as (ctl, _):
        await cached(ctl, key, fake, 2)
        await synced_owner(ctl, key)
        decision = (await ctl.reconciler.reconcile(key)).decision
        assert decision is not None and decision.released_names == []
        assert gated(fake, pods[1]) and not fake.patches


async def test_audit_mode_keeps_each_owners_findings_apart() -> None:
    """Two over-released Jobs in audit mode, audited in turn: each finding is dated from its
    own owner's first audit, so both are reported once the grace has passed."""
    fake = FakeKube()
    keys = [setup(fake, pods=2, admitted=1, released=2, name=n)[1] for n in ("a", "b")]
    cfg = config(
        kinds=[{"group": "batch", "kind": "Job", "mode": "audit"}],
        audit={"reportAfterSeconds": 5.0},
    )
    async with standby(fake, cfg) as (ctl, _):
        clock = ManualClock(1000.0)
        ctl.state.auditor.wall_clock = clock
        await eventually(
            lambda: (
                all(len(ctl.state.workloads.for_owner(k.uid)) == 1 for k in keys)
                and len(rt_of(ctl).pods) == 4
            ),
            timeout=5,
            what="both Jobs cached",
        )
        for key in keys:
            await ctl.reconciler.reconcile(key)
        assert ctl.state.auditor.reported == 0
        clock.now += 6.0
        for key in keys:
            await ctl.reconciler.reconcile(key)
        reported = sorted(f.owner for f in ctl.state.auditor.tracker.findings())
        assert ctl.state.auditor.reported == 2
        assert reported == [f"Job {NAMESPACE}/a", f"Job {NAMESPACE}/b"]


@pytest.mark.parametrize("apply", [True, False], ids=["default", "applyPodSetUpdates-false"])
async def test_pod_set_updates_go_into_the_release_patch_unless_turned_off(apply: bool) -> None:
    """An admission check's pod set update (a label and a node selector) is applied in the
    release patch by default, and not with ``applyPodSetUpdates: false``."""
    fake = FakeKube()
    j = fake.put(JOBS, job("train", parallelism=1))
    p = fake.put(PODS, job_pod(j, index=0))
    update = {"labels": {"team": "vision"}, "nodeSelector": POOL}
    fake.put(
        WORKLOADS,
        with_updates(workload(j, {"main": 1}, admitted={"main": 1}), ("prov", update)),
    )
    key = OwnerKey(NAMESPACE, j["metadata"]["uid"])
    cfg = config() if apply else config(applyPodSetUpdates=False)
    async with standby(fake, cfg) as (ctl, _):
        await cached(ctl, key, fake, 1)
        await ctl.reconciler.reconcile(key)
        now = fake.read(PODS, NAMESPACE, name(p))
        assert now is not None and not gated(fake, p)
        labels = now["metadata"]["labels"]
        selector = now["spec"].get("nodeSelector") or {}
        if apply:
            assert labels["team"] == "vision" and selector == POOL
        else:
            assert "team" not in labels and selector == {}


async def test_pods_kept_gated_by_conflicting_updates_are_announced_for_their_owner() -> None:
    """Two admission checks disagree on a label: the pod stays gated, and the warning names
    the owner (a ``PodSetUpdateConflict`` Event on its slice)."""
    fake = FakeKube()
    j = fake.put(JOBS, job("train", parallelism=1))
    p = fake.put(PODS, job_pod(j, index=0))
    fake.put(
        WORKLOADS,
        with_updates(
            workload(j, {"main": 1}, admitted={"main": 1}),
            ("a", {"labels": {"team": "vision"}}),
            ("b", {"labels": {"team": "speech"}}),
        ),
    )
    key = OwnerKey(NAMESPACE, j["metadata"]["uid"])
    async with standby(fake) as (ctl, _):
        await cached(ctl, key, fake, 1)
        decision = (await ctl.reconciler.reconcile(key)).decision
        assert decision is not None and not decision.releases
        assert gated(fake, p) and not fake.patches
        (event,) = await eventually(lambda: events_of(fake, "PodSetUpdateConflict"), timeout=3)
        slice_ = ctl.state.workloads.for_owner(key.uid)[0]
        assert event["involvedObject"]["uid"] == slice_.uid
        assert event["type"] == "Warning"
