"""A deduplicating work queue with per-key exponential backoff (client-go's shape, in asyncio).

A key added while queued is not queued twice; a key added while being processed is queued
again once its worker is done, so one key never has two workers at a time and no change is
lost. ``add_after`` delays a key; ``add_rate_limited`` delays it by its own backoff, which
``forget`` resets after a success.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Hashable
from typing import Generic, TypeVar

from ungater._observe.trace import OFF, Tracer

__all__ = ["QueueShutDown", "WorkQueue"]

K = TypeVar("K", bound=Hashable)


class QueueShutDown(Exception):
    """``get`` on a queue that is shut down and empty."""


class WorkQueue(Generic[K]):
    def __init__(
        self, base_delay: float = 0.05, max_delay: float = 60.0, trace: Tracer = OFF
    ) -> None:
        self.base_delay = base_delay
        self.max_delay = max_delay
        self._queue: deque[K] = deque()
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        self._failures: dict[K, int] = {}
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self._nonempty = asyncio.Event()
        self._shutdown = False
        self.adds = 0
        self.retries = 0
        self.trace = trace

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def depth(self) -> int:
        return len(self._queue)

    def _wake(self) -> None:
        self._nonempty.set()  # single event loop: waking every getter is enough, they re-check

    def busy(self, key: K) -> bool:
        """Queued or being processed (a key waiting out a delay is neither): once a key added
        now is not busy, a worker took it after the add and is done with it."""
        return key in self._dirty or key in self._processing

    def add(self, key: K) -> None:
        if self.trace.on:
            self.trace.point("enqueue", key, dup=key in self._dirty)
        if self._shutdown or key in self._dirty:
            return
        self.adds += 1
        self._dirty.add(key)
        if key in self._processing:
            return  # done() queues it again
        self._queue.append(key)
        self._wake()

    def add_after(self, key: K, delay: float) -> None:
        if self._shutdown:
            return
        if delay <= 0:
            self.add(key)
            return
        if self.trace.on:
            self.trace.point("enqueue", key, delay=delay)
        loop = asyncio.get_running_loop()
        existing = self._timers.get(key)
        if existing is not None:
            if existing.when() <= loop.time() + delay:
                return  # an earlier wake-up is already set
            existing.cancel()

        def fire() -> None:
            self._timers.pop(key, None)
            self.add(key)

        self._timers[key] = loop.call_later(delay, fire)

    def add_rate_limited(self, key: K) -> None:
        n = self._failures.get(key, 0)
        self._failures[key] = n + 1
        self.retries += 1
        # the exponent is capped so that a key failing for days cannot overflow the float
        self.add_after(key, min(self.max_delay, self.base_delay * (2 ** min(n, 62))))

    def forget(self, key: K) -> None:
        self._failures.pop(key, None)

    def remembered(self) -> int:
        """Keys with a backoff count or a timer: what must go once their owners are gone."""
        return len(self._failures) + len(self._timers)

    def failures(self, key: K) -> int:
        return self._failures.get(key, 0)

    async def get(self) -> K:
        """The next key; always a suspension point, so that a worker whose reconciles need no
        I/O (thousands of idle keys after a sync) still lets the Lease renewal, the watches
        and the health probes run between keys."""
        await asyncio.sleep(0)
        while not self._queue:
            if self._shutdown:
                raise QueueShutDown
            self._nonempty.clear()
            await self._nonempty.wait()
        key = self._queue.popleft()
        self._dirty.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: K) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._queue.append(key)
            self._wake()

    def shut_down(self) -> None:
        """Stop accepting keys; waiting getters wake and see QueueShutDown once it is empty."""
        self._shutdown = True
        self._queue.clear()
        self._dirty.clear()
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self._nonempty.set()
