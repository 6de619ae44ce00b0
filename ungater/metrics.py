"""Prometheus metrics of one ungater process, on a private registry (never the global one).

This module owns the metric names and labels, which are the contract with dashboards and
alerts. Things the controller already counts (work queue, expectations, reflectors, caches) are
read at scrape time instead of being counted twice: the controller answers
``metrics_snapshot()`` with a ``ControllerSnapshot`` of plain figures (the ``SnapshotSource``
protocol), and a snapshot that fails never fails the scrape. Things that happen (a release, a
reconcile, a patch outcome) are ordinary counters and histograms that the controller moves.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, choose_encoder, generate_latest
from prometheus_client.registry import Collector

__all__ = [
    "CONTENT_TYPE",
    "PATCH_OUTCOMES",
    "RECONCILE_RESULTS",
    "RELEASE_LATENCY_BUCKETS",
    "ControllerSnapshot",
    "Metrics",
    "SnapshotSource",
    "seconds_since",
]

log = logging.getLogger(__name__)

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4  # what ``render()`` produces
QUEUE_NAME = "ungater"  # the ``name`` label of the workqueue_* series (controller-runtime style)
RECONCILE_RESULTS = ("success", "error", "plugin_error", "requeue")
PATCH_OUTCOMES = ("released", "conflict", "gone", "deleting", "blocked", "error")
# admission to release: a fast path is tens of milliseconds, a slow one a minute or more
RELEASE_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0)
# a wait may be long on purpose (a refused release backing off), so the top buckets go far
RELEASE_WAIT_BUCKETS = (
    *(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
    *(300.0, 900.0, 3600.0),
)
RECONCILE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def seconds_since(timestamp: str, now: datetime | None = None) -> float | None:
    """Seconds from an RFC 3339 API timestamp (``2026-01-02T03:04:05Z``, fractions allowed) to
    ``now`` (default: the current UTC time); None if it cannot be parsed. Negative results
    (clock skew between the API server and us) are clamped to 0."""
    if not timestamp:
        return None
    try:
        stamp = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return max(0.0, ((now or datetime.now(UTC)) - stamp).total_seconds())


WATCH_SERIES = {  # a reflector's counter -> (series, help)
    "watch_restarts": ("ungater_watch_restarts", "Watches restarted after a failure."),
    "relists_gone": ("ungater_watch_relists", "Relists after 410 Gone."),
    "silent_restarts": (
        "ungater_watch_silent_restarts",
        "Watches restarted because the stream was silent too long.",
    ),
    "lists": ("ungater_watch_lists", "Lists made (the first one included)."),
    "events": ("ungater_watch_events", "Watch events applied to the cache."),
    "malformed": ("ungater_watch_malformed", "Objects skipped as malformed."),
}


@dataclass(frozen=True)
class ControllerSnapshot:
    """What the controller already counts, read once per scrape: plain figures, so the
    collector needs to know nothing of the controller's parts. The defaults are an idle,
    unsynced controller's."""

    queue_depth: int = 0
    queue_adds: int = 0
    queue_retries: int = 0
    expectations_pending: int = 0
    expectations_expired: int = 0
    release_blocked: int = 0  # gated pods backing off after a refusal
    watches: Mapping[str, Mapping[str, int]] = field(default_factory=dict)  # by resource
    cached_workloads: int = 0
    cached_pods: int = 0
    cached_intermediates: int = 0
    synced: bool = False
    audit_findings: Mapping[tuple[str, str], int] = field(default_factory=dict)  # kind, finding
    stood_down: Mapping[str, bool] = field(default_factory=dict)  # by kind
    stale_provisioning_pods: int = 0
    gate_guard: Mapping[str, str] = field(default_factory=dict)  # gate -> guarded|unguarded|...
    gated_pods: Mapping[tuple[str, str, str], int] = field(default_factory=dict)  # kind, gate, why


class SnapshotSource(Protocol):
    """What ``Metrics.bind`` takes: anything that can say its figures now."""

    def metrics_snapshot(self) -> ControllerSnapshot: ...


class ControllerCollector(Collector):
    """Turns the bound source's snapshot into series at scrape time. Unbound, it reports an
    idle controller; a source that fails to answer drops only its own series, never the
    scrape."""

    def __init__(self) -> None:
        self.source: SnapshotSource | None = None
        self._warned = False

    def collect(self) -> Iterator[Metric]:
        try:
            snap = self.source.metrics_snapshot() if self.source else ControllerSnapshot()
        except Exception:
            level = logging.DEBUG if self._warned else logging.WARNING
            log.log(level, "metrics: reading the controller failed", exc_info=True)
            self._warned = True
            return
        for part in (_queue, _expectations, _watches, _caches, _audit):
            yield from part(snap)


def _queue(snap: ControllerSnapshot) -> Iterable[Metric]:
    depth = GaugeMetricFamily(
        "workqueue_depth", "Current depth of the work queue.", labels=["name"]
    )
    depth.add_metric([QUEUE_NAME], snap.queue_depth)
    adds = CounterMetricFamily(
        "workqueue_adds", "Total number of adds handled by the work queue.", labels=["name"]
    )
    adds.add_metric([QUEUE_NAME], snap.queue_adds)
    retries = CounterMetricFamily(
        "workqueue_retries", "Total number of retries (backoff re-adds).", labels=["name"]
    )
    retries.add_metric([QUEUE_NAME], snap.queue_retries)
    return (depth, adds, retries)


def _expectations(snap: ControllerSnapshot) -> Iterable[Metric]:
    return (
        GaugeMetricFamily(
            "ungater_pods_release_blocked",
            "Gated pods whose release the API server refused for good, backing off now.",
            value=snap.release_blocked,
        ),
        GaugeMetricFamily(
            "ungater_expectations_pending",
            "Pods patched whose release the cache has not shown yet.",
            value=snap.expectations_pending,
        ),
        CounterMetricFamily(
            "ungater_expectations_expired",
            "Expectations that timed out and were settled from the API server.",
            value=snap.expectations_expired,
        ),
    )


def _watches(snap: ControllerSnapshot) -> Iterable[Metric]:
    families = {
        counter: CounterMetricFamily(name, doc, labels=["resource"])
        for counter, (name, doc) in WATCH_SERIES.items()
    }
    for resource, counters in snap.watches.items():
        for counter, family in families.items():
            family.add_metric([resource], counters.get(counter, 0))
    return families.values()


def _audit(snap: ControllerSnapshot) -> Iterable[Metric]:
    findings = GaugeMetricFamily(
        "ungater_audit_findings",
        "Open audit findings (over-release, stall, release without admission, order, "
        "foreign gates) by owner kind and finding.",
        labels=["kind", "finding"],
    )
    for (kind, finding), n in sorted(snap.audit_findings.items()):
        findings.add_metric([kind, finding], float(n))
    stood = GaugeMetricFamily(
        "ungater_stood_down",
        "1 for a kind that stopped releasing because another writer kept removing its gate.",
        labels=["kind"],
    )
    for kind, down in snap.stood_down.items():
        stood.add_metric([kind], 1.0 if down else 0.0)
    stale_pods = GaugeMetricFamily(
        "ungater_pods_stale_provisioning_request",
        "Gated pods bound to a ProvisioningRequest other than the active slice's: they stay "
        "gated and uncounted.",
        value=float(snap.stale_provisioning_pods),
    )
    guarded = GaugeMetricFamily(
        "ungater_gate_guarded",
        "1 when an admission policy refuses the gate's removal to the other releaser "
        "(Kueue), 0 when none does, -1 when the policies cannot be read.",
        labels=["gate"],
    )
    states = {"guarded": 1.0, "unguarded": 0.0}
    for gate, state in sorted(snap.gate_guard.items()):
        guarded.add_metric([gate], states.get(state, -1.0))
    gated = GaugeMetricFamily(
        "ungater_gated_pods",
        "Gated pods of elastic owners by kind, gate and why they wait (capacity, group, "
        "refused, stale-provisioning-request, pod-set-update-conflict, ownership-unresolved, "
        "unmapped), from each owner's last decision.",
        labels=["kind", "gate", "reason"],
    )
    for (kind, gate, reason), n in sorted(snap.gated_pods.items()):
        gated.add_metric([kind, gate, reason], float(n))
    return (findings, stood, stale_pods, guarded, gated)


def _caches(snap: ControllerSnapshot) -> Iterable[Metric]:
    cached = GaugeMetricFamily(
        "ungater_cached_objects", "Objects held in the caches.", labels=["kind"]
    )
    cached.add_metric(["workloads"], snap.cached_workloads)
    cached.add_metric(["pods"], snap.cached_pods)
    cached.add_metric(["intermediates"], snap.cached_intermediates)
    return (
        cached,
        GaugeMetricFamily(
            "ungater_caches_synced",
            "1 once every cache has listed and the workers may start.",
            value=1.0 if snap.synced else 0.0,
        ),
    )


class Metrics:
    """All metrics of one process. Counters and histograms are public attributes; the
    ``observe_*`` helpers are the intended way to move them."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.pods_released = Counter(
            "ungater_pods_released_total",
            "Pods whose scheduling gate ungater removed.",
            ["kind", "pod_set"],
            registry=r,
        )
        self.release_latency = Histogram(
            "ungater_release_latency_seconds",
            "Time from the workload slice's admission to a pod's release.",
            buckets=RELEASE_LATENCY_BUCKETS,
            registry=r,
        )
        self.release_wait = Histogram(
            "ungater_release_wait_seconds",
            "Time from the event that made a pod releasable (it arrived, its slice was "
            "admitted, a slot was freed, its owner changed) to its release, as this process saw "
            "them.",
            ["kind"],
            buckets=RELEASE_WAIT_BUCKETS,
            registry=r,
        )
        self.reconcile_duration = Histogram(
            "ungater_reconcile_duration_seconds",
            "Time one reconcile of an owner took.",
            buckets=RECONCILE_BUCKETS,
            registry=r,
        )
        self.reconciles = Counter(
            "ungater_reconcile_total", "Reconciles by result.", ["result"], registry=r
        )
        self.plugin_errors = Counter(
            "ungater_plugin_errors_total", "Errors raised by plugins.", ["plugin"], registry=r
        )
        self.patches = Counter(
            "ungater_patches_total", "Gate-removal patches by outcome.", ["outcome"], registry=r
        )
        self.foreign_releases = Counter(
            "ungater_foreign_releases_total",
            "Gates removed by someone else: another releaser is at work.",
            registry=r,
        )
        self.release_blocked = Counter(
            "ungater_release_blocked_total",
            "Release patches refused for good (admission webhook or policy, RBAC, validation); "
            "the pod stays gated and is retried with a long per-pod backoff.",
            ["kind"],
            registry=r,
        )
        self.audit_findings = Counter(
            "ungater_audit_findings_reported",
            "Audit findings reported (each once, when it has stayed open long enough).",
            ["kind", "finding"],
            registry=r,
        )
        self.leader = Gauge(
            "ungater_leader", "1 while this replica holds the leader lease.", registry=r
        )
        self.events = Counter(
            "ungater_events_total",
            "Kubernetes Events by type, reason and outcome "
            "(created, aggregated, dropped_rate_limited, dropped_queue_full, error).",
            ["type", "reason", "outcome"],
            registry=r,
        )
        for result in RECONCILE_RESULTS:  # every series exists from the start, at 0
            self.reconciles.labels(result)
        for outcome in PATCH_OUTCOMES:
            self.patches.labels(outcome)
        self.collector = ControllerCollector()
        r.register(self.collector)

    # -- wiring ---------------------------------------------------------------------------------

    def bind(self, source: SnapshotSource) -> None:
        """Export the source's figures (``Controller.metrics_snapshot``) at scrape time."""
        self.collector.source = source

    def bind_leader(self, is_leader: Callable[[], bool]) -> None:
        """Make ``ungater_leader`` read ``is_leader()`` at scrape time
        (e.g. ``metrics.bind_leader(lambda: elector.is_leader)``)."""
        self.leader.set_function(lambda: 1.0 if is_leader() else 0.0)

    # -- helpers for the controller ------------------------------------------------------------

    def observe_reconcile(self, result: str, seconds: float) -> None:
        self.reconciles.labels(result).inc()
        self.reconcile_duration.observe(max(0.0, seconds))

    def observe_patch(self, outcome: str) -> None:
        self.patches.labels(outcome).inc()

    def observe_release(self, kind: str, pod_set: str, latency: float | None = None) -> None:
        """One pod released; ``latency``: seconds since its slice was admitted, if known."""
        self.pods_released.labels(kind, pod_set).inc()
        if latency is not None:
            self.release_latency.observe(max(0.0, latency))

    def observe_release_wait(self, kind: str, seconds: float) -> None:
        """One pod released ``seconds`` after it became releasable."""
        self.release_wait.labels(kind).observe(max(0.0, seconds))

    def observe_plugin_error(self, plugin: str) -> None:
        self.plugin_errors.labels(plugin).inc()

    def observe_release_blocked(self, kind: str) -> None:
        self.release_blocked.labels(kind).inc()

    def observe_audit_finding(self, kind: str, finding: str) -> None:
        self.audit_findings.labels(kind, finding).inc()

    def observe_foreign_release(self) -> None:
        self.foreign_releases.inc()

    def observe_event(self, type_: str, reason: str, outcome: str) -> None:
        """The ``observer`` of ``ungater.events.EventRecorder``."""
        self.events.labels(type_, reason, outcome).inc()

    # -- exposition ----------------------------------------------------------------------------

    def render(self) -> bytes:
        """The Prometheus text format (``CONTENT_TYPE``)."""
        return generate_latest(self.registry)

    def render_for(self, accept: str) -> tuple[bytes, str]:
        """The format an ``Accept`` header asks for (text or OpenMetrics), and its type."""
        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type
