"""Sharding by namespace on the real API server: separate `ungater run` processes, one Lease per
shard (``leaderElection.shardByNamespace``). Two shards with disjoint namespaces lead side by
side, each releasing only its own namespace's pods exactly as far as admitted; a standby with
shard 1's config waits on shard 1's Lease and takes over when shard 1's leader is killed, while
shard 2 leads on undisturbed."""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.integration.deploy import render
from tests.integration.jobs import make_job, released_indexes
from tests.integration.k8s import Kube
from tests.integration.monitor import monitoring
from tests.integration.replicas import LEASES, Replica, is_leader
from tests.integration.support import admit, create_workload
from tests.polling import equals, eventually
from tests.unit.deploy.deploy_checks import one, rendered_config
from ungater._model.config import Config

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

LEASE_S = 4.0
RELEASED = re.compile(
    r'^ungater_pods_released_total\{kind="Job.batch",pod_set="main"\} (\S+)$', re.M
)


class Shard(Replica):
    """One `ungater run` process serving ``namespaces`` as a shard (Lease in ``lease_ns``)."""

    def __init__(
        self, name: str, kubeconfig: Path, namespaces: list[str], lease_ns: str, tmp: Path
    ) -> None:
        self.name = name
        self.log = tmp / f"{name}.log"
        self.config_text = (
            f"namespaces: [{', '.join(namespaces)}]\nserver: {{address: '127.0.0.1:0'}}\n"
            "mode: release\n"  # no Kueue releases here: the test plays it
            f"leaderElection: {{shardByNamespace: true, namespace: {lease_ns}, identity: {name},"
            f" leaseDurationSeconds: {LEASE_S}, renewDeadlineSeconds: 3, retryPeriodSeconds: 1}}\n"
        )
        cfg = tmp / f"{name}.yaml"
        cfg.write_text(self.config_text)
        argv = ["-m", "ungater", "run", "--kubeconfig", str(kubeconfig), "--config", str(cfg)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("POD_")}
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, *argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**env, "PYTHONUNBUFFERED": "1"},
            )

    def released(self) -> float:
        """This process's own count of released pods (0 before its first release)."""
        m = RELEASED.search(self.get("/metrics")[1])
        return float(m.group(1)) if m else 0.0


def lease_of(namespaces: list[str]) -> str:
    """The Lease the controller derives for this shard."""
    raw = {"namespaces": namespaces, "leaderElection": {"shardByNamespace": True}}
    return Config.model_validate(raw).lease_name


async def holder(kube: Kube, ns: str, name: str) -> str:
    lease = await kube.get(LEASES, ns, name)
    return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")


@pytest.fixture
def second_namespace(control_plane: Any) -> Iterator[str]:
    name = f"shard-b-{secrets.token_hex(3)}"
    status, body = control_plane.request(
        "POST",
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
    )
    assert status == 201, body
    try:
        yield name
    finally:
        control_plane.request("DELETE", f"/api/v1/namespaces/{name}")


async def test_disjoint_shards_lead_side_by_side_and_a_standby_takes_over_one(
    kube: Kube, kube_namespace: str, second_namespace: str, control_plane: Any, tmp_path: Path
) -> None:
    ns_a, ns_b = kube_namespace, second_namespace
    lease_ns = ns_a  # the Leases live in a namespace of this test: nothing stale is ever met
    lease_a, lease_b = lease_of([ns_a]), lease_of([ns_b])
    job_a, sel_a = await make_job(kube, ns_a, "sa", 6)
    job_b, sel_b = await make_job(kube, ns_b, "sb", 6)
    await create_workload(kube, job_a, "job-sa-a", {"main": 6})
    await create_workload(kube, job_b, "job-sb-a", {"main": 6})
    kc = control_plane.kubeconfig_path
    shard_a = Shard("shard-a", kc, [ns_a], lease_ns, tmp_path)
    shard_b = Shard("shard-b", kc, [ns_b], lease_ns, tmp_path)
    procs = [shard_a, shard_b]
    try:
        async with (
            monitoring(kube, ns_a, sel_a),
            monitoring(kube, ns_b, sel_b),
        ):
            await eventually(lambda: equals(holder(kube, lease_ns, lease_a), "shard-a"), timeout=30)
            await eventually(lambda: equals(holder(kube, lease_ns, lease_b), "shard-b"), timeout=30)
            for s in procs:
                await eventually(
                    lambda s=s: s.url() and s.get("/readyz")[0] == 200 and is_leader(s),
                    timeout=30,
                    what=f"{s.name} ready and leading",
                )
            await admit(kube, ns_a, "job-sa-a", {"main": 2})
            await admit(kube, ns_b, "job-sb-a", {"main": 3})
            await eventually(lambda: equals(released_indexes(kube, ns_a, sel_a), [0, 1]))
            await eventually(lambda: equals(released_indexes(kube, ns_b, sel_b), [0, 1, 2]))
            # each shard released exactly its own namespace's pods, nothing of the other's
            await eventually(lambda: shard_a.released() == 2 and shard_b.released() == 3)

            standby = Shard("shard-a-standby", kc, [ns_a], lease_ns, tmp_path)
            procs.append(standby)
            await eventually(
                lambda: standby.url() and standby.get("/readyz")[0] == 200,
                timeout=30,
                what="the standby ready",
            )
            for _ in range(2):  # over more than a lease duration: it waits on shard a's Lease
                assert not is_leader(standby)
                assert await holder(kube, lease_ns, lease_a) == "shard-a"
                await anyio.sleep(LEASE_S / 2)

            await anyio.to_thread.run_sync(lambda: shard_a.stop(signal.SIGKILL))
            killed_at = time.monotonic()
            await admit(kube, ns_a, "job-sa-a", {"main": 4})
            await eventually(
                lambda: equals(holder(kube, lease_ns, lease_a), "shard-a-standby"),
                timeout=3 * LEASE_S,
                what="the standby holds shard a's Lease",
            )
            await eventually(lambda: equals(released_indexes(kube, ns_a, sel_a), [0, 1, 2, 3]))
            took = time.monotonic() - killed_at
            assert took < LEASE_S + 8, f"takeover and release took {took:.1f}s"
            assert standby.released() == 2
            # shard b never noticed: same leader, nothing more released until admitted
            assert await holder(kube, lease_ns, lease_b) == "shard-b"
            assert is_leader(shard_b)
            assert await released_indexes(kube, ns_b, sel_b) == [0, 1, 2]
            await admit(kube, ns_b, "job-sb-a", {"main": 5})
            await eventually(lambda: equals(released_indexes(kube, ns_b, sel_b), [0, 1, 2, 3, 4]))
            assert shard_b.released() == 5
            assert standby.released() == 2
        for s in (standby, shard_b):
            code = await anyio.to_thread.run_sync(s.stop)
            assert code == 0, s.log.read_text()
    finally:
        for s in procs:
            await anyio.to_thread.run_sync(lambda s=s: s.stop(signal.SIGTERM, 20))


def test_chart_derives_a_shards_lease_as_the_controller_does(helm: Path) -> None:
    """The chart leaves the name to the controller (no leaseName in the config) and grants the
    Role on exactly the Lease the controller derives."""
    cases: list[dict[str, Any]] = [
        {"namespaces": ["team-b", "team-a"]},
        {"namespaces": ["team-c"], "gate": "example.com/hold"},
        {
            "namespaces": ["x"],
            "kinds": [{"group": "batch", "kind": "Job", "gate": "b.example/two"}],
        },
    ]
    for case in cases:
        values = {**case, "leaderElection": {"enabled": True, "shardByNamespace": True}}
        objects = render(helm, config=values)
        config = rendered_config(objects)
        assert "leaseName" not in config["leaderElection"], config
        derived = Config.model_validate(config).lease_name
        rules = one(objects, "Role")["rules"]
        named = [r for r in rules if r.get("resourceNames")]
        assert [n for r in named for n in r["resourceNames"]] == [derived], rules
        assert derived != Config.model_validate(case).lease_name  # never the unsharded one
    no_namespaces = {"leaderElection": {"enabled": True, "shardByNamespace": True}}
    with pytest.raises(Exception, match=r"needs config\.namespaces"):
        render(helm, config=no_namespaces)
