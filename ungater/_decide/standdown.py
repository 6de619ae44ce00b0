"""Standing down: a releasing kind whose gate keeps being removed by another writer stops.

Two releasers on one gate break the cap (each fills up what it sees). The controller already
notices each pod whose gate someone else removed (``ForeignRelease``); this module decides
when that is no accident: ``foreignReleases`` of them for one kind within ``windowSeconds``.
Then, by ``standDown.action``: ``audit`` (the default) stops patching that kind and audits it
instead; ``exit`` ends the process with an error; ``keepReleasing`` only says so (unsafe: two
releasers keep fighting over the cap). A kind stood down to audit stands back up once no other
writer has removed its gate for ``resumeAfterSeconds`` (``resume_at``): evidence can be wrong
(a previous leader's late write looks foreign), and a stand-down for good would hold every
later scale-up's pods gated. Pure apart from an injected clock.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ungater._model.config import StandDownConfig

__all__ = ["StandDown", "Tripped"]


@dataclass(frozen=True, slots=True)
class Tripped:
    kind: str
    gate: str
    count: int
    window: float
    action: str
    last_pod: str

    @property
    def message(self) -> str:
        what = {
            "audit": "stopped patching and switched to audit mode",
            "exit": "exiting",
            "keepReleasing": "keeps releasing (standDown.action: keepReleasing, unsafe)",
        }[self.action]
        return (
            f"another writer removed gate {self.gate} from {self.count} pod(s) of {self.kind} "
            f"within {self.window:g}s (last: {self.last_pod}): two releasers on one gate break "
            f"the cap; {self.kind} {what}"
        )


class StandDown:
    def __init__(self, config: StandDownConfig, clock: Callable[[], float] = time.monotonic):
        self.config = config
        self.clock = clock
        self._seen: dict[str, deque[float]] = {}
        self.tripped: dict[str, Tripped] = {}
        self._last: dict[str, float] = {}  # kind -> the last foreign release seen

    def record(self, kind: str, gate: str, pod: str) -> Tripped | None:
        """One foreign release for ``kind``; the verdict when this one trips the threshold
        (once per kind for ``audit`` and ``exit``, every time past it for ``keepReleasing``)."""
        if kind in self.tripped and self.config.action != "keepReleasing":
            return None
        now = self.clock()
        self._last[kind] = now
        seen = self._seen.setdefault(kind, deque())
        seen.append(now)
        while seen and now - seen[0] > self.config.window_seconds:
            seen.popleft()
        while len(seen) > self.config.foreign_releases:  # bounded: only the last N matter
            seen.popleft()
        if len(seen) < self.config.foreign_releases:
            return None
        verdict = Tripped(
            kind, gate, len(seen), self.config.window_seconds, self.config.action, last_pod=pod
        )
        self.tripped[kind] = verdict
        return verdict

    def still_at_work(self, kind: str) -> None:
        """Another writer removed the gate of a kind that stood down: its resumption waits."""
        self._last[kind] = self.clock()

    def resume_at(self, kind: str) -> float | None:
        """When a kind that stood down to audit may release again (None: never)."""
        wait = self.config.resume_after_seconds
        if kind not in self.tripped or wait <= 0:
            return None
        return self._last.get(kind, self.clock()) + wait

    def resume(self, kind: str) -> None:
        """The kind releases again: its count of foreign releases starts afresh."""
        self.tripped.pop(kind, None)
        self._seen.pop(kind, None)
