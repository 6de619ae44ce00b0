"""Print what the explorer explored at the end of the run (states, executions, depth), per
scenario and kind, with or without pytest-xdist: each test records its runs' lines as a user
property, which xdist carries from its workers to the run's summary."""

from __future__ import annotations

from typing import Any

import pytest

_LINES: list[str] = []
PROPERTY = "explored"


@pytest.fixture(autouse=True)
def explored(record_property: Any) -> Any:
    from tests.explore.search import REPORTS

    before = len(REPORTS)
    yield None
    for report in REPORTS[before:]:
        record_property(PROPERTY, report.line())


def pytest_runtest_logreport(report: Any) -> None:
    if report.when == "teardown":  # recorded as the fixture ends, after the call
        _LINES.extend(value for name, value in report.user_properties if name == PROPERTY)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _LINES:
        terminalreporter.section("small-scope explorer")
        for line in _LINES:
            terminalreporter.write_line(line)
