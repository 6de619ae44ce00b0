"""Releases refused for good (admission webhooks, policies, RBAC, validation) and releases that
land on a pod being deleted, end to end on the in-memory API server: the per-pod backoff, the
Event that says why, the retry once the backoff ends. The classification and the decision's part
are tested in tests/unit/decide/test_release_blocked.py."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.fakekube import FakeKube
from tests.objects import GATE, JOBS, PODS, WORKLOADS, job_pod, ungated, workload
from tests.polling import eventually, holds_for
from tests.seen import seen_then_reconciled
from tests.unit.harness import running
from ungater._kube.client import EVENTS, ApiError
from ungater._model.config import Config


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


NS = "team-a"


def make_config() -> Config:
    return Config.model_validate(
        {
            "mode": "release",  # the test plays Kueue: no other releaser
            "kinds": [{"group": "batch", "kind": "Job"}],
            "expectationsTimeoutSeconds": 2.0,
            "watch": {"backoffInitialSeconds": 0.01, "backoffMaxSeconds": 0.05},
        }
    )


def setup_job(fake: FakeKube, n: int, name: str) -> dict[str, Any]:
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


def released(fake: FakeKube, job: str) -> list[str]:
    return sorted(
        p["metadata"]["name"]
        for p in ungated(fake.items(PODS, NS))
        if p["metadata"]["labels"]["batch.kubernetes.io/job-name"] == job
        and not p["metadata"].get("deletionTimestamp")
    )


def events(fake: FakeKube, reason: str) -> list[dict[str, Any]]:
    return [e for e in fake.items(EVENTS, NS) if e["reason"] == reason]


@pytest.mark.anyio
async def test_a_refused_release_backs_off_alone_and_says_why() -> None:
    fake = FakeKube()
    train = setup_job(fake, 3, "train")
    other = setup_job(fake, 2, "other")
    fake.put(WORKLOADS, workload(train, "train-a", count=3, admitted=2))
    fake.put(WORKLOADS, workload(other, "other-a", count=2, admitted=2))
    refused = "train-0-x000"
    attempts: list[str] = []

    def deny(ns: str, name: str) -> None:
        attempts.append(name)
        if name == refused:
            raise ApiError(403, f'pods "{name}" is forbidden: denied by policy no-release')

    fake.before_patch = deny
    async with running(fake, make_config(), observed=True) as ctl:
        await eventually(
            lambda: released(fake, "train") == ["train-1-x001", "train-2-x002"],
            what="the next pods take the refused pod's slot",
        )
        await eventually(lambda: released(fake, "other") == ["other-0-x000", "other-1-x001"])
        await holds_for(lambda: len(released(fake, "train")) == 2, 0.3, what="cap held")
        assert attempts.count(refused) == 1  # backing off: not retried at once
        assert ctl.stats.patch_blocked == 1 and ctl.stats.released == 4
        (entry,) = [
            ctl.state.blocked.get(p["metadata"]["uid"])
            for p in fake.items(PODS, NS)
            if p["metadata"]["name"] == refused
        ]
        assert entry is not None and entry.failures == 1 and entry.status == 403
        decision = ctl.state.decisions[next(k for k in ctl.state.decisions if k.uid == "uid-train")]
        waits = {w.pod: w.reason for ps in decision.pod_sets for w in ps.waiting}
        assert "denied by policy no-release" in waits[refused]
        (ev,) = await eventually(lambda: events(fake, "ReleaseBlocked"), what="the Event")
        assert ev["type"] == "Warning" and ev["involvedObject"]["name"] == "train-a"
        assert refused in ev["message"] and "denied by policy no-release" in ev["message"]
        assert ctl.metrics is not None
        text = ctl.metrics.render().decode()
        assert 'ungater_release_blocked_total{kind="Job.batch"} 1.0' in text
        assert "ungater_pods_release_blocked 1.0" in text
        assert 'ungater_patches_total{outcome="blocked"} 1.0' in text
        # the pod goes away: nothing is blocked any more
        fake.delete(PODS, NS, refused)
        await eventually(lambda: len(ctl.state.blocked) == 0, what="the entry cleared")


@pytest.mark.anyio
async def test_a_blocked_pod_is_retried_after_its_backoff_and_then_released() -> None:
    fake = FakeKube()
    train = setup_job(fake, 1, "train")
    fake.put(WORKLOADS, workload(train, "train-a", count=1, admitted=1))
    denials = [1]

    def deny_once(ns: str, name: str) -> None:
        if denials[0]:
            denials[0] -= 1
            raise ApiError(400, 'admission webhook "x" denied the request')

    fake.before_patch = deny_once
    async with running(fake, make_config(), observed=True) as ctl:
        ctl.state.blocked.initial = 0.2
        await eventually(lambda: released(fake, "train") == ["train-0-x000"], timeout=5)
        assert ctl.stats.patch_blocked == 1 and len(ctl.state.blocked) == 0


@pytest.mark.anyio
async def test_a_pod_whose_deletion_lands_before_our_patch_keeps_its_gate() -> None:
    """The pod starts terminating between our view and our patch: the patch tests the version
    we decided on, so it is refused instead of removing the gate of a pod that runs nothing;
    the re-decision sees the deletion and releases the next pod."""
    fake = FakeKube()
    train = setup_job(fake, 2, "train")
    fake.put(WORKLOADS, workload(train, "train-a", count=2, admitted=2))
    doomed = "train-0-x000"

    def delete_first(ns: str, name: str) -> None:
        if name == doomed:  # the pod's deletion lands between our view and our patch
            pod = copy.deepcopy(fake.read(PODS, ns, name))
            assert pod is not None and not pod["metadata"].get("deletionTimestamp")
            pod["metadata"]["finalizers"] = ["example.com/keep"]  # terminating, not gone
            fake.put(PODS, pod)
            fake.delete(PODS, ns, name)

    fake.before_patch = delete_first
    async with running(fake, make_config(), observed=True) as ctl:
        await eventually(lambda: released(fake, "train") == ["train-1-x001"])
        await eventually(lambda: ctl.stats.released == 1 and ctl.stats.patch_conflicts >= 1)
        # the terminating pod and the release seen, and a reconcile decided on them since
        await seen_then_reconciled(ctl, train, "pods", fake.items(PODS, "team-a"))
        await holds_for(lambda: ctl.stats.released == 1, 0.3)
        doomed_pod = fake.read(PODS, "team-a", doomed) or {}
        assert GATE in str(doomed_pod["spec"].get("schedulingGates"))
        assert ctl.stats.patch_conflicts >= 1 and ctl.stats.released_deleting == 0
        assert ctl.stats.foreign_releases == 0
        assert ctl.metrics is not None
        text = ctl.metrics.render().decode()
        assert 'ungater_pods_released_total{kind="Job.batch",pod_set="main"} 1.0' in text
        assert 'ungater_patches_total{outcome="conflict"}' in text
        (ev,) = await eventually(lambda: events(fake, "Released"))
        assert ev["message"] == "released 1 pod of pod set main"
        assert not events(fake, "ForeignRelease")


@pytest.mark.anyio
async def test_a_refused_pod_is_tried_again_when_its_backoff_ends_despite_an_earlier_wake_up() -> (
    None
):
    """Pod 0's release is refused (it backs off 0.5 s) while pod 1's fails with a 500 in the
    same wave: the failure brings the owner back sooner, which the work queue keeps instead of
    the refusal's later wake-up. That sooner reconcile must set the refused pod's retry again,
    or nothing ever tries pod 0 once more."""
    fake = FakeKube()
    train = setup_job(fake, 2, "train")
    first = {"train-0-x000": ApiError(403, 'admission webhook "deny.example" denied: not yet')}
    errors = {"train-1-x001": ApiError(500, "Internal Server Error")}

    def script(ns: str, name: str) -> None:
        for table in (first, errors):
            if name in table:
                raise table.pop(name)

    fake.before_patch = script
    cfg = make_config().model_copy(
        update={
            "release_blocked": make_config().release_blocked.model_copy(
                update={"initial_backoff_seconds": 0.5}
            )
        }
    )
    async with running(fake, cfg, observed=True) as ctl:
        fake.put(WORKLOADS, workload(train, "train-a", count=2, admitted=2))
        await eventually(lambda: released(fake, "train") == ["train-1-x001"], what="pod 1")
        assert ctl.stats.patch_blocked == 1
        await eventually(
            lambda: released(fake, "train") == ["train-0-x000", "train-1-x001"],
            timeout=3,
            what="pod 0 tried again after its backoff",
        )
