"""Lease leader election against the in-memory API server, on a virtual clock: acquiring,
renewing, standing by, taking over, stopping before the lease can expire, releasing, races."""

from __future__ import annotations

import heapq
import itertools
import logging
import random
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from tests.fakekube import FakeKube
from tests.polling import eventually
from ungater._kube.client import ApiError, Resource
from ungater._kube.leader import LEASES, LeaderElector, LeaderTerm, LeaseRecord, micro_time

NS = "ungater-system"
NAME = "ungater"
EPOCH = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
MICRO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def settle(rounds: int = 80) -> None:
    """Let every runnable task run until it blocks (the fake API does no real I/O)."""
    for _ in range(rounds):
        await anyio.lowlevel.checkpoint()


class FakeClock:
    """Virtual monotonic time; ``sleep`` waits for ``advance`` to reach its deadline."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self._timers: list[tuple[float, int, anyio.Event]] = []
        self._seq = itertools.count()

    def __call__(self) -> float:
        return self.now

    def wall(self) -> datetime:
        return EPOCH + timedelta(seconds=self.now)

    async def sleep(self, seconds: float) -> None:
        event = anyio.Event()
        heapq.heappush(self._timers, (self.now + max(seconds, 0.0), next(self._seq), event))
        await event.wait()

    async def advance(self, seconds: float, check: Callable[[], None] | None = None) -> None:
        """Move time forward, firing timers in order and letting tasks run after each."""
        target = self.now + seconds
        await settle()
        for _ in range(10_000):
            if not self._timers or self._timers[0][0] > target:
                break
            when = self._timers[0][0]
            self.now = max(self.now, when)
            while self._timers and self._timers[0][0] == when:  # due together, run together
                heapq.heappop(self._timers)[2].set()
            await settle()
            if check is not None:
                check()
        else:
            raise AssertionError("timers keep firing without time moving")
        self.now = target
        await settle()
        if check is not None:
            check()


class LeaseKube(FakeKube):
    """The fake API server with create answering 409 AlreadyExists like the real one, and a
    fault hook on every call the elector makes."""

    def __init__(self) -> None:
        super().__init__()
        # called with ("get" | "create" | "patch", the body written or None); may raise
        self.fault: Callable[[str, dict[str, Any] | None], None] | None = None

    def _fault(self, op: str, body: dict[str, Any] | None = None) -> None:
        if self.fault is not None:
            self.fault(op, body)

    async def get(
        self, resource: Resource, namespace: str | None, name: str
    ) -> dict[str, Any] | None:
        self._fault("get")
        return await super().get(resource, namespace, name)

    async def create(
        self, resource: Resource, namespace: str | None, body: dict[str, Any]
    ) -> dict[str, Any]:
        self._fault("create", body)
        await anyio.lowlevel.checkpoint()
        if self.read(resource, namespace or "", body["metadata"]["name"]) is not None:
            raise ApiError(409, "AlreadyExists")
        return await super().create(resource, namespace, body)

    async def merge_patch(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        body: dict[str, Any],
        subresource: str = "",
    ) -> dict[str, Any]:
        self._fault("patch", body)
        return await super().merge_patch(resource, namespace, name, body, subresource)

    def lease(self) -> dict[str, Any]:
        lease = self.read(LEASES, NS, NAME)
        assert lease is not None
        return lease

    def holder(self) -> str:
        return LeaseRecord.from_lease(self.lease()).holder


def fake_time(stamp: str) -> float:
    """The virtual clock reading at which a MicroTime was written."""
    written = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    return (written - EPOCH).total_seconds()


def elector(fake: FakeKube, clock: FakeClock, identity: str, **kw: Any) -> LeaderElector:
    return LeaderElector(
        fake,
        NS,
        NAME,
        identity,
        clock=clock,
        sleep=clock.sleep,
        wall_clock=clock.wall,
        **kw,
    )


@asynccontextmanager
async def running(*electors: LeaderElector) -> AsyncIterator[anyio.abc.TaskGroup]:
    async with anyio.create_task_group() as tg:
        for e in electors:
            tg.start_soon(e.run)
        try:
            yield tg
        finally:
            tg.cancel_scope.cancel()


def start(tg: anyio.abc.TaskGroup, e: LeaderElector) -> anyio.CancelScope:
    """Run ``e`` in ``tg``; cancelling the returned scope crashes just this replica."""
    scope = anyio.CancelScope()

    async def run() -> None:
        with scope:
            await e.run()

    tg.start_soon(run)
    return scope


def fail_patches(op: str, body: dict[str, Any] | None) -> None:
    if op == "patch":
        raise ApiError(500, "etcdserver: request timed out")


def fail_writes_of(identity: str) -> Callable[[str, dict[str, Any] | None], None]:
    def fault(op: str, body: dict[str, Any] | None) -> None:
        if body is not None and (body.get("spec") or {}).get("holderIdentity") == identity:
            raise ApiError(500, "etcdserver: request timed out")

    return fault


# -- validation and format ---------------------------------------------------------------------


def test_validates_timings() -> None:
    fake = FakeKube()
    with pytest.raises(ValueError, match="renewDeadline"):
        LeaderElector(fake, NS, NAME, "a", lease_duration=10, renew_deadline=10)
    with pytest.raises(ValueError, match="retryPeriod"):
        LeaderElector(fake, NS, NAME, "a", renew_deadline=10, retry_period=9)
    with pytest.raises(ValueError, match="identity"):
        LeaderElector(fake, NS, NAME, "")
    LeaderElector(fake, NS, NAME, "a")  # the defaults are valid


def test_micro_time_format() -> None:
    stamp = datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
    assert micro_time(stamp) == "2026-01-02T03:04:05.123456Z"


# -- acquiring and renewing --------------------------------------------------------------------


@pytest.mark.anyio
async def test_acquires_an_absent_lease_and_renews_it() -> None:
    fake, clock = LeaseKube(), FakeClock()
    started: list[LeaderTerm] = []
    a = elector(fake, clock, "a", on_started_leading=started.append)
    async with running(a):
        await clock.advance(0)
        assert a.is_leader
        term = await a.wait_leading()
        assert started == [term] and term.number == 1 and term.active
        spec = fake.lease()["spec"]
        assert spec["holderIdentity"] == "a"
        assert spec["leaseDurationSeconds"] == 15
        assert spec["leaseTransitions"] == 0
        assert MICRO.match(spec["acquireTime"]) and spec["renewTime"] == spec["acquireTime"]
        first_renew = spec["renewTime"]
        await clock.advance(2.0)
        spec = fake.lease()["spec"]
        assert spec["renewTime"] > first_renew and spec["acquireTime"] == first_renew
        await clock.advance(60.0)
        assert a.is_leader and a.stats.terms == 1 and fake.holder() == "a"


@pytest.mark.anyio
async def test_standby_does_not_acquire_while_the_holder_renews() -> None:
    fake, clock = LeaseKube(), FakeClock()
    a, b = elector(fake, clock, "a"), elector(fake, clock, "b")
    async with running(a):
        await clock.advance(0)
        async with running(b):

            def invariant() -> None:
                assert a.is_leader and not b.is_leader

            await clock.advance(120.0, check=invariant)
            assert b.holder == "a" and b.stats.attempts > 30
            assert fake.lease()["spec"]["leaseTransitions"] == 0


@pytest.mark.anyio
async def test_standby_takes_over_after_expiry() -> None:
    fake, clock = LeaseKube(), FakeClock()
    a, b = elector(fake, clock, "a"), elector(fake, clock, "b")
    async with running() as tg:
        crash = start(tg, a)
        await clock.advance(0)
        assert a.is_leader
        async with running(b):
            await clock.advance(5.0)
            crash.cancel()  # a dies without releasing
            await settle()
            assert not a.is_leader and fake.holder() == "a"
            last_write = fake_time(fake.lease()["spec"]["renewTime"])

            def not_before_expiry() -> None:
                if b.is_leader:
                    assert clock.now >= last_write + 15.0

            await clock.advance(14.0, check=not_before_expiry)
            assert not b.is_leader
            await clock.advance(4.0, check=not_before_expiry)
            assert b.is_leader and fake.holder() == "b"
            spec = fake.lease()["spec"]
            assert spec["leaseTransitions"] == 1
            assert fake_time(spec["acquireTime"]) >= last_write + 15.0


@pytest.mark.anyio
async def test_leader_that_cannot_renew_stops_before_its_lease_expires(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake, clock = LeaseKube(), FakeClock()
    stopped: list[float] = []
    a = elector(fake, clock, "a", on_stopped_leading=lambda t: stopped.append(clock.now))
    b = elector(fake, clock, "b")
    async with running(a, b):
        await clock.advance(3.0)
        assert a.is_leader
        term = a.term
        assert term is not None
        last_accepted = fake_time(fake.lease()["spec"]["renewTime"])
        fake.fault = fail_writes_of("a")

        def never_both() -> None:
            assert not (a.is_leader and b.is_leader)
            if b.is_leader:
                assert clock.now >= last_accepted + 15.0

        await clock.advance(10.0, check=never_both)
        assert stopped == [pytest.approx(last_accepted + 10.0)]  # at the deadline, not later
        lost = [r for r in caplog.records if "stopped leading" in r.getMessage()]
        assert [r.levelno for r in lost] == [logging.WARNING]  # not on purpose: a warning
        assert term.lost.is_set() and not a.is_leader
        assert a.stats.failures >= 4 and "500" in a.stats.last_error
        assert not b.is_leader
        await clock.advance(30.0, check=never_both)
        assert b.is_leader and fake.holder() == "b"


@pytest.mark.anyio
async def test_a_hanging_renewal_is_cut_at_the_renew_deadline() -> None:
    fake, clock = LeaseKube(), FakeClock()
    a = elector(fake, clock, "a")
    async with running(a):
        await clock.advance(2.0)
        assert a.is_leader
        renewed = fake_time(fake.lease()["spec"]["renewTime"])

        async def hang(ns: str, name: str) -> None:
            await clock.sleep(3600)

        fake.before_merge_patch = hang
        await clock.advance(9.9)
        assert a.is_leader
        await clock.advance(0.2)
        assert not a.is_leader and renewed + 10.0 <= clock.now
        assert "no answer" in a.stats.last_error


@pytest.mark.anyio
async def test_release_lets_a_standby_acquire_at_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="ungater.leader")
    fake, clock = LeaseKube(), FakeClock()
    a, b = elector(fake, clock, "a"), elector(fake, clock, "b")
    async with anyio.create_task_group() as tg:
        tg.start_soon(a.run)
        await clock.advance(0)
        tg.start_soon(b.run)
        await clock.advance(7.0)
        term = a.term
        assert term is not None and not b.is_leader
        assert await a.release() is True
        assert term.lost.is_set() and not a.is_leader
        # a hand-over on purpose (SIGTERM, a rollout) is news, not a warning
        ended = [r for r in caplog.records if "stopped leading" in r.getMessage()]
        assert [r.levelno for r in ended] == [logging.INFO], ended
        spec = fake.lease()["spec"]
        assert spec["holderIdentity"] == "" and spec["leaseDurationSeconds"] == 1
        await clock.advance(2.0 * 1.2)
        assert b.is_leader and fake.holder() == "b"
        assert fake.lease()["spec"]["leaseTransitions"] == 1
        await clock.advance(30.0)
        assert not a.is_leader and b.is_leader  # a's run() has returned: it does not compete
        assert await a.release() is False  # nothing of ours left to release
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_cancelling_run_ends_the_term_without_writing() -> None:
    fake, clock = LeaseKube(), FakeClock()
    a = elector(fake, clock, "a")
    async with anyio.create_task_group() as tg:
        tg.start_soon(a.run)
        await clock.advance(0)
        term = await a.wait_leading()
        rv = fake.lease()["metadata"]["resourceVersion"]
        tg.cancel_scope.cancel()
    assert term.lost.is_set() and not a.is_leader
    assert fake.lease()["metadata"]["resourceVersion"] == rv


@pytest.mark.anyio
async def test_a_foreign_write_is_reread_and_a_stolen_lease_stops_the_leader() -> None:
    fake, clock = LeaseKube(), FakeClock()
    a = elector(fake, clock, "a")
    async with running(a):
        await clock.advance(0)
        lease = fake.lease()
        lease["metadata"]["labels"] = {"touched": "yes"}
        fake.put(LEASES, lease)  # someone else writes: our next write conflicts, re-reads
        await clock.advance(2.0)
        assert a.is_leader and a.stats.conflicts == 1 and fake.holder() == "a"
        lease = fake.lease()
        lease["spec"]["holderIdentity"] = "intruder"
        fake.put(LEASES, lease)
        await clock.advance(2.0)
        assert not a.is_leader and a.holder == "intruder"


@pytest.mark.anyio
async def test_run_while_leading_starts_and_cancels_the_work_per_term() -> None:
    fake, clock = LeaseKube(), FakeClock()
    a = elector(fake, clock, "a")
    log: list[str] = []

    async def work(term: LeaderTerm) -> None:
        log.append(f"start {term.number}")
        try:
            await anyio.sleep_forever()
        finally:
            log.append(f"stop {term.number}")

    async with running(a) as tg:
        tg.start_soon(a.run_while_leading, work)
        await clock.advance(0)
        assert log == ["start 1"]
        fake.fault = fail_patches
        await clock.advance(11.0)
        assert log == ["start 1", "stop 1"]
        fake.fault = None
        await clock.advance(3.0)
        assert a.is_leader and log == ["start 1", "stop 1", "start 2"]


# -- races -------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_electors_racing_for_an_absent_lease_elect_one() -> None:
    fake, clock = LeaseKube(), FakeClock()
    electors = [elector(fake, clock, f"r{i}") for i in range(4)]
    async with running(*electors):
        await clock.advance(0)
        leaders = [e.identity for e in electors if e.is_leader]
        assert leaders == [fake.holder()]
        assert sum(e.stats.conflicts for e in electors) >= 1


@pytest.mark.anyio
async def test_standbys_racing_for_an_expired_lease_elect_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("ungater._kube.leader.random.random", lambda: 0.0)  # retry in lockstep
    fake, clock = LeaseKube(), FakeClock()
    a = elector(fake, clock, "a")
    standbys = [elector(fake, clock, f"s{i}") for i in range(3)]
    async with running() as tg:
        crash = start(tg, a)
        await clock.advance(0)
        async with running(*standbys):
            await clock.advance(0.5)
            crash.cancel()

            def at_most_one() -> None:
                assert sum(s.is_leader for s in standbys) <= 1

            await clock.advance(30.0, check=at_most_one)
            leaders = [s.identity for s in standbys if s.is_leader]
            assert leaders == [fake.holder()]
            assert sum(s.stats.conflicts for s in standbys) >= 2  # they did race
            assert fake.lease()["spec"]["leaseTransitions"] == 1


@pytest.mark.anyio
@pytest.mark.parametrize("seed", range(6))
async def test_conflicting_writers_never_both_lead(seed: int) -> None:
    rng = random.Random(seed)
    fake, clock = LeaseKube(), FakeClock()
    electors = [elector(fake, clock, f"r{i}") for i in range(3)]
    flaky = {"on": False}

    def fault(op: str, body: dict[str, Any] | None) -> None:
        if flaky["on"] and rng.random() < 0.5:
            raise ApiError(503, "injected")

    async def interleave(ns: str, name: str) -> None:
        for _ in range(rng.randrange(4)):  # reorder concurrent writers
            await anyio.lowlevel.checkpoint()

    fake.fault = fault
    fake.before_merge_patch = interleave
    released: set[str] = set()

    def at_most_one() -> None:
        leaders = [e for e in electors if e.is_leader]
        assert len(leaders) <= 1, [e.identity for e in leaders]
        for e in leaders:
            assert fake.holder() == e.identity

    async with running() as tg:
        scopes = {e.identity: start(tg, e) for e in electors}
        for _ in range(40):
            flaky["on"] = rng.random() < 0.4
            action = rng.random()
            if action < 0.15:
                leader = next((e for e in electors if e.is_leader), None)
                if leader is not None:  # crash the leader and bring up a fresh replica
                    scopes[leader.identity].cancel()
                    await settle()
                    fresh = elector(fake, clock, f"{leader.identity}+")
                    electors[electors.index(leader)] = fresh
                    scopes[fresh.identity] = start(tg, fresh)
            elif action < 0.25:
                leader = next((e for e in electors if e.is_leader), None)
                if leader is not None:
                    await leader.release()
                    released.add(leader.identity)
            await clock.advance(rng.uniform(0.1, 6.0), check=at_most_one)
        flaky["on"] = False
        await clock.advance(40.0, check=at_most_one)
        running_ones = [e for e in electors if e.identity not in released]
        if running_ones:
            assert sum(e.is_leader for e in running_ones) == 1
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_on_the_real_clock() -> None:
    """The production path (``time.monotonic``, ``anyio.sleep``) with tiny timings."""
    fake = LeaseKube()
    a = LeaderElector(
        fake, NS, NAME, "a", lease_duration=1.0, renew_deadline=0.3, retry_period=0.05
    )
    async with running(a):
        with anyio.fail_after(5):
            term = await a.wait_leading()
        await eventually(lambda: a.stats.attempts >= 3, timeout=5, interval=0.01)
        assert a.is_leader
        fake.fault = fail_patches
        failing_since = time.monotonic()
        with anyio.fail_after(5):
            await term.lost.wait()
        assert time.monotonic() - failing_since < 1.0  # well within the lease duration
