"""Kueue's slice hand-over on the real API server: the old slice is Finished a moment before
its replacement is Admitted. A chain without an active slice for less than
``sliceHandoverGraceSeconds`` gets no PodsUnmapped warning; one left without it longer does."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.jobs import count_pods, make_job, released_indexes, scale
from tests.integration.k8s import Kube
from tests.integration.support import (
    admit,
    config_for,
    create_workload,
    events_with,
    evict,
    finish,
    observed_controller,
)
from tests.objects import PODS, gates_of
from tests.polling import equals, eventually, holds_for
from tests.seen import cache_holds, owner_key, reconciled, waiting

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


async def test_no_pods_unmapped_warning_during_a_hand_over_but_after_the_grace(
    control_plane: Any, kube: Kube, kube_namespace: str
) -> None:
    ns = kube_namespace
    job, sel = await make_job(kube, ns, "train", 2)
    await create_workload(kube, job, "job-train-a", {"main": 2})
    config = config_for(ns, sliceHandoverGraceSeconds=1.5)
    async with observed_controller(control_plane.kubeconfig_path, config) as ctl:
        await admit(kube, ns, "job-train-a", {"main": 2})
        await eventually(lambda: equals(released_indexes(kube, ns, sel), [0, 1]))
        await scale(kube, ns, "train", 3)  # the Job controller adds a gated pod
        await eventually(lambda: count_pods(kube, ns, sel, 3), timeout=30, what="3 pods")
        await create_workload(
            kube, job, "job-train-b", {"main": 3}, replaces="job-train-a", slice_name="job-train-a"
        )
        pods = await kube.list(PODS, ns, sel)
        gated = {p["metadata"]["name"] for p in pods if gates_of(p)}
        assert len(gated) == 1, pods
        # Kueue's order: the old slice finishes, the replacement is admitted a moment later.
        # The moment lasts until the controller has seen the chain without an active slice
        # and decided on it, the gated pod unmapped (the hand-over grace runs from its first
        # such decision)
        finished = await finish(kube, ns, "job-train-a")
        await eventually(
            lambda: cache_holds(ctl, "pods", pods) and cache_holds(ctl, "workloads", [finished]),
            timeout=30,
            what="the pods and the finished slice cached",
        )
        decision = await reconciled(ctl, owner_key(job), decided=True, timeout=30)
        assert decision is not None and decision.active_slice is None, decision
        assert gated <= set(waiting(decision)), decision
        await admit(kube, ns, "job-train-b", {"main": 3})
        await eventually(lambda: equals(released_indexes(kube, ns, sel), [0, 1, 2]))
        await holds_for(
            lambda: _none(events_with(kube, ns, "PodsUnmapped")),
            2.0,
            what="no PodsUnmapped for a hand-over",
        )
        # now the chain really has no active slice (evicted) and a gated pod waits: warned
        await scale(kube, ns, "train", 4)
        await evict(kube, ns, "job-train-b")
        await eventually(
            lambda: events_with(kube, ns, "PodsUnmapped"),
            timeout=10,
            what="PodsUnmapped after the grace",
        )


async def _none(value: Any) -> bool:
    return not await value
