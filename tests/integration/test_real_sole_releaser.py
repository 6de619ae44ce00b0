"""ungater beside the real Kueue on Kueue's own gate: the default Kueue of the fixtures (v0.19.2;
``$UNGATER_KUEUE_VERSION`` if set; v0.17.1 where v0.19.2 cannot be built, outside CI only), whose
ElasticJobUngater releases that gate itself, up to the admitted count, in pod name order.

With the shipped admission policy (deploy/manifests/optional/admission-policy.yaml) ungater is
the only releaser: Kueue's own release patches are refused, everything else Kueue does keeps
working, and ungater releases exactly what Kueue admitted, lowest completion index first, never
more (checked at every event in resourceVersion order). Without it, ungater sees Kueue remove
the gate and stands down to audit."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from tests.integration.jobs import index
from tests.integration.k8s import Kube
from tests.integration.realjobs import job_size, pending_slice
from tests.integration.realpeers import (
    KUEUE_GATE,
    SliceWatch,
    controller_uid,
    gate_policy_in_force,
    is_live,
)
from tests.integration.support import PatchLog, config_for, running_controller
from tests.objects import JOBS, PODS, gates_of
from tests.polling import eventually
from tests.seen import cache_holds, owner_key, reconciled, waiting
from ungater._controller.controller import Controller
from ungater_devtools.kueue_objects import queued_job

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

POLICY = Path(__file__).resolve().parents[2] / "deploy/manifests/optional/admission-policy.yaml"


@pytest.fixture
def guarded(kueue_cluster: Any, kueue_namespace: str) -> Iterator[None]:
    """The shipped policy and binding, applied to the Kueue cluster for one test, and in force."""
    docs = [d for d in yaml.safe_load_all(POLICY.read_text()) if d]
    with gate_policy_in_force(kueue_cluster, kueue_namespace, docs, {}):
        yield


async def pods_of(kube: Kube, ns: str, job: dict[str, Any]) -> list[dict[str, Any]]:
    return await kube.list(PODS, ns, f"batch.kubernetes.io/controller-uid={job['metadata']['uid']}")


async def released(kube: Kube, ns: str, job: dict[str, Any]) -> list[int]:
    pods = await pods_of(kube, ns, job)
    return sorted(index(p) for p in pods if is_live(p) and KUEUE_GATE not in gates_of(p))


async def seen_and_decided(ctl: Controller, kube: Kube, ns: str, job: dict[str, Any]) -> Any:
    """The controller has the Job's live pods as they are now, and a reconcile taken after that
    is done: its decision (a stood-down kind's audit decision too)."""
    pods = [p for p in await pods_of(kube, ns, job) if is_live(p)]  # the ending ones may go
    await eventually(lambda: cache_holds(ctl, "pods", pods), timeout=30, what="pods cached")
    return await reconciled(ctl, owner_key(job), decided=True, timeout=30)


async def steady(
    ctl: Controller, patches: PatchLog, kube: Kube, ns: str, job: dict[str, Any], want: list[int]
) -> None:
    """``want`` released; the controller has seen that and keeps every other live pod waiting
    (with a reason), and once every patch it sent has its answer (each is held a second) none
    has released more. Kueue's own tries are refused by the policy: a release of its getting
    through would be a foreign release to the controller and, past the cap, a violation in
    the replay, both checked over the whole run."""
    await eventually(
        lambda: _equal(released(kube, ns, job), want), timeout=60, what=f"released {want}"
    )
    decision = await seen_and_decided(ctl, kube, ns, job)
    gated = {
        p["metadata"]["name"]
        for p in await pods_of(kube, ns, job)
        if is_live(p) and KUEUE_GATE in gates_of(p)
    }
    assert gated <= set(waiting(decision)), f"gated {sorted(gated)}, decided {decision}"
    assert await released(kube, ns, job) == want
    await patches.answered()
    assert await released(kube, ns, job) == want


async def _equal(got: Any, want: list[int]) -> bool:
    return await got == want


async def scale(kube: Kube, ns: str, n: int) -> None:
    await kube.merge_patch(JOBS, ns, "train", {"spec": {"parallelism": n, "completions": n}})


@pytest.mark.kueue_quota(cpu=4)
async def test_ungater_releases_kueues_gate_alone_under_the_policy(
    kueue_cluster: Any, kueue_kube: Kube, kueue_namespace: str, guarded: None
) -> None:
    ns = kueue_namespace
    config = config_for(ns, kinds=[{"group": "batch", "kind": "Job"}])
    assert config.gate == KUEUE_GATE
    # ungater's patches wait a second, so Kueue always tries first (without the policy it
    # then wins: see the stand-down test below) and must be refused every time
    patches = PatchLog(delay=1.0)
    async with running_controller(kueue_cluster.kubeconfig_path, config, patches.wrap) as ctl:
        await eventually(lambda: ctl.state.guard.status.get(KUEUE_GATE) is not None, timeout=30)
        assert ctl.state.guard.status[KUEUE_GATE].state == "guarded"
        job = await kueue_kube.create(JOBS, ns, queued_job("train", 2))
        gates = [g["name"] for g in job["spec"]["template"]["spec"]["schedulingGates"]]
        assert gates == [KUEUE_GATE], "Kueue's webhook still adds its gate"
        watch = SliceWatch(
            kueue_kube,
            ns,
            JOBS,
            job["metadata"]["uid"],
            job_size,
            lambda p: "main",
            controller_uid,
            owner_name="train",
        )
        async with anyio.create_task_group() as tg:
            await watch.record(tg)  # returns once each watch has listed
            await steady(ctl, patches, kueue_kube, ns, job, [0, 1])
            await scale(kueue_kube, ns, 4)
            await steady(ctl, patches, kueue_kube, ns, job, [0, 1, 2, 3])
            # beyond the quota of 4 CPUs: the scale-up slice waits, so do the new pods
            await scale(kueue_kube, ns, 6)
            await eventually(lambda: pending_slice(kueue_kube, ns), timeout=30, what="pending")
            await eventually(lambda: _live_count(kueue_kube, ns, job, 6), timeout=30, what="6 pods")
            await steady(ctl, patches, kueue_kube, ns, job, [0, 1, 2, 3])
            await scale(kueue_kube, ns, 3)
            await eventually(
                lambda: _released_count(kueue_kube, ns, job, 3), timeout=60, what="3 released"
            )
            await seen_and_decided(ctl, kueue_kube, ns, job)
            await patches.answered()
            # the record ends with everything written so far, the last releases included
            await eventually(watch.caught_up, timeout=30, what="the recorder caught up")
            tg.cancel_scope.cancel()
        violations = watch.replay(KUEUE_GATE)
        assert not violations, violations
        assert ctl.stats.foreign_releases == 0, "Kueue released nothing itself"
        assert not any(rt.stood_down for rt in ctl.state.kinds.values())
    kueue_log = (kueue_cluster.logs_dir / "kueue.log").read_text(errors="replace")
    assert "is released by ungater only" in kueue_log, "Kueue tried and was refused"


async def _released_count(kube: Kube, ns: str, job: dict[str, Any], n: int) -> bool:
    return len(await released(kube, ns, job)) == n


async def _live_count(kube: Kube, ns: str, job: dict[str, Any], n: int) -> bool:
    return sum(1 for p in await pods_of(kube, ns, job) if is_live(p)) == n


@pytest.mark.kueue_quota(cpu=4)
async def test_beside_the_real_kueue_without_the_policy_ungater_stands_down(
    kueue_cluster: Any, kueue_kube: Kube, kueue_namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """No policy: Kueue (v0.19.2, the default) removes its own gate from the admitted pods, up
    to the admitted count, with its ElasticJobUngater. ungater, set to release that same gate,
    sees its gate removed by another writer, stands down for Job (audit only), says so, and
    patches nothing more while Kueue goes on releasing."""
    ns = kueue_namespace
    config = config_for(
        ns,
        kinds=[{"group": "batch", "kind": "Job"}],
        standDown={"foreignReleases": 2, "windowSeconds": 120},
    )
    patches = PatchLog(delay=1.5)
    async with running_controller(kueue_cluster.kubeconfig_path, config, patches.wrap) as ctl:
        await eventually(lambda: ctl.state.guard.status.get(KUEUE_GATE) is not None, timeout=30)
        assert ctl.state.guard.status[KUEUE_GATE].state != "guarded"
        job = await kueue_kube.create(JOBS, ns, queued_job("train", 3))
        await eventually(
            lambda: _released_count(kueue_kube, ns, job, 3), timeout=60, what="Kueue releases 3"
        )
        [rt] = ctl.state.kinds.values()
        await eventually(lambda: bool(rt.stood_down), timeout=30, what="stood down")
        assert rt.mode == "audit"
        assert ctl.stats.foreign_releases >= 2
        patched = ctl.stats.released
        # Kueue keeps releasing on its own; ungater only watches now
        await scale(kueue_kube, ns, 4)
        await eventually(
            lambda: _released_count(kueue_kube, ns, job, 4), timeout=60, what="Kueue releases 4"
        )
        # the controller has seen Kueue's fourth release and audited after it
        await seen_and_decided(ctl, kueue_kube, ns, job)
        assert ctl.stats.released == patched, "a stood-down kind patches nothing"
        await patches.answered()  # none sent before lands later (each is held 1.5 s)
        assert ctl.stats.released == patched, "a stood-down kind patches nothing"
        assert any("stood down" in line.lower() for line in ctl.status_lines()), ctl.status_lines()
    # loudly: an error line naming the gate, the kind and the other writer's pods
    loud = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any(m.startswith("standing down: another writer removed gate") for m in loud), loud
