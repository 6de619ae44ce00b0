"""The controller's own figures at scrape time: the snapshot, the protocol and the collector.

The work queue, expectations, reflectors and caches already count what ``/metrics`` shows; they
are read when Prometheus scrapes instead of being counted twice. The controller answers
``metrics_snapshot()`` (the ``SnapshotSource`` protocol) with a ``ControllerSnapshot`` of plain
figures, and ``ControllerCollector`` turns it into series, so the metrics know nothing of the
controller's parts. A snapshot that fails drops only these series, never the scrape.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["WATCH_SERIES", "ControllerCollector", "ControllerSnapshot", "SnapshotSource"]

log = logging.getLogger("ungater.metrics")
QUEUE_NAME = "ungater"  # the ``name`` label of the workqueue_* series (controller-runtime style)

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
    modes: Mapping[str, str] = field(default_factory=dict)  # kind -> release|audit, now
    stale_provisioning_pods: int = 0
    gate_guard: Mapping[str, str] = field(default_factory=dict)  # gate -> guarded|unguarded|...
    gated_pods: Mapping[tuple[str, str, str], int] = field(default_factory=dict)  # kind, gate, why
    stalled_pods: Mapping[str, int] = field(default_factory=dict)  # by kind (releasing kinds)


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
    modes = GaugeMetricFamily(
        "ungater_mode",
        "1 for the mode each kind runs in now (release or audit), 0 for the other: mode auto "
        "audits a gate Kueue releases itself while no admission policy guards it.",
        labels=["kind", "mode"],
    )
    for kind, mode in sorted(snap.modes.items()):
        for m in ("release", "audit"):
            modes.add_metric([kind, m], 1.0 if mode == m else 0.0)
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
    stalled = GaugeMetricFamily(
        "ungater_stalled_pods",
        "Pods of a releasing kind that could go (chosen for release, or held only by a refusal, "
        "a pod set update conflict or an unprovable ownership) and have stayed gated for longer "
        "than audit.stallSeconds; a kind that audits reports Stalled findings instead.",
        labels=["kind"],
    )
    for kind in sorted(snap.modes):
        stalled.add_metric([kind], float(snap.stalled_pods.get(kind, 0)))
    return (findings, stood, modes, stale_pods, guarded, gated, stalled)


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
