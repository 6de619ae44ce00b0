"""Audit findings over time: per owner, when each finding was first seen and whether it has been
reported; the controller's auditor keeps one, the one-shot ``ungater audit`` needs none.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from ungater._decide.findings import OVER_RELEASE, Finding

__all__ = ["FindingTracker"]


@dataclass
class _Open:
    first_seen: float
    finding: Finding
    reported: bool = False


class FindingTracker:
    """Per owner key, the open findings and when each was first seen (wall-clock seconds).

    A finding is *reported* (counted, logged, announced) once it has stayed open for
    ``report_after`` seconds, so that the instants of a normal change (an owner shrinks a moment
    before its controller deletes the pods it no longer wants) are not reported as anomalies.
    """

    def __init__(self, report_after: float = 0.0) -> None:
        self.report_after = report_after
        self._open: dict[object, dict[tuple[str, str | None, str | None], _Open]] = {}
        self._releasable: dict[object, dict[str, float]] = {}

    def releasable_since(
        self, key: object, releasable: Iterable[str], now: float
    ) -> dict[str, float]:
        """Remember when each pod UID in ``releasable`` was first seen releasable; forget the
        others. Returns the map for ``audit_owner``."""
        previous = self._releasable.get(key, {})
        current = {uid: previous.get(uid, now) for uid in releasable}
        if current:
            self._releasable[key] = current
        else:
            self._releasable.pop(key, None)
        return current

    def update(
        self, key: object, findings: Iterable[Finding], now: float
    ) -> tuple[list[Finding], float | None]:
        """Replace the owner's open findings. Returns the findings reported now (open for
        ``report_after`` seconds, not reported before) and, if some are still too young, the
        wall-clock time to look again. An over-release's ``seconds`` is at least the time it
        has been watched."""
        before = self._open.get(key, {})
        after: dict[tuple[str, str | None, str | None], _Open] = {}
        due: list[Finding] = []
        next_check: float | None = None
        for f in findings:
            old = before.get(f.key)
            first = old.first_seen if old is not None else now
            seconds = f.seconds
            if f.finding == OVER_RELEASE:
                seconds = max(seconds or 0.0, now - first)
            entry = _Open(first, replace(f, seconds=seconds, first_seen=first))
            entry.reported = old is not None and old.reported
            if not entry.reported:
                if now - first >= self.report_after:
                    entry.reported = True
                    due.append(entry.finding)
                else:
                    at = first + self.report_after
                    next_check = at if next_check is None else min(next_check, at)
            after[f.key] = entry
        if after:
            self._open[key] = after
        else:
            self._open.pop(key, None)
        return due, next_check

    def forget(self, key: object) -> None:
        self._open.pop(key, None)
        self._releasable.pop(key, None)

    def __len__(self) -> int:
        """Owner keys with a record (open findings, or releasable pods being timed)."""
        return len(self._open.keys() | self._releasable.keys())

    def findings(self, key: object | None = None) -> list[Finding]:
        """The reported open findings (of one owner key, or all)."""
        pools = [self._open.get(key, {})] if key is not None else list(self._open.values())
        return [o.finding for per in pools for o in per.values() if o.reported]

    def counts(self) -> dict[tuple[str, str], int]:
        """(kind, finding) -> reported open findings, for the gauge."""
        out: dict[tuple[str, str], int] = {}
        for f in self.findings():
            out[(f.kind, f.finding)] = out.get((f.kind, f.finding), 0) + 1
        return out
