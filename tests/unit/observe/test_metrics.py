"""Prometheus metrics: names in the exposition, counters moving, and the scrape-time collector
reading the controller's snapshot (and surviving none, or one that fails)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest
import ungater_plugins.job as job_plugin
from prometheus_client.parser import text_string_to_metric_families

from tests.fakekube import FakeKube
from ungater._controller.controller import Controller
from ungater._decide.indexes import OwnerKey
from ungater._model.config import Config
from ungater._observe.metrics import CONTENT_TYPE, ControllerSnapshot, Metrics, seconds_since
from ungater._plugins.registry import PluginRegistry

NAMES = [
    "ungater_pods_released_total",
    "ungater_release_latency_seconds",
    "ungater_reconcile_duration_seconds",
    "ungater_reconcile_total",
    "ungater_plugin_errors_total",
    "ungater_patches_total",
    "ungater_foreign_releases_total",
    "ungater_leader",
    "ungater_events_total",
    "workqueue_depth",
    "workqueue_adds_total",
    "workqueue_retries_total",
    "ungater_expectations_pending",
    "ungater_expectations_expired_total",
    "ungater_watch_restarts_total",
    "ungater_watch_relists_total",
    "ungater_watch_silent_restarts_total",
    "ungater_cached_objects",
    "ungater_caches_synced",
]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def samples(m: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(m.render().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(m: Metrics, metric: str, **labels: str) -> float:
    return samples(m)[(metric, tuple(sorted(labels.items())))]


def test_every_metric_is_in_the_exposition() -> None:
    text = Metrics().render().decode()
    missing = [n for n in NAMES if f"# TYPE {n} " not in text]
    assert not missing, missing
    assert CONTENT_TYPE.startswith("text/plain; version=0.0.4")


def test_counters_and_histograms_move() -> None:
    m = Metrics()
    m.observe_release("Job.batch", "main", latency=0.3)
    m.observe_release("Job.batch", "main", latency=None)
    m.observe_release("JobSet.jobset.x-k8s.io", "workers", latency=42.0)
    m.observe_reconcile("success", 0.004)
    m.observe_reconcile("plugin_error", 0.002)
    m.observe_patch("released")
    m.observe_patch("conflict")
    m.observe_plugin_error("job")
    m.observe_foreign_release()
    m.observe_event("Normal", "Released", "created")
    assert value(m, "ungater_pods_released_total", kind="Job.batch", pod_set="main") == 2
    assert (
        value(m, "ungater_pods_released_total", kind="JobSet.jobset.x-k8s.io", pod_set="workers")
        == 1
    )
    assert value(m, "ungater_release_latency_seconds_count") == 2
    assert value(m, "ungater_release_latency_seconds_bucket", le="0.5") == 1
    assert value(m, "ungater_release_latency_seconds_bucket", le="60.0") == 2
    assert value(m, "ungater_reconcile_total", result="success") == 1
    assert value(m, "ungater_reconcile_total", result="plugin_error") == 1
    assert value(m, "ungater_reconcile_total", result="error") == 0  # exists before it happens
    assert value(m, "ungater_reconcile_duration_seconds_count") == 2
    assert value(m, "ungater_patches_total", outcome="released") == 1
    assert value(m, "ungater_patches_total", outcome="gone") == 0
    assert value(m, "ungater_plugin_errors_total", plugin="job") == 1
    assert value(m, "ungater_foreign_releases_total") == 1
    assert (
        value(m, "ungater_events_total", type="Normal", reason="Released", outcome="created") == 1
    )


def test_pods_released_together_count_as_each_released_alone() -> None:
    """The reconciler observes a pod set's releases in one call (``pods=``) and its waits in
    one call; the series move as one call per pod would move them."""
    m = Metrics()
    m.observe_release("Job.batch", "main", latency=0.3, pods=3)
    m.observe_release("Job.batch", "main", latency=None, pods=2)
    m.observe_release_wait("Job.batch", 0.1, 2.0, -1.0)
    m.observe_release_wait("Job.batch")
    m.observe_patch("superseded")  # not a series made up front: made on first use
    assert value(m, "ungater_pods_released_total", kind="Job.batch", pod_set="main") == 5
    assert value(m, "ungater_release_latency_seconds_count") == 3
    assert value(m, "ungater_release_wait_seconds_count", kind="Job.batch") == 3
    assert value(m, "ungater_release_wait_seconds_sum", kind="Job.batch") == 2.1
    assert value(m, "ungater_patches_total", outcome="superseded") == 1


def test_registries_are_private() -> None:
    a, b = Metrics(), Metrics()  # no duplicate-registration error: nothing global
    a.observe_patch("error")
    assert value(a, "ungater_patches_total", outcome="error") == 1
    assert value(b, "ungater_patches_total", outcome="error") == 0


def test_leader_gauge_reads_the_elector() -> None:
    m = Metrics()
    state = {"leading": False}
    m.bind_leader(lambda: state["leading"])
    assert value(m, "ungater_leader") == 0
    state["leading"] = True
    assert value(m, "ungater_leader") == 1


class Source:
    """A ``SnapshotSource`` whose figures the test moves between scrapes."""

    def __init__(self, snap: ControllerSnapshot) -> None:
        self.snap = snap

    def metrics_snapshot(self) -> ControllerSnapshot:
        return self.snap


def test_collector_reads_the_snapshot_at_scrape_time() -> None:
    watches = {
        "workloads.kueue.x-k8s.io@*": {"watch_restarts": 3, "relists_gone": 1},
        "pods.core@*": {"watch_restarts": 5, "events": 40},
    }
    source = Source(
        ControllerSnapshot(
            queue_depth=3,
            queue_adds=3,
            queue_retries=1,
            expectations_pending=4,
            expectations_expired=7,
            watches=watches,
            cached_workloads=2,
            cached_pods=4,
            cached_intermediates=1,
            stood_down={"Job.batch": True},
            gate_guard={"g": "unknown"},
            gated_pods={("Job.batch", "g", "capacity"): 2},
        )
    )
    m = Metrics()
    m.bind(source)
    assert value(m, "workqueue_depth", name="ungater") == 3
    assert value(m, "workqueue_adds_total", name="ungater") == 3
    assert value(m, "workqueue_retries_total", name="ungater") == 1
    assert value(m, "ungater_expectations_pending") == 4
    assert value(m, "ungater_expectations_expired_total") == 7
    assert value(m, "ungater_watch_restarts_total", resource="workloads.kueue.x-k8s.io@*") == 3
    assert value(m, "ungater_watch_restarts_total", resource="pods.core@*") == 5
    assert value(m, "ungater_watch_relists_total", resource="workloads.kueue.x-k8s.io@*") == 1
    assert value(m, "ungater_watch_silent_restarts_total", resource="pods.core@*") == 0
    assert value(m, "ungater_watch_events_total", resource="pods.core@*") == 40
    assert value(m, "ungater_cached_objects", kind="workloads") == 2
    assert value(m, "ungater_cached_objects", kind="pods") == 4
    assert value(m, "ungater_cached_objects", kind="intermediates") == 1
    assert value(m, "ungater_stood_down", kind="Job.batch") == 1
    assert value(m, "ungater_gate_guarded", gate="g") == -1  # the policies could not be read
    assert value(m, "ungater_gated_pods", kind="Job.batch", gate="g", reason="capacity") == 2
    assert value(m, "ungater_caches_synced") == 0
    source.snap = replace(source.snap, synced=True, queue_depth=4)
    assert value(m, "ungater_caches_synced") == 1  # read at scrape time, not at bind time
    assert value(m, "workqueue_depth", name="ungater") == 4


class Failing:
    def metrics_snapshot(self) -> ControllerSnapshot:
        raise RuntimeError("a bug")


def test_collector_unbound_reports_an_idle_controller_and_survives_a_failing_one() -> None:
    m = Metrics()
    got = samples(m)
    assert got[("ungater_caches_synced", ())] == 0
    assert got[("ungater_cached_objects", (("kind", "pods"),))] == 0
    m.bind(Failing())
    got = samples(m)
    assert ("ungater_caches_synced", ()) not in got  # the controller's series are skipped
    assert ("ungater_patches_total", (("outcome", "error"),)) in got  # the rest is still there


@pytest.mark.anyio
async def test_a_controller_snapshot_reads_its_parts() -> None:
    ctl = Controller(
        Config.model_validate({"kinds": [{"group": "batch", "kind": "Job"}]}),
        FakeKube(),
        PluginRegistry.from_modules({"job": job_plugin}),
    )
    ctl.state.queue.add(OwnerKey("ns", "u1"))
    ctl.state.ledger.expectations.expect(OwnerKey("ns", "u1"), ["p1", "p2"])
    await ctl.start()
    snap = ctl.metrics_snapshot()
    assert (snap.queue_depth, snap.queue_adds, snap.expectations_pending) == (1, 1, 2)
    assert not snap.synced and snap.stood_down == {"Job.batch": False}
    assert set(snap.watches) == {r.name for r in ctl.reflectors}
    assert all(counters["lists"] == 0 for counters in snap.watches.values())


def test_render_for_negotiates_openmetrics() -> None:
    m = Metrics()
    body, ctype = m.render_for("application/openmetrics-text; version=1.0.0")
    assert ctype.startswith("application/openmetrics-text") and body.endswith(b"# EOF\n")
    body, ctype = m.render_for("")
    assert ctype == CONTENT_TYPE and body == m.render()


def test_seconds_since() -> None:
    now = datetime(2026, 1, 2, 3, 4, 10, tzinfo=UTC)
    assert seconds_since("2026-01-02T03:04:05Z", now) == 5.0
    assert seconds_since("2026-01-02T03:04:09.750000Z", now) == 0.25
    assert seconds_since("2026-01-02T03:04:20Z", now) == 0.0  # skew never goes negative
    assert seconds_since("", now) is None and seconds_since("yesterday", now) is None
