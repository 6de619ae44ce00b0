"""Lease leader election against the in-memory API server, on a virtual clock: acquiring,
renewing, standing by, taking over, stopping before the lease can expire, releasing, races."""

from __future__ import annotations

import heapq
import itertools
import random
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from tests.fakekube import FakeKube
from ungater.kube import ApiError, Resource
from ungater.leader import LEASES, LeaderElector, LeaderTerm, LeaseRecord, micro_time

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
            when, _, event = heapq.heappop(self._timers)
            self.now = max(self.now, when)
            event.set()
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
        self.fault: Callable[[str], None] | None = None  # called with get/create/patch

    def _fault(self, op: str) -> None:
        if self.fault is not None:
            self.fault(op)

    async def get(
        self, resource: Resource, namespace: str | None, name: str
    ) -> dict[str, Any] | None:
        self._fault("get")
        return await super().get(resource, namespace, name)

    async def create(
        self, resource: Resource, namespace: str | None, body: dict[str, Any]
    ) -> dict[str, Any]:
        self._fault("create")
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
        self._fault("patch")
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


def fail_patches(op: str) -> None:
    if op == "patch":
        raise ApiError(500, "etcdserver: request timed out")


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
    async with anyio.create_task_group() as crash:
        crash.start_soon(a.run)
        await clock.advance(0)
        assert a.is_leader
        async with running(b):
            await clock.advance(5.0)
            crash.cancel_scope.cancel()  # a dies without releasing
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
            assert spec["acquireTime"] == spec["renewTime"]
            assert fake_time(spec["acquireTime"]) >= last_write + 15.0


@pytest.mark.anyio
async def test_leader_that_cannot_renew_stops_before_its_lease_expires() -> None:
    fake, clock = LeaseKube(), FakeClock()
    stopped: list[float] = []
    a = elector(fake, clock, "a", on_stopped_leading=lambda t: stopped.append(clock.now))
    b = elector(fake, clock, "b")
    async with running(a, b):
        await clock.advance(3.0)
        assert a.is_leader
        term = a.term
        assert term is not None
        last_accepted = clock.now - 1.0  # renewed at +2 s
        fake.fault = fail_patches

        def never_both() -> None:
            assert not (a.is_leader and b.is_leader)

        await clock.advance(9.5, check=never_both)
        assert stopped and stopped[0] <= last_accepted + 10.0
        assert term.lost.is_set() and not a.is_leader
        assert stopped[0] < last_accepted + 15.0  # before the lease can expire for b
        assert a.stats.failures >= 4 and "500" in a.stats.last_error
        assert not b.is_leader
        fake.fault = None
        await clock.advance(30.0, check=never_both)
        assert fake.holder() in ("a", "b")  # a may win it back: it is still the holder


@pytest.mark.anyio
async def test_a_hanging_renewal_is_cut_at_the_renew_deadline() -> None:
    fake, clock = LeaseKube(), FakeClock()
    a = elector(fake, clock, "a")
    async with running(a):
        await clock.advance(2.0)
        assert a.is_leader
        renewed = clock.now

        async def hang(ns: str, name: str) -> None:
            await clock.sleep(3600)

        fake.before_merge_patch = hang
        await clock.advance(9.9)
        assert a.is_leader
        await clock.advance(0.2)
        assert not a.is_leader and renewed + 10.0 <= clock.now
        assert "no answer" in a.stats.last_error


@pytest.mark.anyio
async def test_release_lets_a_standby_acquire_at_once() -> None:
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
@pytest.mark.parametrize("seed", range(6))
async def test_conflicting_writers_never_both_lead(seed: int) -> None:
    rng = random.Random(seed)
    fake, clock = LeaseKube(), FakeClock()
    electors = [elector(fake, clock, f"r{i}") for i in range(3)]
    flaky = {"on": False}

    def fault(op: str) -> None:
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

    async with anyio.create_task_group() as tg:
        scopes: dict[str, anyio.CancelScope] = {}

        async def run(e: LeaderElector) -> None:
            with anyio.CancelScope() as scope:
                scopes[e.identity] = scope
                await e.run()

        for e in electors:
            tg.start_soon(run, e)
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
                    tg.start_soon(run, fresh)
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
