"""The repository's test sessions (``tests/`` and ``examples/*/tests``, as ``make test`` runs
them): under CI a skipped test fails.

Under CI (``$CI`` true, 1 or yes, any case: ``ungater_devtools.ci``) a skip becomes a failure
that carries the skip's reason, whether the test body, a fixture or a ``skipif`` mark skipped:
``make test`` builds everything its tests need, so a skip there is a missing tool or a broken
build that would otherwise pass unseen. A test that does not apply somewhere is not generated
there (parametrize over what applies), never skipped. An expected failure (``xfail``) is left
alone. ``tests/unit/suite/test_skips_under_ci.py`` runs it in inner sessions.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ungater_devtools.ci import in_ci


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Under CI a skip is a failure, reported with the skip's reason (setup or call alike)."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if report.skipped and not hasattr(report, "wasxfail") and in_ci():
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped under CI (a skip fails under CI=true): {reason}"
