"""Prometheus metrics of one ungater process, on a private registry (never the global one).

This module owns the metric names and labels, which are the contract with dashboards and
alerts. Things the controller already counts (work queue, expectations, reflectors, caches) are
read at scrape time through ``ungater._observe.collector`` (``ControllerSnapshot``, re-exported here).
Things that happen (a release, a reconcile, a patch outcome) are ordinary counters and
histograms that the controller moves.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, choose_encoder, generate_latest

from ungater._observe.collector import ControllerCollector, ControllerSnapshot, SnapshotSource

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

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4  # what ``render()`` produces
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
        #: each patch outcome's series, looked up once: ``labels()`` per patch was a share of
        #: a release's CPU (bench/results/profile-throughput-1.md)
        self._patch_series = {outcome: self.patches.labels(outcome) for outcome in PATCH_OUTCOMES}
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
        series = self._patch_series.get(outcome)
        (series if series is not None else self.patches.labels(outcome)).inc()

    def observe_release(
        self, kind: str, pod_set: str, latency: float | None = None, pods: int = 1
    ) -> None:
        """``pods`` pods released at once; ``latency``: seconds since their slice was admitted,
        if known (observed once per pod)."""
        self.pods_released.labels(kind, pod_set).inc(pods)
        if latency is not None:
            for _ in range(pods):
                self.release_latency.observe(max(0.0, latency))

    def observe_release_wait(self, kind: str, *seconds: float) -> None:
        """A pod released ``seconds`` after it became releasable, for each one given."""
        series = self.release_wait.labels(kind)
        for s in seconds:
            series.observe(max(0.0, s))

    def observe_plugin_error(self, plugin: str) -> None:
        self.plugin_errors.labels(plugin).inc()

    def observe_release_blocked(self, kind: str) -> None:
        self.release_blocked.labels(kind).inc()

    def observe_audit_finding(self, kind: str, finding: str) -> None:
        self.audit_findings.labels(kind, finding).inc()

    def observe_foreign_release(self) -> None:
        self.foreign_releases.inc()

    def observe_event(self, type_: str, reason: str, outcome: str) -> None:
        """The ``observer`` of ``ungater._observe.events.EventRecorder``."""
        self.events.labels(type_, reason, outcome).inc()

    # -- exposition ----------------------------------------------------------------------------

    def render(self) -> bytes:
        """The Prometheus text format (``CONTENT_TYPE``)."""
        return generate_latest(self.registry)

    def render_for(self, accept: str) -> tuple[bytes, str]:
        """The format an ``Accept`` header asks for (text or OpenMetrics), and its type."""
        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type
