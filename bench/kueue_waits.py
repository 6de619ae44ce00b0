"""Per gate: how long releasable pods waited for their gate, from one :class:`Timeline`.

A pod becomes releasable at the later of the trigger (the slice's admission seen, a pod's
Succeeded or deletion seen) and its own creation seen (the real Job controller creates pods
after the trigger at times). A sample is the worst wait among the pods one trigger made
releasable ("the last gate removal"), or, when the trigger frees one slot only, the wait until
the first of the candidates lost the gate. A pod gated longer than ``stall_s`` while releasable
is a stall, and its wait is no sample. A trigger that gives no sample for any other reason (no
pod carried the gate) is a missing sample: counted per gate, never dropped unsaid.

The gates may be any labels, one or more; the ratio Kueue / ungater is given where both ran.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.stats import summarize
from bench.timeline import PodTrack, Timeline

__all__ = ["Waits"]


@dataclass
class Waits:
    gates: dict[str, str]  # label ("kueue", "ungater") -> gate name
    stall_s: float = 30.0
    samples: dict[str, list[float]] = field(default_factory=dict)
    stalls: dict[str, int] = field(default_factory=dict)
    missing: dict[str, int] = field(default_factory=dict)  # triggers without a sample, no stall

    def __post_init__(self) -> None:
        for label in self.gates:
            self.samples.setdefault(label, [])
            self.stalls.setdefault(label, 0)
            self.missing.setdefault(label, 0)

    async def record(
        self,
        tl: Timeline,
        pods: Callable[[], list[PodTrack]],
        since: float,
        *,
        first_only: bool = False,
    ) -> dict[str, float | None]:
        """Wait (at most ``stall_s`` and a little) until every gate is off the releasable pods
        (or off one of them, ``first_only``); record each gate's sample or its stalls."""
        gates = list(self.gates.values())

        def done() -> bool:
            current = pods()
            if not current:
                return False
            if first_only:
                return all(any(g in p.removed_at for p in current) for g in gates)
            return all(g in p.removed_at or g not in p.gates for p in current for g in gates)

        # bounded from when the last of them became releasable (a pod created long after the
        # trigger, as in a burst the Job controller creates at its own pace, gets its full time)
        start = max([since, *(p.added_at for p in pods())])
        bound = start + self.stall_s + 2.0 - time.monotonic()
        await tl.until(done, max(bound, 1.0), "gate removals")
        out: dict[str, float | None] = {}
        for label, gate in self.gates.items():
            out[label] = self._one(label, gate, pods(), since, first_only)
        return out

    def _one(
        self, label: str, gate: str, pods: list[PodTrack], since: float, first_only: bool
    ) -> float | None:
        waits = [  # a release before the trigger (past the cap, counted apart) waited 0
            max(0.0, p.removed_at[gate] - max(since, p.added_at)) if gate in p.removed_at else None
            for p in pods
            if gate in p.gates
        ]
        got = [w for w in waits if w is not None]
        if first_only:
            wait = min(got) if got else None
            stalled = int(bool(waits) and (wait is None or wait > self.stall_s))
        else:
            wait = max(got) if got and len(got) == len(waits) else None
            stalled = sum(1 for w in waits if w is None or w > self.stall_s)
        self.stalls[label] += stalled
        if wait is not None and wait <= self.stall_s:
            self.samples[label].append(wait)
        elif not stalled:  # no sample, and no stall to say why (no pod carried the gate)
            self.missing[label] += 1
        return wait

    def summary(self) -> dict[str, Any]:
        """Median, p95 per gate; the ratio Kueue / ungater of each (where both ran); stalls and
        missing samples per gate."""
        out: dict[str, Any] = {label: summarize(s, "s") for label, s in self.samples.items()}
        out["stalls"] = dict(self.stalls)
        out["missing"] = dict(self.missing)
        k, u = out.get("kueue"), out.get("ungater")
        if k and u and k["n"] and u["n"]:
            out["ratio_median"] = k["median"] / u["median"] if u["median"] else float("nan")
            out["ratio_p95"] = k["p95"] / u["p95"] if u["p95"] else float("nan")
        return out
