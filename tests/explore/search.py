"""Breadth-first search over the choice points of ``World``, stateless (every path is replayed
from the start, as CHESS and Coyote do) with state hashing: a state reached before, by any
path as short, is not expanded again. Breadth-first, so the first violation found is a
shortest interleaving that breaks the cap.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from tests.explore.scenarios import Scenario
from tests.explore.world import Action, Bounds, Violation, World


@dataclass
class Report:
    scenario: str
    depth: int
    states: int = 0  # distinct states reached
    executions: int = 0  # paths replayed from the start
    transitions: int = 0  # actions taken, replays included
    deepest: int = 0
    exhausted: bool = True  # every state within the depth was expanded (no budget cut)
    seconds: float = 0.0
    violation: str = ""
    trace: list[str] = field(default_factory=list)

    def line(self) -> str:
        what = f"VIOLATION: {self.violation}" if self.violation else "cap held"
        scope = "all" if self.exhausted else "budget cut:"
        return (
            f"{self.scenario}: {what}; {scope} {self.states} states, {self.executions} "
            f"executions, {self.transitions} steps, depth {self.deepest}/{self.depth}, "
            f"{self.seconds:.1f} s"
        )


#: Every report of this process's explorations, for the test run's summary (conftest.py).
REPORTS: list[Report] = []


async def _replay(scenario: Scenario, bounds: Bounds, path: list[Action]) -> World:
    world = await World.start(scenario, bounds)
    if scenario.proven_at_start:
        for rep in world.replicas:
            rep.ctl.state.proven = None
    for action in path:
        await world.step(action)
    return world


async def explore(
    scenario: Scenario, depth: int, bounds: Bounds | None = None, max_states: int = 20_000
) -> Report:
    """Every interleaving of ``scenario`` up to ``depth`` actions (or ``max_states`` states)."""
    bounds = bounds or Bounds()
    report = Report(scenario.name, depth)
    started = time.monotonic()
    seen: set[object] = set()
    frontier: deque[list[Action]] = deque([[]])
    while frontier:
        path = frontier.popleft()
        report.executions += 1
        report.transitions += len(path)
        world: World | None = None
        try:
            world = await _replay(scenario, bounds, path)
            state = world.fingerprint()
            if state in seen:
                continue
            seen.add(state)
            report.states += 1
            report.deepest = max(report.deepest, len(path))
            if len(path) < depth:
                frontier.extend([*path, a] for a in world.enabled())
        except Violation as exc:
            report.violation = str(exc)
            report.trace = [str(a) for a in path]
            break
        finally:
            if world is not None:
                await world.close()
        if report.states >= max_states:
            report.exhausted = False
            break
    report.seconds = time.monotonic() - started
    REPORTS.append(report)
    return report
