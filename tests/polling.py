"""Polling with deadlines: tests wait for a condition, never for a fixed time."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

T = TypeVar("T")


async def eventually(
    probe: Callable[[], T | Awaitable[T]],
    timeout: float = 10.0,
    interval: float = 0.02,
    what: str = "",
) -> T:
    """Return the first truthy result of ``probe``; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        result = probe()
        if isinstance(result, Awaitable):
            result = await result
        if result:
            return result
        last = result
        await anyio.sleep(interval)
    raise AssertionError(
        f"timed out after {timeout}s waiting for {what or probe!r}; last: {last!r}"
    )


async def holds_for(
    probe: Callable[[], T | Awaitable[T]], seconds: float, interval: float = 0.02, what: str = ""
) -> None:
    """Assert ``probe`` stays truthy for ``seconds`` (an invariant checked at every step)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        result = probe()
        if isinstance(result, Awaitable):
            result = await result
        assert result, f"invariant broken: {what or probe!r}: {result!r}"
        await anyio.sleep(interval)


async def equals(value: Awaitable[object], want: object) -> bool:
    """``await value == want``, for probes built from an awaitable query."""
    return (await value) == want
