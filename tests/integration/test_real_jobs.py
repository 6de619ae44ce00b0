"""Elastic Indexed Jobs under the real Kueue and the real Job controller.  The Kueue is the
fixtures' default: v0.19.2 (``$UNGATER_KUEUE_VERSION`` if set; v0.17.1 where v0.19.2 cannot be
built, outside CI only).

Kueue's webhook suspends the Job and adds its own gate (``kueue.x-k8s.io/elastic-job``) to the
template; its scheduler admits slices against the ClusterQueue's quota and its ElasticJobUngater
releases its own gate from the pods of an admitted slice, up to the admitted count, in pod name
order.  The templates also carry ``UNGATER_GATE``, which ungater (in-process) is configured to
release: the two releasers act on the same pods and the same real slices, and the watch compares
them (see ``realpeers``).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.jobs import index, scale
from tests.integration.k8s import Kube
from tests.integration.realjobs import pending_slice, pods_of, set_phase, watch
from tests.integration.realpeers import (
    KUEUE_GATE,
    UNGATER_GATE,
    released_by,
)
from tests.integration.support import config_for, running_controller
from tests.objects import JOBS, PODS, gates_of
from tests.polling import eventually
from ungater_devtools.kueue_objects import queued_job

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


async def ours(kube: Kube, ns: str, job: dict[str, Any]) -> list[int]:
    return sorted(index(p) for p in released_by(await pods_of(kube, ns, job), UNGATER_GATE))


@pytest.mark.kueue_quota(cpu=6)
async def test_elastic_job_scales_within_the_real_quota(
    kueue_cluster: Any, kueue_kube: Kube, kueue_namespace: str
) -> None:
    ns = kueue_namespace
    config = config_for(ns, gate=UNGATER_GATE)
    async with running_controller(kueue_cluster.kubeconfig_path, config):
        job = await kueue_kube.create(JOBS, ns, queued_job("train", 2, gate=UNGATER_GATE))
        assert job["spec"]["suspend"] is True, "Kueue's webhook suspends a queued Job"
        gates = [g["name"] for g in job["spec"]["template"]["spec"]["schedulingGates"]]
        assert gates == [UNGATER_GATE, KUEUE_GATE], "Kueue's webhook adds its gate"
        async with watch(kueue_kube, ns, job) as w:
            await w.settle("admitted 2", expect={"main": 2})
            assert await ours(kueue_kube, ns, job) == [0, 1]

            await scale(kueue_kube, ns, "train", 4)
            await w.settle("scaled to 4", expect={"main": 4})
            assert await ours(kueue_kube, ns, job) == [0, 1, 2, 3]

            await scale(kueue_kube, ns, "train", 6)
            await w.settle("scaled to 6", expect={"main": 6})

            # beyond the quota (6 CPUs): the scale-up slice stays pending, the surplus gated
            await scale(kueue_kube, ns, "train", 8)
            await eventually(
                lambda: pending_slice(kueue_kube, ns), timeout=30, what="pending slice"
            )
            await eventually(
                lambda: _count(kueue_kube, ns, job, 8), timeout=30, what="8 pods of train"
            )
            record = await w.settle("scaled to 8, beyond quota", expect={"main": 6})
            assert await ours(kueue_kube, ns, job) == [0, 1, 2, 3, 4, 5]
            assert record.kueue == {"main": 6}

            # back to 3: the pending slice shrinks and is admitted; the Job controller picks
            # which pods go
            await scale(kueue_kube, ns, "train", 3)
            await w.settle("back to 3", expect={"main": 3})
            assert len(await ours(kueue_kube, ns, job)) == 3
    for step in w.steps:
        assert step.ungater == step.admitted


async def _count(kube: Kube, ns: str, job: dict[str, Any], n: int) -> bool:
    return len(await pods_of(kube, ns, job)) == n


@pytest.mark.kueue_quota(cpu=6)
async def test_finished_and_deleted_pods_free_their_slot(
    kueue_cluster: Any, kueue_kube: Kube, kueue_namespace: str
) -> None:
    """A released pod that Succeeded frees its slot for the next index; a released pod that is
    deleted is recreated gated by the Job controller and released again from pod events alone."""
    ns = kueue_namespace
    config = config_for(ns, gate=UNGATER_GATE)
    async with running_controller(kueue_cluster.kubeconfig_path, config):
        job = await kueue_kube.create(JOBS, ns, queued_job("steps", 2, 5, gate=UNGATER_GATE))
        async with watch(kueue_kube, ns, job) as w:
            await w.settle("admitted 2 of 5 completions", expect={"main": 2})
            assert await ours(kueue_kube, ns, job) == [0, 1]

            first = next(p for p in await pods_of(kueue_kube, ns, job) if index(p) == 0)
            await set_phase(kueue_kube, ns, first, "Succeeded")
            await eventually(
                lambda: _indexes_equal(kueue_kube, ns, job, [1, 2]), timeout=30, what="index 2"
            )
            await w.settle("index 0 succeeded", expect={"main": 2})

            victim = next(p for p in await pods_of(kueue_kube, ns, job) if index(p) == 1)
            await kueue_kube.delete(PODS, ns, victim["metadata"]["name"])
            await eventually(
                lambda: _recreated(kueue_kube, ns, job, victim),
                timeout=30,
                what="index 1 recreated",
            )
            await w.settle("index 1 deleted and recreated", expect={"main": 2})
            assert await ours(kueue_kube, ns, job) == [1, 2]


async def _indexes_equal(kube: Kube, ns: str, job: dict[str, Any], want: list[int]) -> bool:
    return await ours(kube, ns, job) == want


async def _recreated(kube: Kube, ns: str, job: dict[str, Any], old: dict[str, Any]) -> bool:
    for p in await pods_of(kube, ns, job):
        if index(p) == index(old) and p["metadata"]["uid"] != old["metadata"]["uid"]:
            return UNGATER_GATE not in gates_of(p)
    return False


@pytest.mark.kueue_quota(cpu=4)
async def test_slot_freed_while_a_scale_up_is_pending(
    kueue_cluster: Any, kueue_kube: Kube, kueue_namespace: str
) -> None:
    """Admitted 4 (all the quota), scaled to 6: the slice waits for quota.  A released pod
    fails: its slot goes to a gated pod at once (the cap is still the admitted 4, not the
    pending 6)."""
    ns = kueue_namespace
    config = config_for(ns, gate=UNGATER_GATE)
    async with running_controller(kueue_cluster.kubeconfig_path, config):
        job = await kueue_kube.create(JOBS, ns, queued_job("pend", 4, gate=UNGATER_GATE))
        async with watch(kueue_kube, ns, job) as w:
            await w.settle("admitted 4", expect={"main": 4})
            await scale(kueue_kube, ns, "pend", 6)
            await eventually(
                lambda: pending_slice(kueue_kube, ns), timeout=30, what="pending slice"
            )
            await eventually(lambda: _count(kueue_kube, ns, job, 6), timeout=30, what="6 pods")
            await w.settle("scale-up to 6 pending", expect={"main": 4})
            assert await ours(kueue_kube, ns, job) == [0, 1, 2, 3]
            # the pod of index 0 succeeds: 3 live released, one slot free under the cap of 4
            first = next(p for p in await pods_of(kueue_kube, ns, job) if index(p) == 0)
            await set_phase(kueue_kube, ns, first, "Succeeded")
            await eventually(
                lambda: _indexes_equal(kueue_kube, ns, job, [1, 2, 3, 4]),
                timeout=30,
                what="index 4",
            )
            await w.settle("slot freed while pending", expect={"main": 4})
