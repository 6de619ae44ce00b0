"""Standing down when another writer keeps removing our gate (docs/safety.md, "Other writers")
and the slice hand-over grace for PodsUnmapped, in the controller end to end on the in-memory
API server. The pure stand-down and /readyz's detail lines are tested in
tests/unit/decide/test_standdown.py."""

from __future__ import annotations

import copy
from typing import Any

import anyio
import pytest
import ungater_plugins.job as job_plugin

from tests.fakekube import FakeKube
from tests.objects import JOBS, PODS, WORKLOADS, job_pod, ungated, workload
from tests.polling import eventually, holds_for
from tests.seen import seen_then_reconciled
from tests.unit.harness import running
from ungater._controller.controller import Controller
from ungater._kube.client import EVENTS
from ungater._model.config import Config
from ungater._plugins.registry import PluginRegistry


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


NS = "team-a"


def make_config(**overrides: Any) -> Config:
    raw: dict[str, Any] = {
        "mode": "release",  # the test plays Kueue: no other releaser
        "kinds": [{"group": "batch", "kind": "Job"}],
        "expectationsTimeoutSeconds": 2.0,
        "watch": {"backoffInitialSeconds": 0.01, "backoffMaxSeconds": 0.05},
        "standDown": {"foreignReleases": 2, "windowSeconds": 60},
        "audit": {"reportAfterSeconds": 0},
    }
    raw.update(overrides)
    return Config.model_validate(raw)


def setup_job(fake: FakeKube, name: str, n: int) -> dict[str, Any]:
    owner = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}"},
        "spec": {"parallelism": n, "completionMode": "Indexed"},
    }
    fake.put(JOBS, owner)
    for i in range(n):
        fake.put(PODS, job_pod(owner, i))
    return owner


def strip_gate(fake: FakeKube, name: str) -> None:
    """Another releaser removes the gate."""
    pod = copy.deepcopy(fake.read(PODS, NS, name))
    assert pod is not None
    pod["spec"]["schedulingGates"] = []
    fake.put(PODS, pod)


def events(fake: FakeKube, reason: str) -> list[dict[str, Any]]:
    return [e for e in fake.items(EVENTS, NS) if e["reason"] == reason]


@pytest.mark.anyio
async def test_repeated_foreign_releases_make_the_kind_stand_down_to_audit() -> None:
    fake = FakeKube()
    a = setup_job(fake, "a", 3)
    b = setup_job(fake, "b", 2)
    fake.put(WORKLOADS, workload(a, "a-1", count=3, admitted=3))
    fake.put(WORKLOADS, workload(b, "b-1", count=2))  # pending: nothing to release yet
    config = make_config()
    async with running(fake, config, observed=True) as ctl:
        await eventually(lambda: len(ungated(fake.items(PODS, NS))) == 3, what="a released")
        strip_gate(fake, "b-0-x000")
        await eventually(lambda: ctl.stats.foreign_releases == 1)
        (rt,) = ctl.state.kinds.values()
        assert rt.mode == "release" and not rt.stood_down
        strip_gate(fake, "b-1-x001")
        await eventually(lambda: rt.stood_down != "", what="stood down")
        assert rt.mode == "audit"
        patches = len(fake.patches)
        # the second job is admitted now: a stood-down kind patches nothing, it audits
        fake.put(WORKLOADS, workload(b, "b-1", count=2, admitted=1))
        await eventually(
            lambda: any(f.finding == "OverRelease" for f in ctl.state.auditor.tracker.findings()),
            what="the over-release of b reported by audit",
        )
        await holds_for(lambda: len(fake.patches) == patches, 0.3, what="no more patches")
        stood = await eventually(lambda: events(fake, "StoodDown"), what="StoodDown events")
        assert {e["involvedObject"]["name"] for e in stood} == {"a-1", "b-1"}
        assert "switched to audit mode" in stood[0]["message"]
        assert ctl.metrics is not None
        text = ctl.metrics.render().decode()
        assert 'ungater_stood_down{kind="Job.batch"} 1.0' in text
        line, guard = ctl.status_lines()
        assert line.startswith("Job.batch: audit") and "STOOD DOWN" in line
        assert guard.startswith("gate kueue.x-k8s.io/elastic-job: not guarded")


@pytest.mark.anyio
async def test_a_stood_down_kind_stands_back_up_and_releases_what_was_admitted_meanwhile() -> None:
    """The stand-down is not for good: with no other writer at work for resumeAfterSeconds,
    the kind releases again, and a Job admitted while it audited gets its pods."""
    fake = FakeKube()
    b = setup_job(fake, "b", 3)
    fake.put(WORKLOADS, workload(b, "b-1", count=3))  # pending
    config = make_config(standDown={"foreignReleases": 1, "resumeAfterSeconds": 0.5})
    async with running(fake, config) as ctl:
        (rt,) = ctl.state.kinds.values()
        await eventually(lambda: len(rt.pods) == 3, what="b's pods cached")
        strip_gate(fake, "b-0-x000")
        await eventually(lambda: rt.stood_down != "", what="stood down")
        fake.put(WORKLOADS, workload(b, "b-1", count=3, admitted=2))
        await eventually(lambda: rt.mode == "release", timeout=5, what="stood back up")
        await eventually(
            lambda: len(ungated(fake.items(PODS, NS))) == 2, what="b's second pod released"
        )
        await holds_for(lambda: len(ungated(fake.items(PODS, NS))) == 2, 0.3, what="cap of 2")
        assert not rt.stood_down


@pytest.mark.anyio
async def test_a_gate_removal_seen_only_through_a_relist_is_not_counted_as_foreign() -> None:
    """Issue 40's third path: a relist (after 410 Gone) shows a gate gone but not when it went
    (a previous leader's release looks the same), so it is never evidence of another writer."""
    fake = FakeKube()
    b = setup_job(fake, "b", 2)
    fake.put(WORKLOADS, workload(b, "b-1", count=2))  # pending: we release nothing
    async with running(fake, make_config(standDown={"foreignReleases": 1})) as ctl:
        (rt,) = ctl.state.kinds.values()
        await eventually(lambda: len(rt.pods) == 2, what="b's pods cached")
        fake.drop_events = {"pods"}
        strip_gate(fake, "b-0-x000")
        fake.drop_events = set()
        assert fake.expire_watches("pods") >= 1
        await eventually(
            lambda: not any(p.gates for p in rt.pods.by_uid.values() if p.name == "b-0-x000"),
            what="the relist showing the gate gone",
        )
        await holds_for(lambda: ctl.stats.foreign_releases == 0, 0.2, what="no foreign report")
        assert not rt.stood_down and rt.mode == "release"


@pytest.mark.anyio
async def test_stand_down_exit_ends_the_run_with_an_error() -> None:
    fake = FakeKube()
    b = setup_job(fake, "b", 2)
    fake.put(WORKLOADS, workload(b, "b-1", count=2))
    config = make_config(standDown={"foreignReleases": 2, "action": "exit"})
    registry = PluginRegistry.from_modules({"job": job_plugin})
    ctl = Controller(config, fake, registry)
    stop = anyio.Event()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(ctl.run, stop)
            await ctl.ready.wait()
            strip_gate(fake, "b-0-x000")
            strip_gate(fake, "b-1-x001")
            await eventually(lambda: stop.is_set(), what="the run stopped")
    assert "exiting" in ctl.state.fatal_error


@pytest.mark.anyio
async def test_keep_releasing_only_says_so() -> None:
    fake = FakeKube()
    b = setup_job(fake, "b", 2)
    fake.put(WORKLOADS, workload(b, "b-1", count=2))
    config = make_config(standDown={"foreignReleases": 1, "action": "keepReleasing"})
    async with running(fake, config, observed=True) as ctl:
        strip_gate(fake, "b-0-x000")
        await eventually(lambda: ctl.stats.foreign_releases == 1)
        (rt,) = ctl.state.kinds.values()
        await holds_for(lambda: rt.mode == "release" and not rt.stood_down, 0.2)
        assert not events(fake, "StoodDown")
        assert ctl.state.fatal_error == ""  # nothing asks the process to end


@pytest.mark.anyio
async def test_no_pods_unmapped_warning_during_a_slice_hand_over() -> None:
    fake = FakeKube()
    a = setup_job(fake, "a", 3)
    fake.put(WORKLOADS, workload(a, "a-1", count=2, admitted=2))
    config = make_config(sliceHandoverGraceSeconds=0.5)
    async with running(fake, config, observed=True) as ctl:
        await eventually(lambda: len(ungated(fake.items(PODS, NS))) == 2)
        # Kueue's order: the old slice Finished, then (later) the replacement Admitted
        fake.put(WORKLOADS, workload(a, "a-1", count=2, admitted=2, finished=True))
        fake.put(WORKLOADS, workload(a, "a-2", count=3, replaces="a-1"))
        await holds_for(lambda: not events(fake, "PodsUnmapped"), 0.3, what="within the grace")
        fake.put(WORKLOADS, workload(a, "a-2", count=3, admitted=3, replaces="a-1"))
        await eventually(lambda: len(ungated(fake.items(PODS, NS))) == 3)
        await holds_for(lambda: not events(fake, "PodsUnmapped"), 0.7, what="after the grace")
        # a chain left without an active slice for longer than the grace is reported
        fake.put(WORKLOADS, workload(a, "a-2", count=3, admitted=3, replaces="a-1", evicted=True))
        fake.put(PODS, job_pod(a, 3))  # a new gated pod, so there is something unmapped
        await eventually(lambda: events(fake, "PodsUnmapped"), what="the warning after grace")
        assert ctl.stats.reconciles > 0


@pytest.mark.anyio
async def test_a_standby_never_counts_the_leaders_releases_as_foreign() -> None:
    fake = FakeKube()
    b = setup_job(fake, "b", 2)
    fake.put(WORKLOADS, workload(b, "b-1", count=2))
    async with running(fake, make_config(standDown={"foreignReleases": 1}), observed=True) as ctl:
        ctl.state.leading = lambda: False  # a standby: the leader's releases arrive by the watch
        strip_gate(fake, "b-0-x000")
        await seen_then_reconciled(ctl, b, "pods", fake.items(PODS, NS))  # the removal seen
        await holds_for(lambda: ctl.stats.foreign_releases == 0, 0.3, what="not counted")
        (rt,) = ctl.state.kinds.values()
        assert rt.mode == "release" and not rt.stood_down
        ctl.state.leading = lambda: True
        strip_gate(fake, "b-1-x001")
        await eventually(lambda: ctl.stats.foreign_releases == 1, what="counted when leading")
