"""Kubernetes Events on Workloads (core/v1), best effort and rate-limited.

Events tell a user in ``kubectl describe workload`` what ungater did ("released 3 pods of pod
set main") or why it did not (unmapped pods, a plugin error, a gate removed by someone else).
They must never slow down or break a release, so this module owns the whole policy:
``record()`` is synchronous and never blocks or raises; it applies a per-key token bucket (a
spam filter like client-go's: a burst, then one event per ``per_key_interval``) and a global
one, and hands the event to a bounded queue, dropping (and counting) when full. A background
task (``run()``) sends them; repeats of the same (object, type, reason, message) become one
Event whose ``count`` and ``lastTimestamp`` are merge-patched, as client-go aggregates them.
``close()`` drains the queue on shutdown, within a timeout.
"""

from __future__ import annotations

import logging
import socket
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import anyio

from ungater._kube.client import EVENTS, ApiError, KubeClient
from ungater._kube.kueue import KUEUE_GROUP
from ungater._kube.ratelimit import TokenBucket
from ungater._model.views import WorkloadView

__all__ = [
    "FOREIGN_RELEASE",
    "NORMAL",
    "PLUGIN_ERROR",
    "PODS_UNMAPPED",
    "RELEASED",
    "RELEASE_BLOCKED",
    "STALE_PROVISIONING_REQUEST",
    "STOOD_DOWN",
    "WARNING",
    "EventClient",
    "EventRecorder",
    "InvolvedObject",
    "released_message",
]

log = logging.getLogger("ungater.events")

NORMAL = "Normal"
WARNING = "Warning"
RELEASED = "Released"  # Normal: released_message(n, pod_set)
PODS_UNMAPPED = "PodsUnmapped"  # Warning: pods whose pod set the active slice does not know
PLUGIN_ERROR = "PluginError"  # Warning: the kind's plugin failed on this owner
FOREIGN_RELEASE = "ForeignRelease"  # Warning: someone else removed our gate
RELEASE_BLOCKED = "ReleaseBlocked"  # Warning: the API server refused a release for good
STALE_PROVISIONING_REQUEST = "StaleProvisioningRequest"  # Warning: pods for another PR
STOOD_DOWN = "StoodDown"  # Warning: another releaser works this kind's gate; we stopped
MAX_MESSAGE = 1024


def released_message(n: int, pod_set: str) -> str:
    """``released 3 pods of pod set main``."""
    return f"released {n} pod{'' if n == 1 else 's'} of pod set {pod_set}"


EventClient = KubeClient  # the calls made here are a subset of the client seam


@dataclass(frozen=True, slots=True)
class InvolvedObject:
    """What an Event is about."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str

    @classmethod
    def workload(cls, wl: WorkloadView, version: str) -> InvolvedObject:
        """A Workload; ``version`` is ``v1beta2`` or a whole ``kueue.x-k8s.io/v1beta2``."""
        api_version = version if "/" in version else f"{KUEUE_GROUP}/{version}"
        return cls(api_version, "Workload", wl.namespace, wl.name, wl.uid)

    def ref(self) -> dict[str, str]:
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
            "uid": self.uid,
        }


@dataclass(frozen=True, slots=True)
class _Pending:
    obj: InvolvedObject
    type_: str
    reason: str
    message: str
    stamp: str


@dataclass(slots=True)
class _Aggregate:
    namespace: str
    name: str
    count: int


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _stamp(dt: datetime) -> str:
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class EventRecorder:
    """Records Events; see the module docstring. ``stats`` counts every outcome:
    created, aggregated, dropped_rate_limited, dropped_queue_full, dropped_closed, invalid,
    error. ``observer(type, reason, outcome)`` is told of each (e.g. ``Metrics.observe_event``).
    """

    def __init__(
        self,
        client: EventClient,
        component: str = "ungater",
        host: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        per_key_interval: float = 300.0,
        burst: int = 25,
        qps: float = 10.0,
        global_burst: int = 100,
        queue_size: int = 1000,
        max_keys: int = 4096,
        request_timeout: float = 10.0,
        wall_clock: Callable[[], datetime] = _utcnow,
        observer: Callable[[str, str, str], None] | None = None,
    ) -> None:
        if per_key_interval <= 0 or qps <= 0 or burst < 1 or global_burst < 1 or queue_size < 1:
            raise ValueError("event rate limits and queue size must be positive")
        self.client = client
        self.component = component
        self.host = host if host is not None else socket.gethostname()
        self.clock = clock
        self.per_key_rate = 1.0 / per_key_interval
        self.burst = float(burst)
        self.qps = qps
        self.global_burst = float(global_burst)
        self.max_keys = max(1, max_keys)
        self.request_timeout = request_timeout
        self.wall_clock = wall_clock
        self.observer = observer
        self.stats: dict[str, int] = {}
        self._buckets: OrderedDict[tuple[str, str, str], TokenBucket] = OrderedDict()
        self._global: TokenBucket | None = None
        self._aggregates: OrderedDict[tuple[str, str, str, str], _Aggregate] = OrderedDict()
        self.queue_size = queue_size
        self._queue: deque[_Pending] = deque()
        self._wakeup: anyio.Event | None = None  # set when the queue gets an item or closes
        self._closed = False
        self._done: anyio.Event | None = None
        self._run_scope: anyio.CancelScope | None = None
        self._close_deadline: float | None = None
        self._seq = 0
        self._failing = False

    # -- the caller's side: never blocks, never raises -----------------------------------------

    def record(self, obj: InvolvedObject, type_: str, reason: str, message: str) -> bool:
        """Queue an Event; False if it was dropped (closed, invalid, rate-limited, queue full)."""
        try:
            outcome = self._enqueue(obj, type_, reason, message)
        except Exception:  # a bug here must cost an event, not a release
            log.exception("recording an event failed")
            return False
        if outcome:
            self._count(type_, reason, outcome)
            return False
        return True

    def _enqueue(self, obj: InvolvedObject, type_: str, reason: str, message: str) -> str:
        """Empty when queued, else why it was dropped."""
        if self._closed:
            return "dropped_closed"
        if type_ not in (NORMAL, WARNING) or not reason or not obj.uid or not obj.name:
            return "invalid"
        if not self._allow(self.clock(), (obj.uid, type_, reason)):
            return "dropped_rate_limited"
        if len(message) > MAX_MESSAGE:
            message = message[: MAX_MESSAGE - 3] + "..."
        if len(self._queue) >= self.queue_size:
            return "dropped_queue_full"
        self._queue.append(_Pending(obj, type_, reason, message, _stamp(self.wall_clock())))
        self._wake()
        return ""

    def _wake(self) -> None:
        wakeup, self._wakeup = self._wakeup, None
        if wakeup is not None:
            wakeup.set()

    def _allow(self, now: float, key: tuple[str, str, str]) -> bool:
        """Both buckets must hold a token; only then are both charged."""
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = TokenBucket(self.per_key_rate, self.burst, now)
            while len(self._buckets) > self.max_keys:  # forget the least recently used keys
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
        if self._global is None:
            self._global = TokenBucket(self.qps, self.global_burst, now)
        if not bucket.refill(now) or not self._global.refill(now):
            return False
        bucket.take()
        self._global.take()
        return True

    def _count(self, type_: str, reason: str, outcome: str) -> None:
        self.stats[outcome] = self.stats.get(outcome, 0) + 1
        if self.observer is not None:
            try:
                self.observer(type_, reason, outcome)
            except Exception:
                log.debug("event observer failed", exc_info=True)

    # -- the background side -------------------------------------------------------------------

    async def run(self) -> None:
        """Send queued Events until ``close()`` (after draining) or cancellation."""
        self._done = anyio.Event()
        try:
            with anyio.CancelScope() as scope:
                self._run_scope = scope
                if self._close_deadline is not None:  # close() came before we started
                    scope.deadline = self._close_deadline
                while self._queue or not self._closed:  # each pass sends one or waits
                    if self._queue:
                        await self._deliver(self._queue.popleft())
                        continue
                    self._wakeup = anyio.Event()
                    await self._wakeup.wait()
            if scope.cancelled_caught and self._closed:
                left = len(self._queue)
                while self._queue:
                    item = self._queue.popleft()
                    self._count(item.type_, item.reason, "dropped_closed")
                log.warning("events: closing took too long; dropped %d queued event(s)", left)
        finally:
            self._run_scope = None
            self._done.set()

    async def close(self, timeout: float = 5.0) -> None:
        """Stop accepting Events and let ``run()`` send what is queued, for up to ``timeout``
        seconds (also when ``run()`` starts only later); the rest is dropped. Never raises."""
        self._closed = True
        self._wake()
        deadline = anyio.current_time() + timeout
        if self._close_deadline is None or deadline < self._close_deadline:
            self._close_deadline = deadline
        scope = self._run_scope
        if scope is not None:
            scope.deadline = min(scope.deadline, deadline)
        done = self._done
        if done is not None:
            with anyio.move_on_after(timeout + 1.0):  # run()'s own deadline ends it before
                await done.wait()

    async def _deliver(self, item: _Pending) -> None:
        try:
            with anyio.fail_after(self.request_timeout):
                outcome = await self._write(item)
        except Exception as exc:  # API errors, connection errors, timeouts: drop this one
            self._count(item.type_, item.reason, "error")
            level = logging.DEBUG if self._failing else logging.WARNING
            log.log(
                level,
                "event %s on %s/%s not sent: %r",
                item.reason,
                item.obj.namespace,
                item.obj.name,
                exc,
            )
            self._failing = True
            return
        self._failing = False
        self._count(item.type_, item.reason, outcome)

    async def _write(self, item: _Pending) -> str:
        key = (item.obj.uid, item.type_, item.reason, item.message)
        agg = self._aggregates.get(key)
        if agg is not None:
            try:
                await self.client.merge_patch(
                    EVENTS,
                    agg.namespace,
                    agg.name,
                    {"count": agg.count + 1, "lastTimestamp": item.stamp},
                )
            except ApiError as exc:
                if exc.status != 404:
                    raise
                del self._aggregates[key]  # the Event expired on the server: start a new one
            else:
                agg.count += 1
                self._aggregates.move_to_end(key)
                return "aggregated"
        namespace = item.obj.namespace or "default"
        body = self._event(item, namespace)
        created = await self.client.create(EVENTS, namespace, body)
        name = str((created.get("metadata") or {}).get("name") or body["metadata"]["name"])
        self._aggregates[key] = _Aggregate(namespace, name, 1)
        while len(self._aggregates) > self.max_keys:
            self._aggregates.popitem(last=False)
        return "created"

    def _event(self, item: _Pending, namespace: str) -> dict[str, Any]:
        self._seq += 1
        unique = int(self.wall_clock().timestamp() * 1e9) + self._seq
        suffix = f".{unique:x}"
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": item.obj.name[: 253 - len(suffix)] + suffix,
                "namespace": namespace,
            },
            "involvedObject": item.obj.ref(),
            "reason": item.reason,
            "message": item.message,
            "type": item.type_,
            "source": {"component": self.component, "host": self.host},
            "firstTimestamp": item.stamp,
            "lastTimestamp": item.stamp,
            "count": 1,
            "reportingComponent": self.component,
            "reportingInstance": self.host,
        }
