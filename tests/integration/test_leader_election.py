"""Two replicas with leader election, as a Deployment runs them: separate `ungater run`
processes sharing a Lease. Only the leader acts; the standby is warm and ready; when the
leader is SIGKILLed the standby takes over within the lease time and finishes the work."""

from __future__ import annotations

import re
import secrets
import signal
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.integration.jobs import make_job, released_indexes
from tests.integration.k8s import Kube
from tests.integration.monitor import monitoring
from tests.integration.replicas import LEASE_S, LEASES, Replica, holder, is_leader
from tests.integration.support import admit, create_workload
from tests.polling import equals, eventually

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


async def test_instances_in_different_places_share_one_lease(
    kube: Kube, kube_namespace: str, control_plane: Any, tmp_path: Path
) -> None:
    """A pod (POD_NAMESPACE set to an existing namespace, as the Deployment sets it) and a laptop (no POD_*), neither
    configuring a Lease namespace, meet on one Lease in kube-system: exactly one leads."""
    ns = kube_namespace
    lease = f"ungater-test-{secrets.token_hex(3)}"
    replicas = [
        Replica(
            "in-pod",
            control_plane.kubeconfig_path,
            ns,
            tmp_path,
            lease=lease,
            env={"POD_NAMESPACE": ns, "POD_NAME": "ungater-0"},
        ),
        Replica("laptop", control_plane.kubeconfig_path, ns, tmp_path, lease=lease),
    ]
    try:
        leader = await eventually(
            lambda: holder(kube, "kube-system", lease), timeout=30, what="a leader"
        )
        for r in replicas:
            await eventually(
                lambda r=r: r.url() and r.get("/readyz")[0] == 200, timeout=30, what=r.name
            )
        first = next(r for r in replicas if r.name == leader)
        await eventually(lambda: is_leader(first), timeout=10, what=f"{leader} says it leads")
        for _ in range(3):  # over more than a lease duration, one leader and one standby
            leading = [r.name for r in replicas if is_leader(r)]
            assert leading == [leader], leading
            await anyio.sleep(LEASE_S / 2)
        assert await kube.get(LEASES, ns, lease) is None  # not where the pod runs
    finally:
        for r in replicas:
            await anyio.to_thread.run_sync(lambda r=r: r.stop(signal.SIGTERM, 20))
        await kube.client.delete(LEASES, "kube-system", lease)


async def test_standby_takes_over_when_the_leader_is_killed(
    kube: Kube, kube_namespace: str, control_plane: Any, tmp_path: Path
) -> None:
    ns = kube_namespace
    job, sel = await make_job(kube, ns, "ha", 6)
    await create_workload(kube, job, "job-ha-a", {"main": 6})
    replicas = {
        n: Replica(n, control_plane.kubeconfig_path, ns, tmp_path)
        for n in ("replica-a", "replica-b")
    }
    try:
        async with monitoring(kube, ns, sel):
            leader_name = await eventually(lambda: holder(kube, ns), timeout=30, what="a leader")
            leader = replicas[leader_name]
            standby = next(r for n, r in replicas.items() if n != leader_name)
            for r in replicas.values():  # both warm: ready once their caches synced
                await eventually(
                    lambda r=r: r.url() and r.get("/readyz")[0] == 200,
                    timeout=30,
                    what=f"{r.name} ready",
                )
                assert r.get("/healthz")[0] == 200
            await admit(kube, ns, "job-ha-a", {"main": 2})
            await eventually(lambda: equals(released_indexes(kube, ns, sel), [0, 1]), timeout=30)
            assert "ungater_leader 1.0" in leader.get("/metrics")[1]
            metrics = standby.get("/metrics")[1]
            assert "ungater_leader 0.0" in metrics
            assert re.search(
                r'ungater_pods_released_total\{kind="Job.batch",pod_set="main"\}',
                leader.get("/metrics")[1],
            )
            assert "ungater_pods_released_total{" not in metrics or 'pod_set="main"} 0.0' in metrics

            await anyio.to_thread.run_sync(lambda: leader.stop(signal.SIGKILL))
            killed_at = time.monotonic()
            await admit(kube, ns, "job-ha-a", {"main": 5})
            await eventually(
                lambda: equals(holder(kube, ns), standby.name),
                timeout=3 * LEASE_S,
                what="the standby holds the Lease",
            )
            await eventually(
                lambda: equals(released_indexes(kube, ns, sel), [0, 1, 2, 3, 4]), timeout=30
            )
            took = time.monotonic() - killed_at
            assert took < LEASE_S + 6, f"takeover and release took {took:.1f}s"
            code = await anyio.to_thread.run_sync(standby.stop)
            assert code == 0, standby.log.read_text()
            assert await holder(kube, ns) == "", "a clean shutdown hands the Lease back"
    finally:
        for r in replicas.values():
            await anyio.to_thread.run_sync(lambda r=r: r.stop(signal.SIGKILL, 10))
