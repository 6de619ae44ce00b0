"""Faults on the real control plane. After every observed step the invariant "live released
pods per owner <= cap" is checked by a watch (tests/integration/monitor.py), and every test
ends with every admitted pod released."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.integration.jobs import count_pods, make_job, released_indexes, scale
from tests.integration.jobs import job_body as _job
from tests.integration.k8s import Kube
from tests.integration.monitor import monitoring
from tests.integration.support import (
    admit,
    config_for,
    create_workload,
    finish,
    running_controller,
)
from tests.integration.tcpproxy import kubeconfig_via, proxied
from tests.objects import GATE, PODS, gates_of
from tests.objects import JOBS as JOBS_RES
from tests.polling import equals, eventually, holds_for

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


async def test_apiserver_killed_and_restarted_mid_scale_up(
    breakable_kube: Kube, breakable_namespace: str, breakable_plane: Any
) -> None:
    kube, ns, plane = breakable_kube, breakable_namespace, breakable_plane
    job, sel = await make_job(kube, ns, "restart", 3)
    await create_workload(kube, job, "job-restart-a", {"main": 3})
    await admit(kube, ns, "job-restart-a", {"main": 3})
    config = config_for(
        ns, watch={"backoffInitialSeconds": 0.1, "backoffMaxSeconds": 1.0, "silenceSeconds": 20}
    )
    async with (
        monitoring(kube, ns, sel) as mon,
        running_controller(plane.kubeconfig_path, config),
    ):
        await eventually(lambda: equals(released_indexes(kube, ns, sel), [0, 1, 2]))
        await scale(kube, ns, "restart", 6)
        await eventually(lambda: count_pods(kube, ns, sel, 6), timeout=30)
        await create_workload(
            kube,
            job,
            "job-restart-b",
            {"main": 6},
            replaces="job-restart-a",
            slice_name="job-restart-a",
        )
        await anyio.to_thread.run_sync(plane.kill_apiserver)
        await anyio.sleep(1.0)  # the controller's watches and requests fail meanwhile
        await anyio.to_thread.run_sync(plane.start_apiserver)
        await admit(kube, ns, "job-restart-b", {"main": 6})
        await finish(kube, ns, "job-restart-a")
        await eventually(
            lambda: equals(released_indexes(kube, ns, sel), list(range(6))), timeout=60
        )
        await holds_for(lambda: equals(released_indexes(kube, ns, sel), list(range(6))), 1.0)
    # the monitor saw the restart too: its watches failed and resumed, with no gap (a gap
    # would have failed ``monitoring`` on the way out)
    assert sum(mon.interruptions.values()) >= 1, mon.interruptions


async def test_watch_connections_cut_every_few_seconds(
    kube: Kube, kube_namespace: str, control_plane: Any, tmp_path: Path
) -> None:
    ns = kube_namespace
    job, sel = await make_job(kube, ns, "cut", 8)
    await create_workload(kube, job, "job-cut-a", {"main": 8})
    config = config_for(
        ns, watch={"backoffInitialSeconds": 0.05, "backoffMaxSeconds": 0.5, "silenceSeconds": 20}
    )
    async with proxied(control_plane.apiserver_port) as proxy:
        kc = kubeconfig_via(control_plane.kubeconfig_path, proxy.port, tmp_path / "kubeconfig")
        async with (
            monitoring(kube, ns, sel),
            running_controller(kc, config) as ctl,
            anyio.create_task_group() as tg,
        ):

            async def cutter() -> None:
                for _ in range(100):  # bounded: the test cancels it long before
                    await anyio.sleep(2.0)
                    proxy.cut_all()

            tg.start_soon(cutter)
            for cap in (2, 5, 8):  # the admission grows while connections keep dropping
                await admit(kube, ns, "job-cut-a", {"main": cap})
                await eventually(
                    lambda cap=cap: equals(released_indexes(kube, ns, sel), list(range(cap))),
                    timeout=30,
                    what=f"{cap} released through cuts",
                )
                await anyio.sleep(2.5)  # make sure at least one cut lands in each phase
            tg.cancel_scope.cancel()
        assert proxy.cuts >= 3
        assert sum(r.stats.watch_restarts for r in ctl.reflectors) >= 3


async def test_controller_sigkilled_between_patching_and_observing(
    kube: Kube, kube_namespace: str, control_plane: Any, tmp_path: Path
) -> None:
    ns = kube_namespace
    job, sel = await make_job(kube, ns, "sigkill", 12)
    await create_workload(kube, job, "job-sigkill-a", {"main": 12})
    cfg = tmp_path / "ungater.yaml"
    cfg.write_text(
        f"namespaces: [{ns}]\nclient: {{patchConcurrency: 2, qps: 20, burst: 2}}\n"
        "server: {address: '127.0.0.1:0'}\nmode: release\n"  # the only releaser here
        f"leaderElection: {{namespace: {ns}, leaseDurationSeconds: 4, renewDeadlineSeconds: 3,"
        " retryPeriodSeconds: 1}\n"
    )
    cmd = [
        sys.executable,
        "-m",
        "ungater",
        "run",
        "--kubeconfig",
        str(control_plane.kubeconfig_path),
        "--config",
        str(cfg),
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    async with monitoring(kube, ns, sel):
        with (tmp_path / "first.log").open("w") as log:
            first = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)  # noqa: ASYNC220
        try:
            await admit(kube, ns, "job-sigkill-a", {"main": 7})
            await eventually(
                lambda: released_indexes(kube, ns, sel), timeout=30, what="a first release"
            )
            first.send_signal(signal.SIGKILL)  # rate limited to 20/s: patches are still in flight
            await anyio.to_thread.run_sync(lambda: first.wait(timeout=10))
        finally:
            if first.poll() is None:
                first.kill()
        partial = await released_indexes(kube, ns, sel)
        assert 1 <= len(partial) <= 7
        with (tmp_path / "second.log").open("w") as log:
            second = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)  # noqa: ASYNC220
        try:
            await eventually(
                lambda: equals(released_indexes(kube, ns, sel), list(range(7))), timeout=45
            )
            await holds_for(lambda: equals(released_indexes(kube, ns, sel), list(range(7))), 1.0)
        finally:
            second.send_signal(signal.SIGTERM)
            await anyio.to_thread.run_sync(lambda: second.wait(timeout=20))
    assert second.returncode == 0


async def test_second_writer_removing_gates_is_counted_not_doubled(
    kube: Kube, kube_namespace: str, controller: Any
) -> None:
    """A rogue releaser removes our gate from a pod we did not choose: the controller counts
    that pod against the cap (releases nothing more), and reports the foreign release."""
    ns = kube_namespace
    job, sel = await make_job(kube, ns, "rogue", 5)
    await create_workload(kube, job, "job-rogue-a", {"main": 5})
    await admit(kube, ns, "job-rogue-a", {"main": 2})
    async with controller() as ctl:
        await eventually(lambda: equals(released_indexes(kube, ns, sel), [0, 1]))
        pods = {
            int(p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]): p
            for p in await kube.list(PODS, ns, sel)
        }
        rogue = pods[4]
        idx = gates_of(rogue).index(GATE)
        await kube.json_patch(
            PODS,
            ns,
            rogue["metadata"]["name"],
            [
                {"op": "test", "path": f"/spec/schedulingGates/{idx}/name", "value": GATE},
                {"op": "remove", "path": f"/spec/schedulingGates/{idx}"},
            ],
        )
        await eventually(lambda: ctl.stats.foreign_releases >= 1, what="foreign release noticed")
        # one released pod finishes: still 2 live released (index 1 and the rogue's 4), so nothing more
        await kube.merge_patch(
            PODS, ns, pods[0]["metadata"]["name"], {"status": {"phase": "Succeeded"}}, "status"
        )
        await holds_for(lambda: equals(released_indexes(kube, ns, sel), [1, 4]), 1.5)


class DeleteBeforePatch:
    """Wraps the client: the first pod the controller patches is deleted right before."""

    def __init__(self, client: Any, kube: Kube) -> None:
        self._client, self._kube = client, kube
        self.deleted: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def json_patch(self, res: Any, ns: str, name: str, ops: Any) -> Any:
        if not self.deleted:
            self.deleted.append(name)
            await self._kube.delete(PODS, ns, name)
        return await self._client.json_patch(res, ns, name, ops)


async def test_pod_deleted_while_being_patched(
    kube: Kube, kube_namespace: str, control_plane: Any
) -> None:
    ns = kube_namespace
    job, sel = await make_job(kube, ns, "vanish", 4)
    await create_workload(kube, job, "job-vanish-a", {"main": 4})
    wrappers: list[DeleteBeforePatch] = []

    def wrap(client: Any) -> Any:
        wrappers.append(DeleteBeforePatch(client, kube))
        return wrappers[-1]

    async with (
        monitoring(kube, ns, sel),
        running_controller(control_plane.kubeconfig_path, config_for(ns), wrap) as ctl,
    ):
        await admit(kube, ns, "job-vanish-a", {"main": 3})
        # index 0 vanished under the patch: the 404 counts nothing, and the cap is filled with
        # the next index instead; the Job controller's replacement for index 0 then waits
        await eventually(lambda: equals(released_indexes(kube, ns, sel), [1, 2, 3]), timeout=30)
        await eventually(lambda: count_pods(kube, ns, sel, 4), timeout=60, what="index 0 recreated")
        await holds_for(lambda: equals(released_indexes(kube, ns, sel), [1, 2, 3]), 1.0)
    assert wrappers[0].deleted
    # the Job controller's tracking finalizer keeps the deleted pod terminating for a moment;
    # the deletion changed its resourceVersion, so the patch, which tests the version it was
    # decided on, is refused (422, a conflict), or meets a 404 once the pod is gone: it never
    # lands on a pod that runs nothing
    assert ctl.stats.released == 3
    assert ctl.stats.patch_gone + ctl.stats.patch_conflicts >= 1
    assert ctl.stats.released_deleting == 0


async def test_two_hundred_workloads_scaling_at_once(
    kube: Kube, kube_namespace: str, controller: Any
) -> None:
    ns = kube_namespace
    n = 200
    jobs: dict[str, dict[str, Any]] = {}

    async def create(i: int) -> None:
        job = await kube.create(JOBS_RES, ns, _job(f"many-{i:03d}", 1))
        jobs[job["metadata"]["uid"]] = job
        await create_workload(kube, job, f"job-many-{i:03d}-a", {"main": 1})
        await admit(kube, ns, f"job-many-{i:03d}-a", {"main": 1})

    await _gather(create, range(n))
    sel = "batch.kubernetes.io/job-name"
    async with monitoring(kube, ns, sel), controller(workers=8):
        await eventually(
            lambda: _released_total(kube, ns, sel, n), timeout=120, what=f"{n} released"
        )

        async def grow(uid: str) -> None:
            job = jobs[uid]
            name = job["metadata"]["name"]
            await kube.merge_patch(
                JOBS_RES, ns, name, {"spec": {"parallelism": 2, "completions": 2}}
            )
            await create_workload(
                kube,
                job,
                f"job-{name}-b",
                {"main": 2},
                replaces=f"job-{name}-a",
                slice_name=f"job-{name}-a",
            )
            await admit(kube, ns, f"job-{name}-b", {"main": 2})
            await finish(kube, ns, f"job-{name}-a")

        await _gather(grow, list(jobs))
        await eventually(
            lambda: _released_total(kube, ns, sel, 2 * n), timeout=180, what=f"{2 * n} released"
        )


async def _released_total(kube: Kube, ns: str, sel: str, n: int) -> bool:
    from tests.integration.monitor import live_released

    return len(live_released(await kube.list(PODS, ns, sel))) == n


async def _gather(fn: Any, items: Any, limit: int = 16) -> None:
    sem = anyio.Semaphore(limit)

    async def one(x: Any) -> None:
        async with sem:
            await fn(x)

    async with anyio.create_task_group() as tg:
        for x in items:
            tg.start_soon(one, x)
