"""Suite-wide: an error the controller logged and carried on from fails the test when it was a
programming error.

The worker retries a failed reconcile with backoff and a watch restarts after a handler raised,
so a bug that raises (a ``TypeError`` on a ``None``, a ``KeyError``) can end in the right pods
released after a retry, and a test that checks only the end state passes. So every warning or
error logged under ``ungater`` (the controller, its watches in ``ungater.reflector``, the Event
recorder, the leader elector, ...) is searched for a bug: inside an exception group (the
patches of a reconcile run in a task group), behind a ``PluginError`` (the registry wraps
whatever a plugin raised), and along the chain of causes. An API error, a malformed object and a broken stream are the cluster's doing and end the
search: the fake's 422 is raised *from* the ``KeyError`` that found the missing path.

A test that injects such an error on purpose says so, and why, with
``@pytest.mark.injects(SomeError, reason="...")``; only those types are then let through, any
other bug still fails it.

Under CI a skipped test fails: the hook is in the repository's top ``conftest.py``, so that it
covers ``examples/*/tests`` too.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import aiohttp
import pytest

from ungater._kube.client import ApiError
from ungater._model.views import MalformedObject

pytest_plugins = ("pytester",)

#: Exceptions that mean the controller's (or a plugin's) own code is wrong, never the cluster.
BUGS: tuple[type[BaseException], ...] = (
    AssertionError,
    AttributeError,
    IndexError,
    KeyError,
    NameError,
    TypeError,
    UnboundLocalError,
    ValueError,
    ZeroDivisionError,
)

#: The cluster's or the wire's doing: not a bug, and what they were raised from is how the
#: failure was detected (a ``KeyError`` behind a 422, a ``TypeError`` behind a malformed object).
EXPECTED: tuple[type[BaseException], ...] = (
    ApiError,
    MalformedObject,
    OSError,  # TimeoutError and ConnectionError included
    aiohttp.ClientError,
    json.JSONDecodeError,  # a watch line cut short
    UnicodeError,
)

WATCHED = ("ungater",)  # the controller, its watches, and every other part (events, leader, ...)
_MAX_DEPTH = 50  # a chain or a group nests far less; bounds a cycle through __context__


def bugs_in(
    exc: BaseException, allowed: tuple[type[BaseException], ...] = ()
) -> list[BaseException]:
    """The programming errors in ``exc``, its exception groups and its causes."""
    found: list[BaseException] = []
    seen: set[int] = set()
    todo: list[tuple[BaseException, int]] = [(exc, 0)]
    while todo:
        e, depth = todo.pop()
        if id(e) in seen or depth > _MAX_DEPTH:
            continue
        seen.add(id(e))
        if isinstance(e, EXPECTED):
            continue
        if isinstance(e, BUGS):
            if not isinstance(e, allowed):
                found.append(e)
            continue
        if isinstance(e, BaseExceptionGroup):
            todo.extend((sub, depth + 1) for sub in e.exceptions)
        if e.__cause__ is not None:
            todo.append((e.__cause__, depth + 1))
        if e.__context__ is not None and not e.__suppress_context__:
            todo.append((e.__context__, depth + 1))
    return found


class BugLog(logging.Handler):
    """Collects the bugs in the exceptions that warnings and errors carry (args or exc_info)."""

    def __init__(self, allowed: tuple[type[BaseException], ...] = ()) -> None:
        super().__init__(logging.WARNING)
        self.allowed = allowed
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args if isinstance(record.args, tuple) else ()
        carried = [a for a in args if isinstance(a, BaseException)]
        if record.exc_info and record.exc_info[1] is not None:
            carried.append(record.exc_info[1])
        for exc in carried:
            for bug in bugs_in(exc, self.allowed):
                self.seen.append(f"{record.name}: {record.getMessage()[:300]}: {bug!r}")

    def report(self) -> str:
        return "a logged error hides a programming error:\n" + "\n".join(self.seen[:5])


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "injects(*types, reason): the test raises these exception types in the controller's "
        "path on purpose (reason says where); the no_logged_bugs fixture lets them, and only "
        "them, through",
    )


def _allowed(request: pytest.FixtureRequest) -> tuple[type[BaseException], ...]:
    allowed: list[type[BaseException]] = []
    for mark in request.node.iter_markers("injects"):
        if (
            not mark.args
            or not all(isinstance(t, type) and issubclass(t, BaseException) for t in mark.args)
            or not mark.kwargs.get("reason")
        ):
            pytest.fail(
                "@pytest.mark.injects needs the exception types the test raises, and a reason"
            )
        allowed.extend(mark.args)
    return tuple(allowed)


@pytest.fixture(autouse=True)
def no_logged_bugs(request: pytest.FixtureRequest) -> Iterator[None]:
    handler = BugLog(_allowed(request))
    loggers = [logging.getLogger(name) for name in WATCHED]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        if logger.getEffectiveLevel() > logging.WARNING:
            logger.setLevel(logging.WARNING)  # a quieted logger must not drop what is checked
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.removeHandler(handler)
            logger.setLevel(level)
    if handler.seen:
        pytest.fail(handler.report())
