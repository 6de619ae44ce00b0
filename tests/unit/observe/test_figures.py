"""The figures a scrape reads (``ungater/_observe/figures.py``), gathered from a real controller's
state on the fake: each test fails when a figure is summed wrong, counts an owner no Workload
names, or reports a figure it was not given.
"""

from __future__ import annotations

import pytest
import ungater_plugins.job as job_plugin

from tests.unit.builders import NS
from tests.unit.harness import job_state, sliced
from tests.unit.podfactory import cluster_of, ray_owner
from ungater._decide.decision import WAIT_CAPACITY, Decision, PodSetReport, Waiting
from ungater._decide.indexes import OwnerKey
from ungater._kube.gateguard import GuardStatus
from ungater._kube.reflector import ReflectorStats
from ungater._model.views import Kind, ObjectView, parse_object, parse_pod
from ungater._observe.figures import controller_snapshot, gated_pods

JOB = Kind("batch", "Job")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def cluster(name: str, rv: int) -> ObjectView:
    raw = cluster_of(ray_owner("RayJob", "rayjob-a"), name, {"workers": (1, 1)})
    raw["metadata"]["resourceVersion"] = str(rv)
    return parse_object(raw)


def waiting(n: int) -> Decision:
    report = PodSetReport(
        "main",
        spec_count=n + 1,
        admitted_count=1,
        cap=1,
        live_ungated=1,
        in_flight=0,
        gated=n,
        waiting=tuple(Waiting(f"p{i}", "no room", WAIT_CAPACITY) for i in range(n)),
    )
    return Decision(active_slice="wl", summary="", pod_sets=(report,))


def test_gated_pods_sum_over_owners_and_skip_owners_no_longer_known() -> None:
    s = job_state()
    s.decisions[OwnerKey(NS, "uid-gone")] = waiting(5)  # its slices went: no kind
    s.decisions[sliced(s, "a", "wl-a")] = waiting(2)
    s.decisions[sliced(s, "b", "wl-b")] = waiting(1)
    assert gated_pods(s) == {("Job.batch", s.kinds[JOB].gate, WAIT_CAPACITY): 3}


def reflector_stats(**counts: int) -> ReflectorStats:
    stats = ReflectorStats()
    for name, n in counts.items():
        setattr(stats, name, n)
    return stats


@pytest.mark.anyio
async def test_a_snapshot_reports_each_figure_it_is_given() -> None:
    s = job_state()
    rt = s.kinds[JOB]
    s.queue.add(OwnerKey(NS, "a"))
    s.queue.add_rate_limited(OwnerKey(NS, "b"))
    s.ledger.expectations.expect(OwnerKey(NS, "a"), ["uid-p"], JOB)
    s.ledger.expectations.expired_total = 4
    sliced(s, "a", "wl-a")
    raw = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "namespace": NS,
            "uid": "uid-p",
            "resourceVersion": "3",
            "labels": {job_plugin.CONTROLLER_UID_LABEL: "uid-a"},
        },
        "spec": {},
    }
    rt.pods.on_change(None, parse_pod(raw))
    s.objects.keep(cluster("rc", 10))
    s.guard.status = {rt.gate: GuardStatus(rt.gate, "unguarded")}
    watches = [
        ("pods", reflector_stats(watch_restarts=2, relists_gone=1)),
        ("pods", reflector_stats(watch_restarts=3)),
        ("workloads", reflector_stats(watch_restarts=1)),
    ]
    snap = controller_snapshot(s, watches, synced=True)
    assert (snap.queue_depth, snap.queue_adds, snap.queue_retries) == (
        s.queue.depth,
        s.queue.adds,
        s.queue.retries,
    )
    assert s.queue.retries == 1 and s.queue.adds >= 1
    assert (snap.expectations_pending, snap.expectations_expired) == (1, 4)
    assert snap.watches["pods"]["watch_restarts"] == 5
    assert snap.watches["pods"]["relists_gone"] == 1
    assert snap.watches["workloads"]["watch_restarts"] == 1
    assert (snap.cached_workloads, snap.cached_pods, snap.cached_intermediates) == (1, 1, 1)
    assert snap.synced is True
    assert snap.gate_guard == {rt.gate: "unguarded"}
    assert snap.stood_down == {"Job.batch": False}


@pytest.mark.parametrize("synced", [True, False])
def test_a_snapshot_says_whether_the_caches_synced(synced: bool) -> None:
    assert controller_snapshot(job_state(), [], synced=synced).synced is synced
