"""The small-scope explorer in CI: every scenario explored to its depth holds the cap (and
reports no false foreign release), and each of issue 33's fixes (the issue's four, and two found
writing docs/safety.md), undone, is found by the explorer on its own. ``make explore`` goes deeper (``python -m tests.explore``)."""

from __future__ import annotations

import logging

import pytest

from tests.explore.reverts import REVERTS
from tests.explore.scenarios import ALL
from tests.explore.search import explore

#: scenario -> the depth CI explores it to: at least the length of the shortest path that
#: breaks it with a fix undone, so the fixed code is shown to hold where the old one broke
CI_DEPTHS = {
    "term-unseen-pod": 9,
    "slice-chain": 8,
    "other-gate-shrink": 5,
    "handover": 5,
    "grow": 5,
    "queued-sends": 5,
    "touched-slice": 8,
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def quiet_controller() -> object:
    """Thousands of executions: the controller's warnings (expired expectations, refusals)
    are the explorer's choices, not news."""
    logger = logging.getLogger("ungater")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield None
    logger.setLevel(level)


@pytest.mark.anyio
@pytest.mark.parametrize("name", sorted(CI_DEPTHS))
async def test_every_interleaving_within_the_bound_holds_the_cap(name: str) -> None:
    report = await explore(ALL[name], CI_DEPTHS[name])
    assert not report.violation, f"{report.line()}\n  " + "\n  ".join(report.trace)
    assert report.exhausted and report.deepest == CI_DEPTHS[name], report.line()
    assert report.states > 20, report.line()  # it explored, not stopped at the start


@pytest.mark.anyio
@pytest.mark.parametrize("fix", sorted(REVERTS))
async def test_the_explorer_finds_each_path_with_its_fix_undone(fix: str) -> None:
    undo, scenario = REVERTS[fix]
    with undo():
        report = await explore(ALL[scenario], CI_DEPTHS[scenario])
    report.scenario = f"{scenario}, {fix} fix undone (a violation expected)"
    assert report.violation, f"{fix} undone, yet: {report.line()}"
    assert len(report.trace) <= CI_DEPTHS[scenario]
