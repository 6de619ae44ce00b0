"""A clock the test moves by hand, for code that takes its time from a callable."""

from __future__ import annotations


class ManualClock:
    """Returns ``now``, which only the test changes (expectations, backoff, waits)."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now
