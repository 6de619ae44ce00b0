"""Breadth-first search over the choice points of ``World``, stateless (every path is replayed
from the start, as CHESS and Coyote do) with state hashing: a state reached before, by any
path as short, is not expanded again. Breadth-first, so the first violation found is a
shortest interleaving that breaks an oracle. From every new state the liveness oracle runs on
the same execution once its successors are known (``World.quiesce``, then
``oracles.check_liveness``).
"""

from __future__ import annotations

import contextlib
import time
import types
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any
from unittest import mock

import tests.fakekube as fakekube
from tests.explore import oracles
from tests.explore.kinds import KINDS, Kind
from tests.explore.scenarios import Scenario
from tests.explore.world import Action, Bounds, Violation, World


@dataclass
class Report:
    scenario: str
    kind: str
    depth: int
    states: int = 0  # distinct states reached
    executions: int = 0  # paths replayed from the start
    transitions: int = 0  # actions taken, replays included
    deepest: int = 0
    exhausted: bool = True  # every state within the depth was expanded (no budget cut)
    seconds: float = 0.0
    violation: str = ""
    trace: list[str] = field(default_factory=list)
    liveness: bool = False  # the violation is a stuck gate
    after: bool = False  # found while the liveness check ran the execution on
    violations: int = 0  # states that broke an oracle (more than one: ``keep_going``)

    def line(self) -> str:
        what = f"VIOLATION: {self.violation}" if self.violation else "held"
        scope = "all" if self.exhausted else "budget cut:"
        path = f", path of {len(self.trace)}" if self.violation else ""
        if self.violations > 1:
            path += f", {self.violations} violating states"
        return (
            f"{self.scenario} [{self.kind}]: {what}; {scope} {self.states} states, "
            f"{self.executions} executions, {self.transitions} steps, depth "
            f"{self.deepest}/{self.depth}{path}, {self.seconds:.1f} s"
        )


def _copy_json(value: Any, memo: Any = None) -> Any:
    """A deep copy of JSON-shaped data (dicts, lists, scalars), several times faster than
    ``copy.deepcopy``: the fake copies every object it writes and serves, and the search
    replays every path from the start."""
    if isinstance(value, dict):
        return {k: _copy_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy_json(v) for v in value]
    return value


@contextlib.contextmanager
def fast_copies() -> Iterator[None]:
    """The fake's copies made by ``_copy_json`` for the length of an exploration (its
    objects are all JSON-shaped; nothing else about the fake changes)."""
    with mock.patch.object(fakekube, "copy", types.SimpleNamespace(deepcopy=_copy_json)):
        yield


#: Every report of this process's explorations, for the test run's summary (conftest.py).
REPORTS: list[Report] = []


async def _replay(
    scenario: Scenario, kind: Kind, bounds: Bounds, rules: oracles.Rules, path: list[Action]
) -> World:
    world = await World.start(scenario, kind, bounds)
    world.rules = rules
    for action in path:
        await world.step(action)
    return world


async def explore(
    scenario: Scenario,
    kind: Kind | str = "Job",
    depth: int = 6,
    bounds: Bounds | None = None,
    max_states: int = 50_000,
    rules: oracles.Rules | None = None,
    keep_going: bool = False,
) -> Report:
    """Every interleaving of ``scenario`` for ``kind`` up to ``depth`` actions (or
    ``max_states`` states)."""
    kind = KINDS[kind] if isinstance(kind, str) else kind
    bounds = bounds or Bounds()
    if scenario.faults is not None:
        bounds = replace(bounds, faults=max(bounds.faults, scenario.faults))
    rules = rules or oracles.Rules()
    report = Report(scenario.name, kind.name, depth)
    started = time.monotonic()
    seen: set[object] = set()
    frontier: deque[list[Action]] = deque([[]])
    with fast_copies():
        await _search(
            scenario, kind, depth, bounds, max_states, rules, report, seen, frontier, keep_going
        )
    report.seconds = time.monotonic() - started
    REPORTS.append(report)
    return report


async def _search(
    scenario: Scenario,
    kind: Kind,
    depth: int,
    bounds: Bounds,
    max_states: int,
    rules: oracles.Rules,
    report: Report,
    seen: set[object],
    frontier: deque[list[Action]],
    keep_going: bool,
) -> None:
    while frontier:
        path = frontier.popleft()
        report.executions += 1
        report.transitions += len(path)
        world: World | None = None
        quiescing = False
        try:
            world = await _replay(scenario, kind, bounds, rules, path)
            if bounds.hashing:
                state = world.fingerprint()
                if state in seen:
                    continue
                seen.add(state)
            report.states += 1
            report.deepest = max(report.deepest, len(path))
            successors = world.enabled() if len(path) < depth else []
            if bounds.liveness:
                quiescing = True
                await world.quiesce()
                oracles.check_liveness(world)
            frontier.extend([*path, a] for a in successors)
        except Violation as exc:
            report.violations += 1
            if report.violation:
                continue  # (keep_going) a shortest one is kept; this state is not expanded
            report.violation = str(exc)
            report.trace = [str(a) for a in path]
            report.liveness = report.violation.startswith("stuck")
            report.after = quiescing
            if report.after:
                report.trace.append(
                    "then: the rest of the story, the paused reconciles answered, every stream "
                    "delivered, rounds of reconciles with time passing"
                )
            if not keep_going:
                break
        finally:
            if world is not None:
                await world.close()
        if report.states >= max_states:
            report.exhausted = False
            break
