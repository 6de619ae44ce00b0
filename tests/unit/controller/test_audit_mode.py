"""Audit mode in the controller on the in-memory API server: it patches nothing, reports what
another releaser does (an over-release, a stall), reads every owner in a one-shot audit, and does
not poll an open stall in a loop. The pure audit is tested in tests/unit/decide/test_audit.py."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests.fakekube import FakeKube
from tests.objects import JOBS, PODS, WORKLOADS, job_pod, workload
from tests.polling import eventually, holds_for
from tests.seen import seen_then_reconciled
from tests.unit.harness import running
from ungater._decide.findings import (
    OVER_RELEASE,
    STALLED,
)
from ungater._kube.client import EVENTS
from ungater._model.config import Config


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


NS = "team-a"


def audit_config(**overrides: Any) -> Config:
    raw: dict[str, Any] = {
        "mode": "audit",
        "kinds": [{"group": "batch", "kind": "Job"}],
        "audit": {"stallSeconds": 0.5, "reportAfterSeconds": 0.2},
        "watch": {"backoffInitialSeconds": 0.01, "backoffMaxSeconds": 0.05},
    }
    raw.update(overrides)
    return Config.model_validate(raw)


def setup_job(fake: FakeKube, n: int, released_ix: set[int]) -> dict[str, Any]:
    owner = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "namespace": NS, "uid": "uid-train"},
        "spec": {"parallelism": n, "completionMode": "Indexed"},
    }
    fake.put(JOBS, owner)
    for i in range(n):
        fake.put(PODS, job_pod(owner, i, gates=[] if i in released_ix else None))
    return owner


@pytest.mark.anyio
async def test_audit_mode_reports_an_over_release_and_never_patches() -> None:
    fake = FakeKube()
    owner = setup_job(fake, 4, released_ix={0, 1, 2})
    fake.put(WORKLOADS, workload(owner, "train-a", count=4, admitted=2))
    async with running(fake, audit_config(), observed=True) as ctl:
        await eventually(lambda: ctl.state.auditor.reported >= 1, what="a reported finding")
        (f,) = ctl.state.auditor.tracker.findings()
        assert (
            f.finding == OVER_RELEASE and f.workload == "train-a" and f.owner == f"Job {NS}/train"
        )
        assert f.pods == ("train-0-x000", "train-1-x001", "train-2-x002")
        ev = await eventually(
            lambda: [e for e in fake.items(EVENTS, NS) if e["reason"] == OVER_RELEASE]
        )
        assert ev[0]["type"] == "Warning" and ev[0]["involvedObject"]["name"] == "train-a"
        assert ctl.metrics is not None
        text = ctl.metrics.render().decode()
        assert 'ungater_audit_findings{finding="OverRelease",kind="Job.batch"} 1.0' in text
        assert (
            'ungater_audit_findings_reported_total{finding="OverRelease",kind="Job.batch"} 1.0'
            in text
        )
        assert 'ungater_audit_findings{finding="Stalled",kind="Job.batch"} 0.0' in text
        await seen_then_reconciled(ctl, owner, "pods", fake.items(PODS, NS))
        await holds_for(lambda: not fake.patches, 0.3, what="audit patches nothing")
        assert ctl.stats.foreign_releases == 0  # others' releases are what audit watches
        fake.put(WORKLOADS, workload(owner, "train-a", count=4, admitted=4))
        resolved = 'ungater_audit_findings{finding="OverRelease",kind="Job.batch"} 0.0'
        await eventually(
            lambda: resolved in ctl.metrics.render().decode(),  # type: ignore[union-attr]
            what="the resolved finding's series at 0",
        )


@pytest.mark.anyio
async def test_audit_mode_reports_a_stall_without_any_event() -> None:
    fake = FakeKube()
    owner = setup_job(fake, 3, released_ix={0})
    fake.put(WORKLOADS, workload(owner, "train-a", count=3, admitted=2))
    async with running(fake, audit_config(), observed=True) as ctl:
        await eventually(
            lambda: any(f.finding == STALLED for f in ctl.state.auditor.tracker.findings()),
            timeout=5,
            what="a stall, from the requeue alone",
        )
        (f,) = [f for f in ctl.state.auditor.tracker.findings() if f.finding == STALLED]
        assert f.pods == ("train-1-x001",)
        # someone releases it: the stall resolves, nothing was patched by us
        pod = fake.read(PODS, NS, "train-1-x001")
        assert pod is not None
        pod["spec"]["schedulingGates"] = []
        fake.put(PODS, pod)
        await eventually(lambda: not ctl.state.auditor.tracker.findings(), what="resolved")
        assert not fake.patches


@pytest.mark.anyio
async def test_an_open_stall_is_not_polled_in_a_loop() -> None:
    fake = FakeKube()
    owner = setup_job(fake, 2, released_ix=set())
    fake.put(WORKLOADS, workload(owner, "train-a", count=2, admitted=1))
    async with running(fake, audit_config(), observed=True) as ctl:
        await eventually(
            lambda: any(f.finding == STALLED for f in ctl.state.auditor.tracker.findings())
        )
        before = ctl.stats.reconciles
        await anyio.sleep(0.5)
        # nothing changes: at most a look or two, not one every 50 ms
        assert ctl.stats.reconciles - before <= 2, ctl.stats.reconciles - before
