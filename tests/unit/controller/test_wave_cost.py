"""What a release wave costs in requests to the API server: every releasing decision rests on
the view (docs/safety.md, "The view"): a round of reads sent together (the owner and each slice
that may be active), before one patch per pod. One round when it finds what the caches held at
the pods' snapshot; a second when a bound had moved past the caches, until two rounds agree.
These counts are the cost side of docs/safety.md."""

from __future__ import annotations

from collections import Counter
from typing import Any

import anyio
import pytest

from tests.fakekube import FakeKube
from tests.objects import JOBS, WORKLOADS
from tests.polling import eventually
from tests.unit.capcheck import config, live_released
from tests.unit.harness import owner_version, running
from tests.unit.podfactory import NAMESPACE, job, job_pod, workload
from ungater._kube.client import PODS


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


WATCHED = {"pods", "jobs", "workloads"}  # not the gate guard's periodic policy lists


class Counting:
    """The fake, counting the controller's requests about pods, Jobs and Workloads."""

    def __init__(self, inner: FakeKube) -> None:
        self.inner = inner
        self.counts: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def get(self, resource: Any, *a: Any, **kw: Any) -> Any:
        if resource.plural in WATCHED:
            self.counts[f"get {resource.plural}"] += 1
        return await self.inner.get(resource, *a, **kw)

    async def list_objects(self, resource: Any, *a: Any, **kw: Any) -> Any:
        if resource.plural in WATCHED:
            self.counts[f"list {resource.plural}"] += 1
        return await self.inner.list_objects(resource, *a, **kw)

    async def json_patch(self, resource: Any, *a: Any, **kw: Any) -> Any:
        if resource.plural in WATCHED:
            self.counts[f"patch {resource.plural}"] += 1
        return await self.inner.json_patch(resource, *a, **kw)


async def free_a_slot_and_refill(
    fake: FakeKube, client: Counting, j: dict[str, Any], pod: dict[str, Any]
) -> None:
    """A released pod goes (as on a shrink, or a failure) and its replacement comes: count only
    the requests of refilling its slot."""
    client.counts.clear()
    fake.delete(PODS, NAMESPACE, pod["metadata"]["name"])
    fake.finalize(PODS, NAMESPACE, pod["metadata"]["name"])
    index = int(pod["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"])
    fake.put(PODS, job_pod(j, index=index, created=10, seed="again"))
    await eventually(lambda: live_released(fake) == 2, what="the freed slot refilled")
    await anyio.sleep(0.1)


async def job_cached(ctl: Any, j: dict[str, Any]) -> None:
    rv = int(j["metadata"]["resourceVersion"])
    await eventually(lambda: owner_version(ctl, j["metadata"]["uid"]) == rv, what="Job cached")


@pytest.mark.anyio
async def test_an_admission_and_a_scale_up_cost_one_round_of_reads_and_one_patch_per_pod() -> None:
    """The admission's wave and the scale-up's each read the Job and the active slice once,
    since the caches were current (the finished first slice is not read: it can never be the
    active one again)."""
    fake = FakeKube()
    client = Counting(fake)
    j = fake.put(JOBS, job("train", parallelism=4, completions=8))
    for i in range(4):
        fake.put(PODS, job_pod(j, index=i, created=1 + i))
    async with running(client, config()) as ctl:
        await job_cached(ctl, j)
        first = fake.put(WORKLOADS, workload(j, {"main": 4}, admitted={"main": 4}))
        await eventually(lambda: live_released(fake) == 4, what="the admission's wave")
        assert client.counts == {"get jobs": 1, "get workloads": 1, "patch pods": 4}
        client.counts.clear()
        j = fake.put(JOBS, {**j, "spec": {**j["spec"], "parallelism": 6}})
        await job_cached(ctl, j)
        for i in (4, 5):
            fake.put(PODS, job_pod(j, index=i, created=1 + i))
        finished = fake.read(WORKLOADS, NAMESPACE, first["metadata"]["name"]) or {}
        finished["status"]["conditions"].append(
            {"type": "Finished", "status": "True", "reason": "WorkloadSliceReplaced"}
        )
        fake.put(WORKLOADS, finished)
        replaced = f"{NAMESPACE}/{first['metadata']['name']}"
        fake.put(
            WORKLOADS,
            workload(j, {"main": 6}, admitted={"main": 6}, seed="s2", replacement_for=replaced),
        )
        await eventually(lambda: live_released(fake) == 6, what="the scale-up's wave")
        await anyio.sleep(0.1)
        assert client.counts == {"get jobs": 1, "get workloads": 1, "patch pods": 2}


@pytest.mark.anyio
async def test_a_slot_freed_by_a_pod_that_went_costs_one_round_of_two_reads() -> None:
    """A released pod is deleted (as on a shrink, or a failure replaced): the replacement's
    release costs what any wave costs, the owner and its slice read together, once."""
    fake = FakeKube()
    client = Counting(fake)
    j = fake.put(JOBS, job("train", parallelism=2, completions=8))
    pods = [fake.put(PODS, job_pod(j, index=i, created=1 + i)) for i in range(2)]
    async with running(client, config()):
        fake.put(WORKLOADS, workload(j, {"main": 2}, admitted={"main": 2}))
        await eventually(lambda: live_released(fake) == 2, what="the admission's wave")
        await free_a_slot_and_refill(fake, client, j, pods[1])
        assert client.counts == {"get jobs": 1, "get workloads": 1, "patch pods": 1}


@pytest.mark.anyio
async def test_a_wave_whose_owner_moved_past_the_cache_reads_a_second_round() -> None:
    """The Job changed (a label) and the Jobs' watch has not shown it: the first round does not
    find what the caches held, so the view reads again, and decides once two rounds agree."""
    fake = FakeKube()
    client = Counting(fake)
    j = fake.put(JOBS, job("train", parallelism=2, completions=8))
    pods = [fake.put(PODS, job_pod(j, index=i, created=1 + i)) for i in range(2)]
    async with running(client, config()) as ctl:
        await job_cached(ctl, j)
        fake.put(WORKLOADS, workload(j, {"main": 2}, admitted={"main": 2}))
        await eventually(lambda: live_released(fake) == 2, what="the admission's wave")
        fake.lag_watches("jobs")
        labelled = fake.read(JOBS, NAMESPACE, "train") or {}
        labelled["metadata"].setdefault("labels", {})["team"] = "a"
        fake.put(JOBS, labelled)
        await free_a_slot_and_refill(fake, client, j, pods[1])
        assert client.counts == {"get jobs": 2, "get workloads": 2, "patch pods": 1}


@pytest.mark.anyio
async def test_a_slot_freed_after_a_scale_up_reads_only_the_active_slice() -> None:
    """With two slices cached (the finished first and its replacement), the view reads the
    active one only: a finished slice is never active again."""
    fake = FakeKube()
    client = Counting(fake)
    j = fake.put(JOBS, job("train", parallelism=2, completions=8))
    pods = [fake.put(PODS, job_pod(j, index=i, created=1 + i)) for i in range(2)]
    first = workload(j, {"main": 1}, admitted={"main": 1}, finished=True)
    fake.put(WORKLOADS, first)
    replaced = f"{NAMESPACE}/{first['metadata']['name']}"
    fake.put(
        WORKLOADS,
        workload(j, {"main": 2}, admitted={"main": 2}, seed="s2", replacement_for=replaced),
    )
    async with running(client, config()):
        await eventually(lambda: live_released(fake) == 2, what="the wave")
        await free_a_slot_and_refill(fake, client, j, pods[1])
        assert client.counts == {"get jobs": 1, "get workloads": 1, "patch pods": 1}
