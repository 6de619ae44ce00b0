"""Print what the explorer explored at the end of the run (states, executions, depth)."""

from __future__ import annotations

from typing import Any


def pytest_terminal_summary(terminalreporter: Any) -> None:
    from tests.explore.search import REPORTS

    if REPORTS:
        terminalreporter.section("small-scope explorer")
        for report in REPORTS:
            terminalreporter.write_line(report.line())
