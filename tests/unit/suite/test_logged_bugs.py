"""The suite-wide fixture of ``tests/conftest.py`` fails a test whose controller logged a
programming error and carried on, wherever the error surfaced.

Each case runs the real controller (or the real reflector) on the fake API server in an inner
pytest session (``pytester``) that uses the suite's own ``conftest.py``: once unmarked, where the
inner test must fail, and once with ``@pytest.mark.injects(...)``, where it must pass. The
scenarios raise on purpose, and the outer test sees the same log lines, so each outer test is
marked with the types its inner runs raise. Each case passed unnoticed under the fixture as it
was before (docs/testing.md).
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest

from tests.conftest import BugLog, bugs_in
from ungater._kube.client import ApiError
from ungater._model.views import MalformedObject

CONFTEST = Path(__file__).parents[2] / "conftest.py"
FIXTURE_FAILED = "a logged error hides a programming error"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# -- the scenarios the inner sessions run ------------------------------------------------------


INNER = """
import pytest

from tests.unit.suite.logged_bug_scenarios import SCENARIOS


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_unmarked():
    await SCENARIOS[{scenario!r}]({error})


@pytest.mark.anyio
@pytest.mark.injects({allowed}, reason="the scenario raises it")
async def test_marked():
    await SCENARIOS[{scenario!r}]({error})
"""


def run_inner(
    pytester: pytest.Pytester, scenario: str, error: str, allowed: str, conftest: Path = CONFTEST
) -> pytest.RunResult:
    pytester.makeconftest(conftest.read_text())
    pytester.makepyfile(INNER.format(scenario=scenario, error=error, allowed=allowed))
    return pytester.runpytest_inprocess("-p", "no:cacheprovider", "-q")


def assert_only_unmarked_fails(result: pytest.RunResult, bug: str) -> None:
    result.assert_outcomes(passed=2, errors=1)  # the fixture fails in teardown: an error
    out = result.stdout.str()
    assert "ERROR at teardown of test_unmarked" in out, out
    assert FIXTURE_FAILED in out and bug in out, out


# -- each case: the fixture fails the unmarked inner test, and only that one --------------------


@pytest.mark.injects(TypeError, reason="the inner runs log it")
def test_a_bug_inside_the_patch_task_group_fails_the_test(pytester: pytest.Pytester) -> None:
    result = run_inner(
        pytester, "patch_bug_in_task_group", "TypeError('no subscript')", "TypeError"
    )
    assert "ExceptionGroup" in result.stdout.str()  # it did arrive wrapped
    assert_only_unmarked_fails(result, "TypeError('no subscript')")


@pytest.mark.injects(ValueError, reason="the inner runs log it")
def test_a_value_error_in_a_reconcile_fails_the_test(pytester: pytest.Pytester) -> None:
    result = run_inner(pytester, "reconcile_raises", "ValueError('bad int')", "ValueError")
    assert_only_unmarked_fails(result, "ValueError('bad int')")


@pytest.mark.injects(KeyError, ValueError, reason="the inner runs log them")
@pytest.mark.parametrize(
    ("error", "logged"),
    [("KeyError('spec')", "watch error KeyError"), ("ValueError('bad int')", "watch failed (bad")],
)
def test_an_event_handler_bug_fails_the_test(
    pytester: pytest.Pytester, error: str, logged: str
) -> None:
    """KeyError is logged as a watch error, ValueError as a failed watch: both are bugs."""
    result = run_inner(pytester, "handler_bug", error, error.split("(")[0])
    assert f"ungater.reflector: pods.core@team-a: {logged}" in result.stdout.str()
    assert_only_unmarked_fails(result, error)


@pytest.mark.injects(KeyError, reason="the inner runs log it")
def test_a_plugin_bug_behind_a_plugin_error_fails_the_test(pytester: pytest.Pytester) -> None:
    result = run_inner(pytester, "plugin_bug", "KeyError('controller-uid')", "KeyError")
    assert "skipped: plugin job: ungater_pod_selector: KeyError" in result.stdout.str()
    assert_only_unmarked_fails(result, "KeyError('controller-uid')")


@pytest.mark.injects(TypeError, reason="the inner runs log it")
def test_the_mark_lets_through_only_the_types_it_names(pytester: pytest.Pytester) -> None:
    result = run_inner(pytester, "patch_bug_in_task_group", "TypeError('x')", "KeyError")
    result.assert_outcomes(passed=2, errors=2)  # both fail at teardown


def test_the_mark_needs_exception_types(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(
        "import pytest\n\n"
        "@pytest.mark.injects('KeyError', reason='a name, not a type')\n"
        "def test_name():\n    pass\n\n"
        "@pytest.mark.injects(KeyError, RuntimeError)\n"
        "def test_no_reason():\n    pass\n"
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(errors=2)
    assert result.stdout.str().count("needs the exception types") >= 2


# -- what is not a bug ---------------------------------------------------------------------------


def raised_from(error: BaseException, cause: BaseException) -> BaseException:
    try:
        raise error from cause
    except BaseException as exc:
        return exc


def raised_during(error: BaseException, context: BaseException) -> BaseException:
    try:
        try:
            raise context
        except BaseException:
            raise error  # noqa: B904 -- the implicit context is the point
    except BaseException as exc:
        return exc


def test_the_clusters_errors_and_what_detected_them_are_not_bugs() -> None:
    assert bugs_in(raised_from(ApiError(422, "doc is missing path"), KeyError("x"))) == []
    assert bugs_in(raised_from(MalformedObject("ill-typed field"), TypeError("x"))) == []
    assert bugs_in(json.JSONDecodeError("cut", "{", 1)) == []
    assert bugs_in(ConnectionResetError()) == []
    assert bugs_in(TimeoutError()) == []
    assert bugs_in(RuntimeError("a fault a test injected")) == []


def test_bugs_are_found_through_groups_causes_and_contexts() -> None:
    bug = KeyError("uid")
    group = ExceptionGroup("patches", [ApiError(500, "x"), ExceptionGroup("inner", [bug])])
    assert bugs_in(group) == [bug]
    assert bugs_in(raised_from(RuntimeError("wrapped"), bug)) == [bug]
    assert bugs_in(raised_during(RuntimeError("cleanup failed"), bug)) == [bug]
    hidden = raised_from(RuntimeError("outer"), bug)
    hidden.__suppress_context__ = True  # `from None` style: the cause is still followed
    assert bugs_in(hidden) == [bug]
    assert bugs_in(ValueError("bad int")) != []
    assert bugs_in(bug, allowed=(KeyError,)) == []


def test_the_handler_reads_exc_info_and_arguments() -> None:
    handler = BugLog()
    try:
        raise AttributeError("no attribute 'uid'")
    except AttributeError:
        info = sys.exc_info()
    record = logging.LogRecord("ungater.controller", logging.ERROR, "f", 1, "failed", (), info)
    handler.emit(record)
    record = logging.LogRecord(
        "ungater.reflector", logging.WARNING, "f", 1, "watch error %r", (IndexError(0),), None
    )
    handler.emit(record)
    assert len(handler.seen) == 2 and "AttributeError" in handler.seen[0], handler.seen
    assert "IndexError" in handler.seen[1]
