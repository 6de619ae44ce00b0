"""Client-side rate limits: one token bucket on the caller's clock, and the async limiter the
API client waits on. The Event recorder keeps its buckets on an injected clock; the API client
sleeps on the monotonic one; both count tokens the same way, here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import anyio

__all__ = ["RateLimiter", "TokenBucket"]


@dataclass(slots=True)
class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` saved up, full at ``stamp``."""

    rate: float
    burst: float
    stamp: float
    tokens: float = field(init=False)

    def __post_init__(self) -> None:
        self.tokens = self.burst

    def refill(self, now: float) -> bool:
        """Add what accrued since the last look; True if a whole token is there."""
        self.tokens = min(self.burst, self.tokens + max(0.0, now - self.stamp) * self.rate)
        self.stamp = now
        return self.tokens >= 1.0

    def take(self) -> None:
        self.tokens -= 1.0

    def shortfall(self) -> float:
        """Seconds until a whole token is there (0 if one is)."""
        return max(0.0, (1.0 - self.tokens) / self.rate)


class RateLimiter:
    """``qps`` requests a second, bursts of ``burst``: ``acquire`` waits for a token."""

    def __init__(self, qps: float, burst: int) -> None:
        self.qps = qps
        self.burst = max(1, burst)
        self._bucket = TokenBucket(qps, float(self.burst), time.monotonic())
        self._lock = anyio.Lock()

    async def acquire(self) -> None:
        async with self._lock:  # one waiter at a time: tokens go out in arrival order
            if not self._bucket.refill(time.monotonic()):
                await anyio.sleep(self._bucket.shortfall())
                self._bucket.refill(time.monotonic())
            self._bucket.take()
