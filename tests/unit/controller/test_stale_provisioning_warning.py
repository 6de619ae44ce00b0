"""Pods bound to a ProvisioningRequest other than the active slice's, in the controller on the
in-memory API server: they stay gated and uncounted, with a Warning Event and a metric. The
decision's part is tested in tests/unit/decide/test_stale_provisioning.py."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.fakekube import FakeKube
from tests.objects import JOBS, PODS, WORKLOADS, job_pod, ungated, workload
from tests.polling import eventually, holds_for
from tests.unit.harness import running
from ungater._decide.decision import CONSUME_PROVISIONING_REQUEST as PR
from ungater._kube.client import EVENTS
from ungater._model.config import Config


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


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
