"""Leader election on a coordination.k8s.io/v1 Lease: only one replica releases pods at a time.

Two releasers running at once could each release up to the admitted count, so this module owns a
safety promise, not an optimisation: a replica acts only during a ``LeaderTerm``, and a term
ends (``term.lost`` is set) no later than ``renew_deadline`` after the last renewal the API
server accepted, which is before any standby may consider the lease expired.

The semantics are client-go's: the lease is taken when it is absent (create), released (empty
holder), already ours, or expired; "expired" means this replica has not seen the lease record
change for ``leaseDurationSeconds`` of its *own* monotonic clock, so clocks of different machines
are never compared. Every write is a merge patch carrying ``metadata.resourceVersion``, an
optimistic lock: a 409 means somebody else wrote first, and the lease is read again.
``release`` hands the lease over on a clean shutdown, so a standby takes over at its next try.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import anyio

from ungater._kube.client import ApiError, KubeClient, Resource

__all__ = [
    "LEASES",
    "LeaderElector",
    "LeaderStats",
    "LeaderTerm",
    "LeaseClient",
    "LeaseRecord",
    "micro_time",
]

log = logging.getLogger("ungater.leader")

LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease")
JITTER = 1.2  # acquire retries wait retry_period * [1, JITTER); renew_deadline must exceed it


LeaseClient = KubeClient  # the calls made here are a subset of the client seam


def micro_time(dt: datetime) -> str:
    """A Kubernetes MicroTime: ``2026-01-02T03:04:05.123456Z``."""
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """The leader-election fields of a Lease's spec."""

    holder: str
    lease_duration_seconds: int | None
    acquire_time: str
    renew_time: str
    transitions: int

    @classmethod
    def from_lease(cls, lease: dict[str, Any]) -> LeaseRecord:
        spec = lease.get("spec") or {}
        duration = spec.get("leaseDurationSeconds")
        transitions = spec.get("leaseTransitions")
        return cls(
            holder=str(spec.get("holderIdentity") or ""),
            lease_duration_seconds=(
                duration
                if isinstance(duration, int) and not isinstance(duration, bool) and duration > 0
                else None
            ),
            acquire_time=str(spec.get("acquireTime") or ""),
            renew_time=str(spec.get("renewTime") or ""),
            transitions=(transitions if isinstance(transitions, int) and transitions >= 0 else 0),
        )

    def to_spec(self) -> dict[str, Any]:
        return {
            "holderIdentity": self.holder,
            "leaseDurationSeconds": self.lease_duration_seconds,
            "acquireTime": self.acquire_time or None,
            "renewTime": self.renew_time or None,
            "leaseTransitions": self.transitions,
        }


@dataclass(eq=False)
class LeaderTerm:
    """One uninterrupted period of leadership. ``lost`` is set when it ends, for any reason
    (renew deadline passed, lease taken, released, elector cancelled); it is never reset."""

    number: int
    started_at: float  # on the elector's clock
    lost: anyio.Event
    # the Lease's resourceVersion as this term's acquiring write left it: every write the
    # previous leader's term made before that write is older (an etcd-backed API server
    # orders all writes by one revision)
    resource_version: str = ""

    @property
    def active(self) -> bool:
        return not self.lost.is_set()


@dataclass
class LeaderStats:
    attempts: int = 0
    failures: int = 0  # errors and timeouts of acquire/renew attempts
    conflicts: int = 0  # 409 answers to our writes
    terms: int = 0
    last_error: str = ""


class LeaderElector:
    """Acquires and renews one Lease; see the module docstring for the guarantees.

    ``run()`` is the loop (until cancelled or released). The rest of the process learns about
    leadership through ``is_leader``, ``await wait_leading()`` (returns the current
    ``LeaderTerm``), ``term.lost``, the optional callbacks, or ``run_while_leading(fn)``.
    """

    def __init__(
        self,
        client: LeaseClient,
        namespace: str,
        name: str,
        identity: str,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        *,
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
        wall_clock: Callable[[], datetime] = _utcnow,
        on_started_leading: Callable[[LeaderTerm], None] | None = None,
        on_stopped_leading: Callable[[LeaderTerm], None] | None = None,
    ) -> None:
        if not namespace or not name:
            raise ValueError("leader election needs the Lease's namespace and name")
        if not identity:
            raise ValueError("leader election needs a non-empty identity")
        if retry_period <= 0:
            raise ValueError("retryPeriod must be positive")
        if lease_duration < 1:
            raise ValueError("leaseDuration must be at least 1 second")
        if not renew_deadline < lease_duration:
            raise ValueError(
                f"renewDeadline ({renew_deadline}s) must be shorter than leaseDuration "
                f"({lease_duration}s): a leader must stop before its lease can expire"
            )
        if not renew_deadline > JITTER * retry_period:
            raise ValueError(
                f"renewDeadline ({renew_deadline}s) must exceed {JITTER} x retryPeriod "
                f"({retry_period}s), or a single slow retry loses the lease"
            )
        self.client = client
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.stats = LeaderStats()
        self._clock = clock
        self._sleep = sleep
        self._wall = wall_clock
        self._on_started = on_started_leading
        self._on_stopped = on_stopped_leading
        self._duration_seconds = math.ceil(lease_duration)
        self._observed: LeaseRecord | None = None
        self._observed_rv = ""
        self._observed_at = -math.inf  # our clock when the record last changed under our eyes
        self._renewed_at: float | None = None  # our clock when our last accepted write was sent
        self._term: LeaderTerm | None = None
        self._changed: anyio.Event | None = None
        self._lock: anyio.Lock | None = None
        self._run_scope: anyio.CancelScope | None = None
        self._released = False

    # -- what the rest of the process reads ---------------------------------------------------

    @property
    def is_leader(self) -> bool:
        """True only within a term and before the renew deadline of the last renewal."""
        term = self._term
        renewed = self._renewed_at
        return (
            term is not None
            and term.active
            and renewed is not None
            and self._clock() < renewed + self.renew_deadline
        )

    @property
    def term(self) -> LeaderTerm | None:
        """The current term, if leading."""
        term = self._term
        return term if term is not None and term.active else None

    @property
    def holder(self) -> str:
        """The holder of the lease as last seen ("" when unknown or released)."""
        return self._observed.holder if self._observed is not None else ""

    async def wait_leading(self) -> LeaderTerm:
        """Wait until this replica leads; return the term (its ``lost`` event ends it)."""
        while True:  # each pass waits for a state change; the loop ends when a term is active
            term = self.term
            if term is not None:
                return term
            if self._changed is None:
                self._changed = anyio.Event()
            await self._changed.wait()

    async def run_while_leading(self, fn: Callable[[LeaderTerm], Awaitable[None]]) -> None:
        """For every term: start ``fn(term)`` when it begins, cancel it when it is lost.

        Runs until cancelled; run ``run()`` alongside it. An exception from ``fn`` propagates.
        """
        while True:  # one pass per term
            term = await self.wait_leading()
            async with anyio.create_task_group() as tg:

                async def act(term: LeaderTerm = term) -> None:
                    await fn(term)

                tg.start_soon(act)
                await term.lost.wait()
                tg.cancel_scope.cancel()

    # -- the loop -----------------------------------------------------------------------------

    async def run(self) -> None:
        """Acquire, then renew every ``retry_period``; after a lost term, try again.

        Returns when cancelled (the term, if any, ends first) or after ``release()``.
        """
        with anyio.CancelScope() as scope:
            self._run_scope = scope
            try:
                while not self._released:  # one pass per term
                    await self._acquire()
                    if self._released:
                        return
                    term = self._begin_term()
                    await self._lead(term)
            finally:
                self._run_scope = None
                self._end_term("the elector stopped", logging.INFO)

    async def _acquire(self) -> None:
        while not self._released:  # until acquired; each pass is one attempt and one wait
            ok = await self._within(self.renew_deadline, self._attempt)
            if ok and self._fresh():
                return
            await self._sleep(self.retry_period * (1 + (JITTER - 1) * random.random()))

    async def _lead(self, term: LeaderTerm) -> None:
        while term.active:  # one renewal per pass; every exit ends the term
            if self._renewed_at is None:
                self._end_term("no renewal on record")
                return
            wait = min(self.retry_period, self._renewed_at + self.renew_deadline - self._clock())
            if wait > 0:
                await self._sleep(wait)
            if self._released or self._renewed_at is None:
                return
            remaining = self._renewed_at + self.renew_deadline - self._clock()
            if remaining <= 0:
                self._end_term(f"could not renew within {self.renew_deadline}s")
                return
            ok = await self._within(remaining, self._renew)
            if ok and self._fresh():
                continue
            holder = self.holder
            if holder and holder != self.identity:
                self._end_term(f"the lease is held by {holder}")
            elif not self._fresh():
                self._end_term(
                    f"could not renew within {self.renew_deadline}s"
                    + (f" (last error: {self.stats.last_error})" if self.stats.last_error else "")
                )

    def _fresh(self) -> bool:
        return self._renewed_at is not None and (
            self._clock() < self._renewed_at + self.renew_deadline
        )

    async def _within(self, seconds: float, fn: Callable[[], Awaitable[bool]]) -> bool | None:
        """``fn()`` bounded by ``seconds`` of the elector's clock; None when it ran out of time.
        Errors count as a failed attempt (False)."""
        outcome: list[bool] = []
        async with anyio.create_task_group() as tg:

            async def watchdog() -> None:
                await self._sleep(seconds)
                tg.cancel_scope.cancel()

            async def work() -> None:
                try:
                    outcome.append(await fn())
                except Exception as exc:  # API errors, connection errors, timeouts: try again
                    self.stats.failures += 1
                    self.stats.last_error = repr(exc)
                    log.warning(
                        "lease %s/%s: %r%s", self.namespace, self.name, exc, self._hint(exc)
                    )
                    outcome.append(False)
                tg.cancel_scope.cancel()

            tg.start_soon(watchdog)
            tg.start_soon(work)
        if not outcome:
            self.stats.failures += 1
            self.stats.last_error = f"no answer within {seconds:.1f}s"
        return outcome[0] if outcome else None

    def _hint(self, exc: Exception) -> str:
        """What an operator needs to know about a refused Lease request; it never leads then."""
        if not isinstance(exc, ApiError):
            return ""
        if exc.status == 403:
            return (
                f" (not allowed: this identity needs create, and get/update/patch on the Lease "
                f"{self.name!r}, in namespace {self.namespace!r}; it stays a standby until then)"
            )
        if exc.status == 404:
            return f" (does namespace {self.namespace!r} exist? it stays a standby until then)"
        return ""

    # -- one attempt --------------------------------------------------------------------------

    def _get_lock(self) -> anyio.Lock:
        if self._lock is None:
            self._lock = anyio.Lock()
        return self._lock

    def _observe(self, lease: dict[str, Any]) -> LeaseRecord:
        record = LeaseRecord.from_lease(lease)
        if record != self._observed:
            self._observed = record
            self._observed_at = self._clock()
        self._observed_rv = str((lease.get("metadata") or {}).get("resourceVersion") or "")
        return record

    def _write_body(self, record: LeaseRecord) -> dict[str, Any]:
        return {"metadata": {"resourceVersion": self._observed_rv}, "spec": record.to_spec()}

    async def _renew(self) -> bool:
        """The leader's fast path: write on the last record seen; on 409 read and decide."""
        async with self._get_lock():
            if self._released:
                return False
            seen = self._observed
            if seen is not None and seen.holder == self.identity and self._observed_rv:
                self.stats.attempts += 1
                record = replace(
                    seen,
                    renew_time=micro_time(self._wall()),
                    lease_duration_seconds=self._duration_seconds,
                )
                sent = self._clock()
                try:
                    written = await self.client.merge_patch(
                        LEASES, self.namespace, self.name, self._write_body(record)
                    )
                except ApiError as exc:
                    if exc.status != 409:
                        raise
                    self.stats.conflicts += 1
                else:
                    self._observe(written)
                    self._renewed_at = sent
                    return True
            return await self._attempt_locked()

    async def _attempt(self) -> bool:
        async with self._get_lock():
            if self._released:
                return False
            return await self._attempt_locked()

    async def _attempt_locked(self) -> bool:
        """client-go's tryAcquireOrRenew: read, judge, write with the read's resourceVersion."""
        self.stats.attempts += 1
        now = micro_time(self._wall())
        lease = await self.client.get(LEASES, self.namespace, self.name)
        if lease is None:
            record = LeaseRecord(self.identity, self._duration_seconds, now, now, 0)
            body = {
                "apiVersion": LEASES.api_version,
                "kind": LEASES.kind,
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": record.to_spec(),
            }
            sent = self._clock()
            try:
                created = await self.client.create(LEASES, self.namespace, body)
            except ApiError as exc:
                if exc.status != 409:  # 409 AlreadyExists: another replica created it first
                    raise
                self.stats.conflicts += 1
                return False
            self._observe(created)
            self._renewed_at = sent
            return True
        old = self._observe(lease)
        ours = old.holder == self.identity
        if old.holder and not ours:
            duration = old.lease_duration_seconds or self._duration_seconds
            if self._clock() < self._observed_at + duration:
                return False  # held, and we saw it change less than a lease duration ago
        record = LeaseRecord(
            holder=self.identity,
            lease_duration_seconds=self._duration_seconds,
            acquire_time=old.acquire_time if ours else now,
            renew_time=now,
            transitions=old.transitions if ours else old.transitions + 1,
        )
        sent = self._clock()
        try:
            written = await self.client.merge_patch(
                LEASES, self.namespace, self.name, self._write_body(record)
            )
        except ApiError as exc:
            if exc.status != 409:
                raise
            self.stats.conflicts += 1  # somebody wrote in between: the next attempt re-reads
            return False
        self._observe(written)
        self._renewed_at = sent
        return True

    # -- terms --------------------------------------------------------------------------------

    def _notify(self) -> None:
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()

    def _begin_term(self) -> LeaderTerm:
        self.stats.terms += 1
        term = LeaderTerm(self.stats.terms, self._clock(), anyio.Event(), self._observed_rv)
        self._term = term
        log.info(
            "lease %s/%s acquired by %s (term %d)",
            self.namespace,
            self.name,
            self.identity,
            term.number,
        )
        self._callback(self._on_started, term)
        self._notify()
        return term

    def _end_term(self, why: str, level: int = logging.WARNING) -> None:
        """End the term; a warning unless it ends on purpose (``level``: a clean shutdown)."""
        term = self._term
        if term is None or not term.active:
            return
        term.lost.set()
        log.log(
            level,
            "lease %s/%s: %s stopped leading (term %d): %s",
            self.namespace,
            self.name,
            self.identity,
            term.number,
            why,
        )
        self._callback(self._on_stopped, term)
        self._notify()

    def _callback(self, fn: Callable[[LeaderTerm], None] | None, term: LeaderTerm) -> None:
        if fn is None:
            return
        try:
            fn(term)
        except Exception:
            log.exception("leader election callback failed")

    # -- shutdown -----------------------------------------------------------------------------

    async def release(self, timeout: float = 5.0) -> bool:
        """End the term, stop ``run()``, and hand the lease over (empty holder, 1 s duration) so
        a standby takes it at its next try. Call it after the work that needs leadership has
        stopped. True if the lease was handed over; never raises an API error."""
        self._released = True
        self._end_term("released", logging.INFO)
        if self._run_scope is not None:
            self._run_scope.cancel()
        with anyio.CancelScope(shield=True) as scope:
            scope.deadline = anyio.current_time() + timeout
            async with self._get_lock():
                try:
                    return await self._release_locked()
                except Exception as exc:
                    log.warning("lease %s/%s: release failed: %r", self.namespace, self.name, exc)
                    return False
        log.warning("lease %s/%s: release timed out after %ss", self.namespace, self.name, timeout)
        return False

    async def _release_locked(self) -> bool:
        for _ in range(2):  # one retry after a conflict, on a fresh read
            seen = self._observed
            if seen is None or seen.holder != self.identity or not self._observed_rv:
                return False
            now = micro_time(self._wall())
            record = LeaseRecord("", 1, now, now, seen.transitions)
            try:
                written = await self.client.merge_patch(
                    LEASES, self.namespace, self.name, self._write_body(record)
                )
            except ApiError as exc:
                if exc.status == 404:
                    return False
                if exc.status != 409:
                    raise
                self.stats.conflicts += 1
                lease = await self.client.get(LEASES, self.namespace, self.name)
                if lease is None:
                    return False
                self._observe(lease)
                continue
            self._observe(written)
            self._renewed_at = None
            log.info("lease %s/%s released by %s", self.namespace, self.name, self.identity)
            return True
        return False
