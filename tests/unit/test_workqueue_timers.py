"""Delayed adds keep one timer per key: the earliest wins, and a key fires once."""

from __future__ import annotations

import anyio
import pytest

from ungater.workqueue import WorkQueue


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
