"""The pure audit (ungater._decide.findings): each finding from a table of slices and pods, the
tracker that dates and reports findings, and the one-shot audit and ``explain`` on the in-memory
API server. Audit mode in the running controller is tested in
tests/unit/controller/test_audit_mode.py."""

from __future__ import annotations

from typing import Any

import pytest
import ungater_plugins.job as job_plugin

from tests.fakekube import FakeKube
from tests.objects import JOBS, PODS, WORKLOADS, job_pod, workload
from tests.unit.builders import GATE, condition, facts, wl_view
from ungater._decide.decision import Ownership, PodFacts
from ungater._decide.finding_tracker import FindingTracker
from ungater._decide.findings import (
    FOREIGN_GATES,
    OUT_OF_ORDER,
    OVER_RELEASE,
    RELEASED_WITHOUT_ADMISSION,
    STALLED,
    audit_owner,
    parse_time,
)
from ungater._model.config import Config
from ungater._model.views import ObjectRef, WorkloadView
from ungater._plugins.registry import PluginRegistry

OWNER = ObjectRef("batch/v1", "Job", "job", "uid-owner", True)


T0 = parse_time("2026-01-01T00:00:00Z") or 0.0  # builders' ts(0)


OTHER = "example.com/other"


def run(
    slices: list[WorkloadView], pods: list[PodFacts], now: float = T0 + 10, **kw: Any
) -> dict[str, Any]:
    found, _ = audit_owner(
        slices,
        pods,
        GATE,
        owner=OWNER,
        kind="Job.batch",
        namespace="ns",
        now=now,
        stall_seconds=kw.pop("stall_seconds", 30.0),
        **kw,
    )
    return {f.finding: f for f in found}


def gated(i: int, **kw: Any) -> PodFacts:
    return facts(f"p{i}", sort_key=(i,), **kw)


def released(i: int, gates: tuple[str, ...] = (), **kw: Any) -> PodFacts:
    return facts(f"p{i}", sort_key=(i,), gates=gates, **kw)


def test_over_release_names_the_pods_beyond_the_cap_in_order() -> None:
    slices = [wl_view(pod_sets={"main": 4}, admitted={"main": 2})]
    pods = [released(0), released(1), released(2), released(3, phase="Succeeded"), gated(4)]
    found = run(slices, pods)
    f = found[OVER_RELEASE]
    assert f.pods == ("p0", "p1", "p2") and f.pod_set == "main" and f.workload == "wl-1"
    assert "3 live released pod(s)" in f.message and "cap of 2" in f.message
    assert "beyond the cap in order: p2" in f.message
    assert f.owner == "Job ns/job" and f.severity == "warning"
    # at the cap: nothing; an owner that shrank below its released pods is a scale-down its
    # controller is carrying out (KubeRay deletes them seconds later), not a release beyond
    # admission: nothing either (found beside the real KubeRay, tests/integration/test_real_audit)
    assert OVER_RELEASE not in run(slices, pods[1:])
    assert OVER_RELEASE not in run(slices, pods[1:], desired={"main": 1})


def test_stall_is_dated_from_creation_or_admission_unless_watched() -> None:
    admitted_at = condition("Admitted", "True")
    admitted_at["lastTransitionTime"] = "2026-01-01T00:00:20Z"
    slices = [
        wl_view(
            pod_sets={"main": 3}, admitted={"main": 2}, conditions=["QuotaReserved", admitted_at]
        )
    ]
    pods = [released(0), gated(1), gated(2)]
    # releasable (p1) since the admission at +20 s; the pods are older (+10 s)
    assert STALLED not in run(slices, pods, now=T0 + 49)
    f = run(slices, pods, now=T0 + 51)[STALLED]
    assert f.pods == ("p1",) and f.seconds == pytest.approx(31)
    # a watcher that has seen it releasable only for 5 s knows better
    uid = pods[1].pod.uid
    assert STALLED not in run(slices, pods, now=T0 + 51, releasable_since={uid: T0 + 46})
    # p2 is not releasable (cap reached): never a stall
    assert "p2" not in f.pods


def test_released_without_admission_or_outside_the_slice() -> None:
    pending = [wl_view(pod_sets={"main": 2}, admitted=None, conditions=["QuotaReserved"])]
    found = run(pending, [released(0), gated(1)])
    f = found[RELEASED_WITHOUT_ADMISSION]
    assert f.pods == ("p0",) and "no admitted slice" in f.message
    assert RELEASED_WITHOUT_ADMISSION not in run(pending, [gated(0), gated(1)])
    # a pod of a pod set the active slice does not know, released
    slices = [wl_view(pod_sets={"main": 2})]
    stray = facts("s0", pod_set="helper", gates=())
    f = run(slices, [gated(0), stray])[RELEASED_WITHOUT_ADMISSION]
    assert f.pods == ("s0",) and "outside the pod sets" in f.message
    # foreign pods (ownership not proven to lead here) are never this owner's findings
    other = facts("x0", gates=(), ownership=Ownership.FOREIGN)
    assert run(pending, [other]) == {}


def test_the_slice_hand_over_is_no_release_without_admission() -> None:
    done = condition("Finished", "True", "WorkloadSliceReplaced")
    done["lastTransitionTime"] = "2026-01-01T00:00:09Z"
    old = wl_view("wl-1", pod_sets={"main": 2}, conditions=["QuotaReserved", "Admitted", done])
    new = wl_view(
        "wl-2",
        created=1,
        pod_sets={"main": 3},
        admitted=None,
        conditions=["QuotaReserved"],
        replacement_for="wl-1",
    )
    pods = [released(0), released(1), gated(2)]
    # one second after the old slice finished, its replacement not yet admitted: hand-over
    assert run([old, new], pods, now=T0 + 10, handover_grace_seconds=2) == {}
    # long after, it is an anomaly
    assert RELEASED_WITHOUT_ADMISSION in run(
        [old, new], pods, now=T0 + 12, handover_grace_seconds=2
    )


def test_order_and_foreign_gates_are_informational() -> None:
    slices = [wl_view(pod_sets={"main": 3}, admitted={"main": 2})]
    pods = [gated(0), released(1), released(2, gates=(OTHER,))]
    found = run(slices, pods)
    assert found[OUT_OF_ORDER].pods == ("p1", "p2") and found[OUT_OF_ORDER].severity == "info"
    assert "while earlier p0" in found[OUT_OF_ORDER].message
    assert found[FOREIGN_GATES].pods == ("p2",) and OTHER in found[FOREIGN_GATES].message
    in_order = run(slices, [released(0), released(1), gated(2)])
    assert OUT_OF_ORDER not in in_order and FOREIGN_GATES not in in_order


def test_a_pod_created_after_the_released_ones_is_not_passed_over() -> None:
    """KubeRay gives a new worker the lowest free replica index: released workers with higher
    indexes, released before it existed, were not released out of order (seen beside the real
    KubeRay v1.6.1); one that existed first (created no later) was passed over."""
    slices = [wl_view(pod_sets={"main": 3}, admitted={"main": 3})]
    newer = gated(0, created=20)
    assert OUT_OF_ORDER not in run(slices, [newer, released(1, created=10), released(2)])
    found = run(slices, [newer, released(1, created=10), released(2, created=20)])
    assert found[OUT_OF_ORDER].pods == ("p2",) and "while earlier p0" in found[OUT_OF_ORDER].message


def test_nothing_to_report_on_a_healthy_owner() -> None:
    slices = [wl_view(pod_sets={"main": 3}, admitted={"main": 2})]
    assert run(slices, [released(0), released(1), gated(2)], now=T0 + 1000) == {}


def test_tracker_reports_once_after_the_grace_and_measures_duration() -> None:
    slices = [wl_view(pod_sets={"main": 2}, admitted={"main": 1})]
    pods = [released(0), released(1)]
    found, _ = audit_owner(
        slices, pods, GATE, owner=OWNER, kind="Job.batch", namespace="ns", now=T0, stall_seconds=30
    )
    t = FindingTracker(report_after=2.0)
    due, again = t.update("k", found, now=100.0)
    assert due == [] and again == 102.0 and t.counts() == {}
    due, again = t.update("k", found, now=102.5)
    assert [f.finding for f in due] == [OVER_RELEASE] and again is None
    assert due[0].seconds == pytest.approx(2.5)
    assert t.counts() == {("Job.batch", OVER_RELEASE): 1}
    due, _ = t.update("k", found, now=110.0)
    assert due == []  # reported once
    assert t.findings("k")[0].seconds == pytest.approx(10.0)
    due, _ = t.update("k", [], now=111.0)  # resolved
    assert t.counts() == {} and t.findings() == []
    assert t.releasable_since("k", ["a"], 5.0) == {"a": 5.0}
    assert t.releasable_since("k", ["a", "b"], 9.0) == {"a": 5.0, "b": 9.0}
    assert t.releasable_since("k", ["b"], 10.0) == {"b": 9.0}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


NS = "team-a"


def setup_job(fake: FakeKube, n: int, released_ix: set[int]) -> dict[str, Any]:
    owner = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "namespace": NS, "uid": "uid-train"},
        "spec": {"parallelism": n, "completionMode": "Indexed"},
    }
    fake.put(JOBS, owner)
    for i in range(n):
        fake.put(PODS, job_pod(owner, i, gates=[] if i in released_ix else None))
    return owner


def oneshot_config() -> Config:
    return Config.model_validate({"kinds": [{"group": "batch", "kind": "Job"}]})


@pytest.mark.anyio
async def test_one_shot_audit_reads_every_owner_and_names_the_pods() -> None:
    from ungater._cli.audit import audit_cluster, render_findings
    from ungater._cli.explain import explain

    fake = FakeKube()
    fake.served["kueue.x-k8s.io"] = ["v1beta2"]
    owner = setup_job(fake, 4, released_ix={0, 1, 2})
    fake.put(WORKLOADS, workload(owner, "train-a", count=4, admitted=2))
    healthy = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "ok", "namespace": NS, "uid": "uid-ok"},
        "spec": {"parallelism": 1, "completionMode": "Indexed"},
    }
    fake.put(JOBS, healthy)
    fake.put(PODS, job_pod(healthy, 0, gates=[]))
    fake.put(WORKLOADS, workload(healthy, "ok-a", count=1, admitted=1))
    registry = PluginRegistry.from_modules({"job": job_plugin})
    report = await audit_cluster(fake, oneshot_config(), registry, NS)
    assert report["owners"] == 2 and report["summary"] == {OVER_RELEASE: 1}
    (f,) = report["findings"]
    assert f["owner"] == f"Job {NS}/train" and f["workload"] == "train-a"
    assert f["podSet"] == "main" and f["pods"] == ["train-0-x000", "train-1-x001", "train-2-x002"]
    text = render_findings(report)
    assert "WARNING OverRelease" in text and "beyond the cap in order: train-2-x002" in text
    assert not fake.patches
    shown = await explain(fake, oneshot_config(), registry, NS, "train-a")
    assert [x["finding"] for x in shown["findings"]] == [OVER_RELEASE]
    # mode: auto (the default) on Kueue's own gate with no policy guarding it: audit
    assert shown["mode"] == "audit" and "no admission policy" in shown["modeWhy"]
