"""Delayed adds keep one timer per key: the earliest wins, and a key fires once."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from ungater._controller.queue import WorkQueue


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_a_later_delay_keeps_the_earlier_timer_and_fires_once() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add_after("k", 0.05)
    q.add_after("k", 0.3)
    assert len(q._timers) == 1
    with anyio.fail_after(2):
        assert await q.get() == "k"
    q.done("k")
    await anyio.sleep(0.4)
    assert len(q) == 0 and q.adds == 1


@pytest.mark.anyio
async def test_an_earlier_delay_replaces_a_later_timer() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add_after("k", 0.3)
    q.add_after("k", 0.05)
    with anyio.fail_after(0.2):
        assert await q.get() == "k"
    q.done("k")
    await anyio.sleep(0.4)
    assert len(q) == 0 and q.adds == 1


@pytest.mark.anyio
async def test_the_default_backoff_starts_at_50_ms_and_is_capped_at_a_minute() -> None:
    q: WorkQueue[str] = WorkQueue()
    loop = asyncio.get_running_loop()
    q.add_rate_limited("first")
    assert 0.04 < q._timers["first"].when() - loop.time() <= 0.05
    q._failures["k"] = 40  # a key failing for long
    q.add_rate_limited("k")
    delay = q._timers["k"].when() - loop.time()
    assert 59.5 < delay <= 60.0
    q.shut_down()
