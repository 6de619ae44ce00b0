"""When a gated pod became releasable: the clock behind ``ungater_release_wait_seconds``.

Kueue's gate-removal metric (and ``ungater_release_latency_seconds``) counts from the slice's
admission, so a pod that replaces a finished one days later reports days. What a user waits for
is the time from the event that made the release possible to the release. That is the later
of two moments this process saw:

- the pod itself arriving (a pod cannot be released before it exists), and
- the last event that made room for its owner: a slice newly admitted (or its count changed),
  a released pod of the owner ending or going away, the owner's own size changing.

Both are taken when the watch event reaches this process (monotonic clock), so the figure is
ungater's own reaction time, without the watch's delivery delay; after a start-up or a
hand-over, from when this process first listed the objects. Pure bookkeeping, no I/O; bounded
by the cached pods and owners (entries go when the pod or the owner does).
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["ReleasableClock", "Stalls"]


class ReleasableClock:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._pod_seen: dict[str, float] = {}
        self._room: dict[object, float] = {}

    def pod_seen(self, uid: str) -> None:
        """A pod is in a cache: remember when it first was."""
        self._pod_seen.setdefault(uid, self._clock())

    def pod_gone(self, uid: str) -> None:
        self._pod_seen.pop(uid, None)

    def room_made(self, owner: object) -> None:
        """Something may have made room for ``owner``'s gated pods, now."""
        self._room[owner] = self._clock()

    def owner_gone(self, owner: object) -> None:
        self._room.pop(owner, None)

    def waited(self, owner: object, uid: str) -> float | None:
        """Seconds since the pod became releasable, or None if this process never saw it."""
        seen = self._pod_seen.get(uid)
        if seen is None:
            return None
        return max(0.0, self._clock() - max(seen, self._room.get(owner, seen)))

    def __len__(self) -> int:
        return len(self._pod_seen) + len(self._room)


class Stalls:
    """Owners whose pods could go but stay gated, and since when: the same alarm for a kind
    that releases as ``Stalled`` is for one that audits (a release that keeps failing, a
    refused patch, a pod set update that cannot be applied, an ownership not provable).

    ``observe`` takes each decision's count of such pods; an owner whose count stays above
    zero for ``threshold`` seconds is stalled. Bounded by the owners with a decision.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._since: dict[object, tuple[float, str, int]] = {}  # owner -> (since, kind, count)

    def observe(self, owner: object, kind: str, count: int) -> None:
        if count <= 0:
            self._since.pop(owner, None)
            return
        since = self._since.get(owner)
        self._since[owner] = (since[0] if since else self._clock(), kind, count)

    def forget(self, owner: object) -> None:
        self._since.pop(owner, None)

    def __len__(self) -> int:
        return len(self._since)

    def stalled(self, threshold: float) -> dict[str, int]:
        """Pods of owners stalled for longer than ``threshold`` seconds, by kind."""
        now = self._clock()
        out: dict[str, int] = {}
        for since, kind, count in list(self._since.values()):
            if now - since > threshold:
                out[kind] = out.get(kind, 0) + count
        return out
