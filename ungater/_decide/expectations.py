"""Expectations: the pods we patched whose change the deciding cache has not shown yet.

Without them a reconcile that runs before the watch delivers our own patches would count those
pods as still gated and release more than admitted. They are keyed by owner (stable across
slice rollovers), cleared on every outcome (seen released, seen gone, patch refused), and
expire after a timeout so that a lost watch event can never stall an owner for good.

Each expectation also names the *view* that must show it: the pod index the decision read.
A pod can sit in several indexes (a JobSet's pods are also in the Job kind's pod watch, which
may run ahead); only the deciding view's event may clear it, or a decision could be taken on
a view older than our own write.

A reconcile that finds its owner still waiting asks only "anything pending, any deadline
passed, when is the next": each answer is O(1) (one counter of deadlines per owner: every
pod of one ``expect`` shares its deadline), so the watch events of a 1000-pod wave, each of
which wakes the owner, cost no scan of the 1000.
"""

from __future__ import annotations

import time
from collections import Counter
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
        self._deadlines: dict[Hashable, Counter[float]] = {}  # per key: deadline -> pods
        self.expired_total = 0

    def expect(self, key: Hashable, uids: Iterable[str], view: Hashable = ANY_VIEW) -> None:
        """Record ``uids`` as in flight for ``key``, to be cleared by an event of ``view``."""
        deadline = self.clock() + self.timeout
        for uid in uids:
            if uid in self._key_of:
                self.observe(uid)  # one expectation per pod, under one owner: the newest
            self._by_key.setdefault(key, {})[uid] = deadline
            self._deadlines.setdefault(key, Counter())[deadline] += 1
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
        bucket = self._by_key[key]
        deadline = bucket.pop(uid)
        counts = self._deadlines[key]
        counts[deadline] -= 1
        if not counts[deadline]:
            del counts[deadline]
        if not bucket:
            del self._by_key[key]
            del self._deadlines[key]
        return key

    def pending(self, key: Hashable) -> frozenset[str]:
        return frozenset(self._by_key.get(key, ()))

    def has_pending(self, key: Hashable) -> bool:
        return key in self._by_key

    def expired(self, key: Hashable) -> frozenset[str]:
        counts = self._deadlines.get(key)
        now = self.clock()
        if not counts or min(counts) > now:
            return frozenset()  # none has passed: no scan of the pods
        return frozenset(u for u, d in self._by_key[key].items() if d <= now)

    def next_deadline(self, key: Hashable) -> float | None:
        counts = self._deadlines.get(key)
        return min(counts) - self.clock() if counts else None

    def forget_key(self, key: Hashable) -> None:
        for uid in self._by_key.pop(key, {}):
            self._key_of.pop(uid, None)
            self._view_of.pop(uid, None)
        self._deadlines.pop(key, None)

    def __len__(self) -> int:
        return len(self._key_of)
