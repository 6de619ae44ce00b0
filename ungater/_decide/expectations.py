"""Expectations: the pods we patched whose change the deciding cache has not shown yet.

Without them a reconcile that runs before the watch delivers our own patches would count those
pods as still gated and release more than admitted. They are keyed by owner (stable across
slice rollovers), cleared on every outcome (seen released, seen gone, patch refused), and
expire after a timeout so that a lost watch event can never stall an owner for good.

Each expectation also names the *view* that must show it: the pod index the decision read.
A pod can sit in several indexes (a JobSet's pods are also in the Job kind's pod watch, which
may run ahead); only the deciding view's event may clear it, or a decision could be taken on
a view older than our own write.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable

__all__ = ["Expectations"]

ANY_VIEW: Hashable = None


class Expectations:
    def __init__(self, timeout: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout = timeout
        self.clock = clock
        self._by_key: dict[Hashable, dict[str, float]] = {}
        self._key_of: dict[str, Hashable] = {}
        self._view_of: dict[str, Hashable] = {}
        self.expired_total = 0

    def expect(self, key: Hashable, uids: Iterable[str], view: Hashable = ANY_VIEW) -> None:
        """Record ``uids`` as in flight for ``key``, to be cleared by an event of ``view``."""
        deadline = self.clock() + self.timeout
        bucket = self._by_key.setdefault(key, {})
        for uid in uids:
            previous = self._key_of.get(uid)
            if previous is not None and previous != key:
                self.observe(uid)  # a pod is expected under one owner at a time
                bucket = self._by_key.setdefault(key, {})
            bucket[uid] = deadline
            self._key_of[uid] = key
            self._view_of[uid] = view

    def observe(self, uid: str, view: Hashable = ANY_VIEW) -> Hashable | None:
        """The pod was seen released or gone: drop it; return its key if one was waiting.

        With ``view`` given (a watch event), only an expectation recorded for that view, or for
        any view, is cleared; an outcome of our own request passes no view and always clears.
        """
        expected_view = self._view_of.get(uid, ANY_VIEW)
        if view is not ANY_VIEW and expected_view is not ANY_VIEW and expected_view != view:
            return None
        key = self._key_of.pop(uid, None)
        self._view_of.pop(uid, None)
        if key is None:
            return None
        bucket = self._by_key.get(key)
        if bucket is not None:
            bucket.pop(uid, None)
            if not bucket:
                del self._by_key[key]
        return key

    def pending(self, key: Hashable) -> frozenset[str]:
        return frozenset(self._by_key.get(key, ()))

    def expired(self, key: Hashable) -> frozenset[str]:
        now = self.clock()
        return frozenset(u for u, d in self._by_key.get(key, {}).items() if d <= now)

    def next_deadline(self, key: Hashable) -> float | None:
        bucket = self._by_key.get(key)
        return min(bucket.values()) - self.clock() if bucket else None

    def forget_key(self, key: Hashable) -> None:
        for uid in self._by_key.pop(key, {}):
            self._key_of.pop(uid, None)
            self._view_of.pop(uid, None)

    def __len__(self) -> int:
        return len(self._key_of)
