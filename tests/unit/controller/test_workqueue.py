"""The deduplicating work queue: dedup, one worker per key, delays, backoff and shutdown."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections import Counter

import anyio
import anyio.lowlevel
import pytest

from ungater._controller.queue import QueueShutDown, WorkQueue


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def _get(q: WorkQueue[str], timeout: float = 2.0) -> str:
    with anyio.fail_after(timeout):
        return await q.get()


@pytest.mark.anyio
async def test_dedup_while_queued() -> None:
    q: WorkQueue[str] = WorkQueue()
    for k in ["a", "b", "a", "a", "c", "b"]:
        q.add(k)
    assert len(q) == q.depth == 3
    assert q.adds == 3
    assert [await _get(q) for _ in range(3)] == ["a", "b", "c"]  # FIFO
    assert len(q) == 0


@pytest.mark.anyio
async def test_key_added_while_processing_is_processed_again_after_done() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    assert await _get(q) == "a"
    q.add("a")  # a change while the worker runs
    q.add("a")
    assert len(q) == 0, "must not be handed to a second worker"
    q.add("b")
    assert await _get(q) == "b"
    q.done("b")
    q.done("a")
    assert len(q) == 1
    assert await _get(q) == "a"
    q.done("a")
    assert len(q) == 0  # processed once more, not once per add


@pytest.mark.anyio
async def test_a_key_is_busy_from_its_add_until_its_last_done() -> None:
    q: WorkQueue[str] = WorkQueue()
    assert not q.busy("a")
    q.add("a")
    assert q.busy("a") and not q.busy("b")
    assert await _get(q) == "a"
    assert q.busy("a"), "being processed"
    q.add("a")  # changed while processed: queued again at done
    q.done("a")
    assert q.busy("a"), "queued again"
    assert await _get(q) == "a"
    q.done("a")
    assert not q.busy("a")
    q.add_after("a", 60)
    assert not q.busy("a"), "a delayed key is not busy until its delay passes"
    q.shut_down()


@pytest.mark.anyio
async def test_done_without_changes_does_not_requeue() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    await _get(q)
    q.done("a")
    assert len(q) == 0
    q.done("never-got")  # harmless
    assert len(q) == 0


@pytest.mark.anyio
async def test_getter_waits_until_a_key_arrives() -> None:
    q: WorkQueue[str] = WorkQueue()
    got: list[str] = []

    async def getter() -> None:
        got.append(await _get(q))

    async with anyio.create_task_group() as tg:
        tg.start_soon(getter)
        for _ in range(5):
            await anyio.lowlevel.checkpoint()
        assert got == []
        q.add("k")
    assert got == ["k"]


@pytest.mark.anyio
async def test_several_workers_never_share_a_key_and_lose_no_change() -> None:
    q: WorkQueue[int] = WorkQueue()
    rnd = random.Random(7)
    keys = list(range(5))
    seq = itertools.count()
    last_add: dict[int, int] = {}
    last_start: dict[int, int] = {}
    active: set[int] = set()
    max_active = 0
    processed: Counter[int] = Counter()
    violations: list[int] = []

    async def worker() -> None:
        nonlocal max_active
        while True:
            try:
                k = await q.get()
            except QueueShutDown:
                return
            if k in active:
                violations.append(k)
            active.add(k)
            max_active = max(max_active, len(active))
            last_start[k] = next(seq)
            processed[k] += 1
            for _ in range(rnd.randint(0, 3)):
                await anyio.lowlevel.checkpoint()
            active.discard(k)
            q.done(k)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(worker)
            for step in range(400):
                k = rnd.choice(keys)
                q.add(k)
                last_add[k] = next(seq)
                if step % 3 == 0:
                    await anyio.lowlevel.checkpoint()
            for _ in range(10_000):  # bounded: wait until quiet
                if not len(q) and not active:
                    break
                await anyio.lowlevel.checkpoint()
            assert not len(q) and not active
            q.shut_down()
    assert violations == []
    assert max_active >= 2, "the workers did not run concurrently"
    for k, added in last_add.items():
        assert last_start[k] > added, f"change to key {k} lost"
    assert sum(processed.values()) < 400  # dedup did work


@pytest.mark.anyio
async def test_add_after_delays_the_key() -> None:
    q: WorkQueue[str] = WorkQueue()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    q.add_after("a", 0.03)
    assert len(q) == 0
    assert await _get(q) == "a"
    assert loop.time() - t0 >= 0.025


@pytest.mark.anyio
async def test_add_after_zero_or_negative_is_immediate() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add_after("a", 0)
    q.add_after("b", -1)
    assert len(q) == 2


@pytest.mark.anyio
async def test_add_after_keeps_the_earlier_wakeup() -> None:
    q: WorkQueue[str] = WorkQueue()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    q.add_after("a", 0.01)
    q.add_after("a", 30)  # later: ignored
    assert await _get(q, timeout=2) == "a"
    q.done("a")
    q.add_after("b", 30)
    q.add_after("b", 0.01)  # earlier: replaces
    assert await _get(q, timeout=2) == "b"
    assert loop.time() - t0 < 10
    q.done("b")
    await anyio.sleep(0.03)
    assert len(q) == 0, "a replaced timer fired as well"


@pytest.mark.anyio
async def test_timer_firing_while_queued_is_deduplicated() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    q.add_after("a", 0.01)
    await anyio.sleep(0.03)
    assert len(q) == 1


def test_add_rate_limited_backs_off_exponentially() -> None:
    q: WorkQueue[str] = WorkQueue(base_delay=0.01, max_delay=0.05)
    delays: list[float] = []
    q.add_after = lambda key, delay: delays.append(delay)  # type: ignore[method-assign]
    for _ in range(5):
        q.add_rate_limited("a")
    assert delays == pytest.approx([0.01, 0.02, 0.04, 0.05, 0.05])
    assert q.failures("a") == 5 and q.retries == 5
    q.add_rate_limited("b")  # per key
    assert delays[-1] == pytest.approx(0.01)
    q.forget("a")
    assert q.failures("a") == 0
    q.add_rate_limited("a")
    assert delays[-1] == pytest.approx(0.01)
    q.forget("unknown")  # harmless


@pytest.mark.anyio
async def test_add_rate_limited_really_waits() -> None:
    q: WorkQueue[str] = WorkQueue(base_delay=0.01, max_delay=1)
    loop = asyncio.get_running_loop()
    for expected in (0.01, 0.02, 0.04):
        t0 = loop.time()
        q.add_rate_limited("a")
        assert len(q) == 0
        assert await _get(q) == "a"
        assert loop.time() - t0 >= expected * 0.9
        q.done("a")


def test_add_rate_limited_survives_many_failures() -> None:
    q: WorkQueue[str] = WorkQueue(base_delay=0.05, max_delay=60)
    delays: list[float] = []
    q.add_after = lambda key, delay: delays.append(delay)  # type: ignore[method-assign]
    for _ in range(1100):
        q.add_rate_limited("stuck")
    assert delays[-1] == 60


@pytest.mark.anyio
async def test_shut_down_wakes_every_getter() -> None:
    q: WorkQueue[str] = WorkQueue()
    outcomes: list[str] = []

    async def getter() -> None:
        try:
            await q.get()
            outcomes.append("got")
        except QueueShutDown:
            outcomes.append("shutdown")

    with anyio.fail_after(2):
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(getter)
            await anyio.sleep(0.01)
            q.shut_down()
    assert outcomes == ["shutdown"] * 3


@pytest.mark.anyio
async def test_after_shut_down() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("queued")
    q.add("busy")
    await _get(q)  # "queued" is now being processed
    q.add("queued")
    q.add_after("timer", 0.01)
    q.shut_down()
    # shut_down drops what was queued: a getter sees QueueShutDown at once
    with pytest.raises(QueueShutDown):
        await _get(q)
    q.add("late")
    q.add_after("late", 0.01)
    q.add_after("late2", 0)
    q.done("queued")  # the key re-added while processing is not queued again
    await anyio.sleep(0.03)  # the pending timer was cancelled
    assert len(q) == 0
    with pytest.raises(QueueShutDown):
        await _get(q)


@pytest.mark.anyio
async def test_a_worker_with_nothing_to_await_still_lets_other_tasks_run_between_keys() -> None:
    """After a sync of 10k owners, reconciles that need no I/O kept one worker running for
    10 s without a suspension point: the Lease renewal missed its deadline (seen at 100k pods).
    ``get`` yields on every call, so another task runs before the second key is handed out."""
    q: WorkQueue[int] = WorkQueue()
    for k in range(1000):
        q.add(k)
    handed_out = 0
    seen_at: list[int] = []

    async def worker() -> None:
        nonlocal handed_out
        while len(q):
            key = await q.get()
            handed_out += 1
            q.done(key)  # a reconcile that awaits nothing

    async def renewal() -> None:
        seen_at.append(handed_out)

    async with anyio.create_task_group() as tg:
        tg.start_soon(worker)
        tg.start_soon(renewal)
    assert handed_out == 1000
    assert seen_at and seen_at[0] <= 1
