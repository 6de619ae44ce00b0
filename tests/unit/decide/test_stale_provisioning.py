"""Pods bound to a ProvisioningRequest other than the active slice's stay gated and uncounted:
the decision, and the controller's Warning Event and metric on the in-memory API server."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest

from tests.fakekube import FakeKube
from tests.objects import JOBS, PODS, WORKLOADS, job_pod, ungated, workload
from tests.polling import eventually, holds_for
from tests.unit.builders import GATE, facts
from tests.unit.builders import workload as raw_workload
from tests.unit.harness import running
from ungater._decide.decision import CONSUME_PROVISIONING_REQUEST as PR
from ungater._decide.decision import PodFacts, decide
from ungater._kube.client import EVENTS
from ungater._model.config import Config
from ungater._model.views import WorkloadView, parse_workload

NS = "team-a"


def with_request(wl: dict[str, Any], request: str, pod_set: str = "main") -> dict[str, Any]:
    """The slice admitted through a ProvisioningRequest check that asks its pods to consume
    ``request``."""
    out = copy.deepcopy(wl)
    out.setdefault("status", {})["admissionChecks"] = [
        {
            "name": "prov",
            "state": "Ready",
            "podSetUpdates": [{"name": pod_set, "annotations": {PR: request}}],
        }
    ]
    return out


def view(request: str | None) -> WorkloadView:
    wl = raw_workload(pod_sets={"main": 4}, admitted={"main": 3})
    return parse_workload(with_request(wl, request) if request else wl)


def bound(name: str, i: int, request: str | None) -> PodFacts:
    f = facts(name, sort_key=(i,))
    extra = {PR: request} if request else {}
    return replace(f, pod=replace(f.pod, annotations={**f.pod.annotations, **extra}))


def test_a_pod_for_another_request_stays_gated_and_takes_no_slot() -> None:
    pods = [
        bound("p0", 0, "pr-old"),
        bound("p1", 1, "pr-new"),
        bound("p2", 2, None),
        bound("p3", 3, "pr-new"),
    ]
    d = decide([view("pr-new")], pods, GATE)
    assert d.released_names == ["p1", "p2", "p3"]  # p0's slot goes to the next one
    (report,) = d.pod_sets
    assert report.stale == ("p0",)
    (why,) = [w.reason for w in report.waiting if w.pod == "p0"]
    assert "stale ProvisioningRequest" in why and "'pr-old'" in why and "'pr-new'" in why
    # the release applies the active slice's annotation to the unbound pod only
    changes = {r.pod.name: dict(r.changes.annotations) for r in d.releases}
    assert changes == {"p1": {}, "p2": {PR: "pr-new"}, "p3": {}}
    # also when pod set updates are not applied, and never without a request in the slice
    assert decide([view("pr-new")], pods, GATE, apply_pod_set_updates=False).pod_sets[0].stale
    assert decide([view(None)], pods, GATE).pod_sets[0].stale == ()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def make_config() -> Config:
    return Config.model_validate(
        {
            "mode": "release",  # the test plays Kueue: no other releaser
            "kinds": [{"group": "batch", "kind": "Job"}],
            "watch": {"backoffInitialSeconds": 0.01, "backoffMaxSeconds": 0.05},
        }
    )


@pytest.mark.anyio
async def test_controller_keeps_stale_pods_gated_and_warns() -> None:
    fake = FakeKube()
    owner = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "namespace": NS, "uid": "uid-train"},
        "spec": {"parallelism": 3, "completionMode": "Indexed"},
    }
    fake.put(JOBS, owner)
    for i in range(3):
        pod = job_pod(owner, i)
        pod["metadata"]["annotations"][PR] = "pr-old" if i == 0 else "pr-new"
        fake.put(PODS, pod)
    fake.put(WORKLOADS, with_request(workload(owner, "train-a", count=3, admitted=3), "pr-new"))
    async with running(fake, make_config(), observed=True) as ctl:
        await eventually(
            lambda: (
                sorted(p["metadata"]["name"] for p in ungated(fake.items(PODS, NS)))
                == ["train-1-x001", "train-2-x002"]
            )
        )
        await holds_for(lambda: len(ungated(fake.items(PODS, NS))) == 2, 0.3)
        ev = await eventually(
            lambda: [e for e in fake.items(EVENTS, NS) if e["reason"] == "StaleProvisioningRequest"]
        )
        assert "train-0-x000" in ev[0]["message"] and "pr-old" in ev[0]["message"]
        assert ctl.metrics is not None
        assert "ungater_pods_stale_provisioning_request 1.0" in ctl.metrics.render().decode()
