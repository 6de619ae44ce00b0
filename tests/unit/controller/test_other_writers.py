"""Other writers (docs/safety.md, "Other writers"): another writer's release that one view of
ours showed counts in every view; a release refused because another writer's gate went first is
resent only while nothing the decision read has changed.
"""

from __future__ import annotations

from typing import Any

import pytest
import ungater_plugins.job as job_plugin
import ungater_plugins.jobset as jobset_plugin

from tests.fakekube import FakeKube
from tests.lagging import Lagging
from tests.objects import JOBS, WORKLOADS
from tests.polling import eventually, holds_for
from tests.unit.capcheck import (
    config,
    live_released,
    peak_live_released,
)
from tests.unit.controller.viewkit import _sized
from tests.unit.harness import owner_facts, owner_version, running
from tests.unit.podfactory import (
    GATE,
    NAMESPACE,
    job,
    job_pod,
    jobset,
    jobset_child_job,
    workload,
)
from ungater._decide.indexes import OwnerKey
from ungater._kube.client import PODS, Resource

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


OTHER_GATE = "example.com/other-gate"


class ShrinkBeforeResend:
    """A client that, after our release of ``name`` is refused, holds the read the resend is
    built on until ``ready()`` says the controller's caches show the owner shrunk."""

    def __init__(self, inner: FakeKube, name: str) -> None:
        self.inner = inner
        self.name = name
        self.refused = False
        self.ready: Any = None

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)

    async def json_patch(self, resource: Any, namespace: Any, name: str, ops: Any) -> Any:
        try:
            return await self.inner.json_patch(resource, namespace, name, ops)
        except Exception:
            if name == self.name:
                self.refused = True
            raise

    async def get(self, resource: Any, namespace: Any, name: str, *a: Any, **kw: Any) -> Any:
        if name == self.name and self.refused and self.ready is not None:
            await eventually(self.ready, timeout=5, what="the shrink in the caches")
        return await self.inner.get(resource, namespace, name, *a, **kw)


JOBSETS = Resource("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet")


@pytest.mark.anyio
async def test_a_release_by_another_writer_that_one_view_showed_counts_in_a_view_that_lags() -> (
    None
):
    """A JobSet's pods are in two pod watches of ours (the Job kind's and the JobSet kind's).
    Another writer releases pod 5; the Job kind's watch shows it, the JobSet kind's lags. The
    slice admits 1: the JobSet decision, on its lagging view, must count pod 5 (the replica
    knows it runs) and not release pod 0 beside it. Found by the world test (seed 84) once its
    oracle excused only what the deciding replica could not know."""
    fake = FakeKube()
    client = Lagging(fake)
    js = fake.put(JOBSETS, jobset("llm", {"workers": 1}))
    js["spec"]["replicatedJobs"][0]["template"]["spec"] = {"parallelism": 6, "completions": 6}
    js = fake.put(JOBSETS, js)
    child = fake.put(JOBS, jobset_child_job(js, "workers", 0, parallelism=6))
    pods = {i: fake.put(PODS, job_pod(child, index=i, created=1 + i)) for i in (0, 5)}
    kinds = [{"group": "batch", "kind": "Job"}, {"group": "jobset.x-k8s.io", "kind": "JobSet"}]
    plugins = {"job": job_plugin, "jobset": jobset_plugin}
    async with running(client, config(kinds=kinds), plugins=plugins) as ctl:
        held = client.hold("pods", jobset_plugin.JOBSET_UID_LABEL)
        fake.foreign_release(NAMESPACE, pods[5]["metadata"]["name"], GATE)
        await eventually(lambda: ctl.stats.foreign_releases == 1, what="seen via the Job kind")
        key = OwnerKey(NAMESPACE, js["metadata"]["uid"])
        fake.put(WORKLOADS, workload(js, {"workers": 6}, admitted={"workers": 1}))
        await eventually(lambda: key in ctl.state.decisions, what="the JobSet decided on")
        await holds_for(lambda: live_released(fake) == 1, 0.5, what="cap 1, pod 5 counted")
        held.set()
        await holds_for(lambda: live_released(fake) == 1, 0.3, what="cap 1 once caught up")
    assert peak_live_released(fake) == 1


@pytest.mark.anyio
async def test_a_refused_release_is_not_resent_past_a_shrink_the_cache_already_shows() -> None:
    """Pod 2 carries another writer's gate beside ours; that writer removes its gate first, so
    our release is refused on the changed version. Before the resend goes out the Job shrinks
    3 -> 2 and the cache shows it (the shrink fence armed): the resend must not go out.

    Issue 33, review three, path 3: a refused release was resent after the cache already
    showed the owner shrunk below it.
    """
    fake = FakeKube()
    j = fake.put(JOBS, job("train", parallelism=3, completions=3))
    pods = [fake.put(PODS, job_pod(j, index=i, created=1 + i)) for i in range(3)]
    two = pods[2]
    two["spec"]["schedulingGates"].append({"name": OTHER_GATE})
    two = fake.put(PODS, two)
    client = ShrinkBeforeResend(fake, two["metadata"]["name"])

    def other_writer_first(namespace: str, name: str) -> None:
        if name != client.name or fake.before_patch is None:
            return
        fake.before_patch = None
        now = fake.read(PODS, NAMESPACE, name) or {}
        now["spec"]["schedulingGates"] = [
            g for g in now["spec"]["schedulingGates"] if g["name"] != OTHER_GATE
        ]
        fake.put(PODS, now)  # the other writer's release: our patch now tests a stale version
        fake.put(JOBS, _sized(j, 2))  # ... and the Job shrinks to 2

    async with running(client, config()) as ctl:
        key = OwnerKey(NAMESPACE, j["metadata"]["uid"])
        client.ready = lambda: (
            owner_facts(ctl, key.uid)
            and (
                owner_version(ctl, key.uid)
                >= int(fake.read(JOBS, NAMESPACE, "train")["metadata"]["resourceVersion"])
            )
        )
        fake.before_patch = other_writer_first
        fake.put(WORKLOADS, workload(j, {"main": 3}, admitted={"main": 3}))
        await eventually(lambda: client.refused, what="pod 2's release refused")
        await eventually(lambda: live_released(fake) >= 2, what="pods 0 and 1 released")
        await holds_for(lambda: live_released(fake) == 2, 0.5, what="cap 2: the Job's size")
    assert peak_live_released(fake) == 2
