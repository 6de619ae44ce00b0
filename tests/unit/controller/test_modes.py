"""``mode: auto`` (the default): Kueue's own gate is released only while an admission policy
guards it, audited otherwise; the pure rule, then the controller on the in-memory API server
as the policy comes and goes."""

from __future__ import annotations

import logging
from typing import Any

import anyio
import pytest

from tests.fakekube import FakeKube
from tests.objects import JOBS, PODS, WORKLOADS, job_pod, ungated, workload
from tests.polling import eventually, holds_for
from tests.seen import seen_then_reconciled
from tests.unit.harness import running
from ungater._controller.modes import effective_mode
from ungater._kube.gateguard import BINDINGS, GUARDS_GATE_ANNOTATION, POLICIES
from ungater._kube.kueue import SELF_RELEASED_GATES
from ungater._model.config import DEFAULT_GATE, Config

NS = "team-a"
OWN_GATE = "example.com/own-gate"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# -- the rule ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("configured", "gate", "guard", "checks_on", "mode"),
    [
        ("auto", DEFAULT_GATE, "guarded", True, "release"),
        ("auto", DEFAULT_GATE, "unguarded", True, "audit"),
        ("auto", DEFAULT_GATE, "unknown", True, "audit"),
        ("auto", DEFAULT_GATE, None, True, "audit"),  # not checked yet
        ("auto", DEFAULT_GATE, "guarded", False, "audit"),  # checks off: no guard to trust
        ("auto", OWN_GATE, "unguarded", True, "release"),
        ("auto", OWN_GATE, None, False, "release"),
        ("release", DEFAULT_GATE, "unguarded", True, "release"),
        ("audit", DEFAULT_GATE, "guarded", True, "audit"),
        ("audit", OWN_GATE, None, True, "audit"),
    ],
)
def test_the_effective_mode(
    configured: str, gate: str, guard: str | None, checks_on: bool, mode: str
) -> None:
    assert effective_mode(configured, gate, guard, checks_on).mode == mode


def test_kueues_gate_is_the_one_it_releases_itself() -> None:
    assert DEFAULT_GATE in SELF_RELEASED_GATES and OWN_GATE not in SELF_RELEASED_GATES


def test_the_reason_names_what_decided() -> None:
    assert "no admission policy" in effective_mode("auto", DEFAULT_GATE, "unguarded", True).why
    assert "policyCheckIntervalSeconds: 0" in effective_mode("auto", DEFAULT_GATE, None, False).why
    assert "could not be read" in effective_mode("auto", DEFAULT_GATE, "unknown", True).why
    assert "refuses it to Kueue" in effective_mode("auto", DEFAULT_GATE, "guarded", True).why


# -- the controller ------------------------------------------------------------------------------


def make_config(**overrides: Any) -> Config:
    raw: dict[str, Any] = {
        "kinds": [{"group": "batch", "kind": "Job"}],
        "expectationsTimeoutSeconds": 2.0,
        "watch": {"backoffInitialSeconds": 0.01, "backoffMaxSeconds": 0.05},
        "audit": {"reportAfterSeconds": 0},
        "policyCheckIntervalSeconds": 0.2,
    }
    raw.update(overrides)
    return Config.model_validate(raw)


def guard_gate(fake: FakeKube, gate: str = DEFAULT_GATE) -> None:
    """What the chart's admissionPolicy.enabled installs, as the guard reads it."""
    fake.put(
        POLICIES,
        {"metadata": {"name": "guard", "annotations": {GUARDS_GATE_ANNOTATION: gate}}},
    )
    fake.put(
        BINDINGS,
        {
            "metadata": {"name": "guard"},
            "spec": {"policyName": "guard", "validationActions": ["Deny"]},
        },
    )


def unguard(fake: FakeKube) -> None:
    fake.delete(BINDINGS, "", "guard")
    fake.delete(POLICIES, "", "guard")


def job(fake: FakeKube, name: str, n: int, gate: str = DEFAULT_GATE) -> dict[str, Any]:
    owner = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}"},
        "spec": {"parallelism": n, "completionMode": "Indexed"},
    }
    fake.put(JOBS, owner)
    for i in range(n):
        fake.put(PODS, job_pod(owner, i, gates=[gate]))
    return owner


def messages(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level]


@pytest.mark.anyio
async def test_auto_releases_kueues_gate_behind_the_policy() -> None:
    fake = FakeKube()
    guard_gate(fake)
    a = job(fake, "a", 3)
    fake.put(WORKLOADS, workload(a, "a-1", count=3, admitted=2))
    async with running(fake, make_config(), observed=True) as ctl:
        await eventually(lambda: len(ungated(fake.items(PODS, NS))) == 2, what="2 released")
        (rt,) = ctl.state.kinds.values()
        assert (rt.configured, rt.mode) == ("auto", "release")
        line = ctl.status_lines()[0]
        assert line.startswith("Job.batch: release") and "refuses it to Kueue" in line
        assert ctl.metrics is not None
        text = ctl.metrics.render().decode()
        assert 'ungater_mode{kind="Job.batch",mode="release"} 1.0' in text
        assert 'ungater_mode{kind="Job.batch",mode="audit"} 0.0' in text


@pytest.mark.anyio
async def test_auto_audits_kueues_gate_without_the_policy_and_says_how_to_release(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="ungater")
    fake = FakeKube()
    a = job(fake, "a", 3)
    fake.put(WORKLOADS, workload(a, "a-1", count=3, admitted=2))
    async with running(fake, make_config(), observed=True) as ctl:
        (rt,) = ctl.state.kinds.values()
        await eventually(lambda: a["metadata"]["uid"] in {k.uid for k in ctl.state.decisions})
        await holds_for(lambda: not fake.patches, 0.5, what="no patch over 2 checks")
        assert rt.mode == "audit" and ctl.state.guard.checks >= 2
        line = ctl.status_lines()[0]
        assert line.startswith("Job.batch: audit") and "no admission policy" in line
        assert ctl.metrics is not None
        text = ctl.metrics.render().decode()
        assert 'ungater_mode{kind="Job.batch",mode="audit"} 1.0' in text
    said = [m for m in messages(caplog, logging.WARNING) if "audit mode" in m]
    assert len(said) == 1, said  # once, not once per check
    assert "admissionPolicy.enabled=true" in said[0] and "mode: release" in said[0]


@pytest.mark.anyio
async def test_auto_follows_the_policy_as_it_goes_and_comes_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="ungater")
    fake = FakeKube()
    guard_gate(fake)
    a = job(fake, "a", 4)
    fake.put(WORKLOADS, workload(a, "a-1", count=4, admitted=1))
    async with running(fake, make_config(), observed=True) as ctl:
        (rt,) = ctl.state.kinds.values()
        await eventually(lambda: len(ungated(fake.items(PODS, NS))) == 1, what="1 released")
        unguard(fake)
        checks = ctl.state.guard.checks
        # within one interval (0.2 s) of the removal, plus the check itself
        with anyio.fail_after(0.6):
            await eventually(lambda: rt.mode == "audit", timeout=0.6, what="audit")
        assert ctl.state.guard.checks <= checks + 2
        patches = len(fake.patches)
        fake.put(WORKLOADS, workload(a, "a-1", count=4, admitted=3))  # room for 2 more
        await holds_for(lambda: len(fake.patches) == patches, 0.5, what="no patch in audit")
        assert len(ungated(fake.items(PODS, NS))) == 1
        switched = [m for m in messages(caplog, logging.WARNING) if "switches to audit" in m]
        assert len(switched) == 1 and "admissionPolicy.enabled=true" in switched[0]
        guard_gate(fake)
        await eventually(lambda: len(ungated(fake.items(PODS, NS))) == 3, what="released again")
        assert rt.mode == "release"
    assert [m for m in messages(caplog, logging.INFO) if "switches to release" in m]


@pytest.mark.anyio
async def test_explicit_release_on_an_unguarded_kueue_gate_warns_and_releases(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="ungater")
    fake = FakeKube()
    a = job(fake, "a", 2)
    fake.put(WORKLOADS, workload(a, "a-1", count=2, admitted=2))
    async with running(fake, make_config(mode="release"), observed=True) as ctl:
        await eventually(lambda: len(ungated(fake.items(PODS, NS))) == 2, what="released")
        (rt,) = ctl.state.kinds.values()
        assert rt.mode == "release"
        assert ctl.status_lines()[0] == f"Job.batch: release (gate {DEFAULT_GATE})"
    (warned,) = [m for m in messages(caplog, logging.WARNING) if "explicitly" in m]
    assert "no admission policy" in warned and "break the cap" in warned


@pytest.mark.anyio
async def test_explicit_release_behind_the_policy_does_not_warn(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="ungater")
    fake = FakeKube()
    guard_gate(fake)
    a = job(fake, "a", 1)
    fake.put(WORKLOADS, workload(a, "a-1", count=1, admitted=1))
    async with running(fake, make_config(mode="release"), observed=True):
        await eventually(lambda: len(ungated(fake.items(PODS, NS))) == 1, what="released")
    assert not [m for m in messages(caplog, logging.WARNING) if "explicitly" in m]


@pytest.mark.anyio
async def test_auto_with_guard_checks_off_audits_kueues_gate_even_behind_a_policy(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="ungater")
    fake = FakeKube()
    guard_gate(fake)  # there, but never looked for
    a = job(fake, "a", 2)
    fake.put(WORKLOADS, workload(a, "a-1", count=2, admitted=2))
    async with running(fake, make_config(policyCheckIntervalSeconds=0), observed=True) as ctl:
        await eventually(lambda: a["metadata"]["uid"] in {k.uid for k in ctl.state.decisions})
        await holds_for(lambda: not fake.patches, 0.3, what="no patch")
        (rt,) = ctl.state.kinds.values()
        assert rt.mode == "audit" and ctl.state.guard.checks == 0
    (said,) = [m for m in messages(caplog, logging.WARNING) if "audit mode" in m]
    assert "policyCheckIntervalSeconds: 0" in said


@pytest.mark.anyio
async def test_auto_releases_a_gate_of_its_own_without_any_policy() -> None:
    fake = FakeKube()
    a = job(fake, "a", 2, gate=OWN_GATE)
    fake.put(WORKLOADS, workload(a, "a-1", count=2, admitted=2))
    config = make_config(gate=OWN_GATE, policyCheckIntervalSeconds=0)
    async with running(fake, config, observed=True) as ctl:
        await eventually(lambda: len(ungated(fake.items(PODS, NS))) == 2, what="released")
        assert ctl.status_lines()[0].startswith("Job.batch: release")


@pytest.mark.anyio
async def test_a_switch_to_audit_sends_no_patch_not_yet_sent() -> None:
    """A decision to release 3, taken while guarded: the policy goes after the first patch is
    sent; the two still waiting for a patch slot are never sent."""
    fake = FakeKube()
    guard_gate(fake)
    a = job(fake, "a", 3)
    config = make_config(client={"patchConcurrency": 1}, policyCheckIntervalSeconds=3600)
    async with running(fake, config, observed=True) as ctl:
        (rt,) = ctl.state.kinds.values()
        assert rt.mode == "release"

        async def first_patch(ns: str, name: str) -> None:
            unguard(fake)
            await ctl.state.guard.refresh()  # the periodic check lands while the patch is in flight

        fake.before_patch = first_patch
        fake.put(WORKLOADS, workload(a, "a-1", count=3, admitted=3))
        await eventually(lambda: rt.mode == "audit", what="audit")
        await holds_for(lambda: len(fake.patches) == 1, 0.3, what="only the patch in flight")


@pytest.mark.anyio
async def test_a_kind_that_stood_down_under_auto_stays_in_audit_behind_the_policy() -> None:
    """The stand-down stays the second line of defence: guarded, yet another writer removes
    the gate (the policy bypassed); the kind stands down, and later checks that still find
    the policy do not turn it back to release."""
    fake = FakeKube()
    guard_gate(fake)
    b = job(fake, "b", 3)
    fake.put(WORKLOADS, workload(b, "b-1", count=3))  # pending: nothing of ours to release
    config = make_config(standDown={"foreignReleases": 2, "windowSeconds": 60})
    async with running(fake, config, observed=True) as ctl:
        (rt,) = ctl.state.kinds.values()
        assert rt.mode == "release"
        for name in ("b-0-x000", "b-1-x001"):
            pod = fake.read(PODS, NS, name)
            assert pod is not None
            pod["spec"]["schedulingGates"] = []
            fake.put(PODS, pod)
        await eventually(lambda: rt.stood_down != "", what="stood down")
        checks = ctl.state.guard.checks
        await eventually(lambda: ctl.state.guard.checks >= checks + 2, what="two more checks")
        assert rt.mode == "audit" and ctl.state.guard.status[DEFAULT_GATE].state == "guarded"
        admitted = fake.put(WORKLOADS, workload(b, "b-1", count=3, admitted=3))
        await seen_then_reconciled(ctl, b, "workloads", [admitted])  # the admission seen
        await holds_for(lambda: not fake.patches, 0.3, what="no patch after the stand-down")
