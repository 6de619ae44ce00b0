"""The one token bucket: what the Event recorder and the API client's rate limit count with."""

from __future__ import annotations

import time

import pytest

from ungater._kube.ratelimit import RateLimiter, TokenBucket


def test_a_bucket_starts_full_spends_one_token_a_take_and_refills_at_its_rate() -> None:
    b = TokenBucket(rate=2.0, burst=3.0, stamp=10.0)
    for _ in range(3):
        assert b.refill(10.0)
        b.take()
    assert not b.refill(10.0) and b.shortfall() == pytest.approx(0.5)
    assert not b.refill(10.4)  # 0.8 of a token
    assert b.refill(10.5) and b.shortfall() == 0.0
    assert b.refill(100.0) and b.tokens == 3.0  # never more than the burst


def test_a_clock_that_goes_back_adds_no_token() -> None:
    b = TokenBucket(rate=1.0, burst=1.0, stamp=5.0)
    b.take()
    assert not b.refill(4.0) and b.tokens == 0.0


@pytest.mark.anyio
async def test_the_limiter_lets_a_burst_through_then_waits_for_the_next_token() -> None:
    limiter = RateLimiter(qps=5.0, burst=2)
    start = time.monotonic()
    await limiter.acquire()
    await limiter.acquire()
    burst_done = time.monotonic()
    await limiter.acquire()
    waited = time.monotonic() - burst_done
    assert waited >= 0.19  # a token every 200 ms (a lower bound: a slow machine only adds)
    assert burst_done - start < 0.19  # the burst did not wait for tokens
