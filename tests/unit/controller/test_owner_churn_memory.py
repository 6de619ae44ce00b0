"""Memory stays flat under owner churn (issue 42): after many owners come, release, and go,
every record the controller keeps per owner and per pod is gone. A record forgotten by one
path and not another is a slow leak on a cluster that runs Jobs for months."""

from __future__ import annotations

from typing import Any

import pytest

from tests.fakekube import FakeKube
from tests.objects import JOBS, WORKLOADS
from tests.polling import eventually
from tests.unit.capcheck import config
from tests.unit.harness import running
from tests.unit.podfactory import NAMESPACE, job, job_pod, workload
from ungater._controller.controller import Controller
from ungater._kube.client import PODS

OWNERS = 12


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def records(ctl: Controller) -> dict[str, int]:
    """Every per-owner and per-pod record the controller's parts keep, by name: the state's
    own count, and the notices' (registered through ``State.forgetters``)."""
    return {**ctl.state.memory(), "inactive": len(ctl.notices._inactive_since)}


@pytest.mark.anyio
async def test_every_record_of_an_owner_and_its_pods_goes_with_them() -> None:
    fake = FakeKube()
    async with running(fake, config()) as ctl:
        made: list[tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]] = []
        for i in range(OWNERS):
            j = fake.put(JOBS, job(f"train-{i}", parallelism=2, completions=2))
            pods = [fake.put(PODS, job_pod(j, index=k, created=1 + k)) for k in range(2)]
            wl = fake.put(WORKLOADS, workload(j, {"main": 2}, admitted={"main": 1}))
            made.append((j, pods, wl))

        def released() -> int:
            return sum(1 for p in fake.items(PODS) if not (p["spec"].get("schedulingGates") or []))

        await eventually(lambda: released() == OWNERS, timeout=10, what="one pod per owner")
        assert records(ctl)["decisions"] == OWNERS  # the records exist while the owners do
        for j, pods, wl in made:
            for p in pods:
                fake.delete(PODS, NAMESPACE, p["metadata"]["name"])
                fake.finalize(PODS, NAMESPACE, p["metadata"]["name"])
            fake.delete(WORKLOADS, NAMESPACE, wl["metadata"]["name"])
            fake.delete(JOBS, NAMESPACE, j["metadata"]["name"])
        kept = {k: v for k, v in records(ctl).items()}

        def all_gone() -> bool:
            nonlocal kept
            kept = {k: v for k, v in records(ctl).items() if v}
            return not kept

        try:
            await eventually(all_gone, timeout=10, what="every record gone")
        except AssertionError:
            raise AssertionError(f"records left after every owner went: {kept}") from None
