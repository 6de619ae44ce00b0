"""Suite-wide: a reconcile that failed on a programming error fails the test that caused it.

The worker retries a failed reconcile with backoff, so a bug that raises (a ``TypeError`` on a
``None``, a ``KeyError``) can end in the right pods released after a retry, and a test that
checks only the end state passes. API errors and injected faults are expected; these are not.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

#: Exceptions that mean the controller's own code is wrong, never the cluster.
BUGS = (
    AssertionError,
    AttributeError,
    IndexError,
    KeyError,
    NameError,
    TypeError,
    UnboundLocalError,
    ZeroDivisionError,
)


class _ReconcileBugs(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "reconcile failed" not in str(record.msg) or not isinstance(record.args, tuple):
            return
        errors = [a for a in record.args if isinstance(a, BUGS)]
        if errors:
            self.seen.append(f"{record.args[0]}: {errors[0]!r}")


@pytest.fixture(autouse=True)
def no_reconcile_bugs() -> Iterator[None]:
    handler = _ReconcileBugs()
    logger = logging.getLogger("ungater.controller")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
    if handler.seen:
        pytest.fail("a reconcile failed on a programming error:\n" + "\n".join(handler.seen[:5]))
