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
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
import ungater_plugins.job as job_plugin

from tests.conftest import BugLog, bugs_in
from tests.fakekube import FakeKube
from tests.objects import JOBS, WORKLOADS
from tests.polling import eventually
from tests.unit.harness import running
from tests.unit.podfactory import job, job_pod, workload
from ungater._kube.client import PODS, ApiError
from ungater._kube.reflector import Reflector
from ungater._model.config import Config
from ungater._model.views import MalformedObject
from ungater.plugin_api import hookimpl

CONFTEST = Path(__file__).parents[2] / "conftest.py"
FIXTURE_FAILED = "a logged error hides a programming error"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def config() -> Config:
    return Config.model_validate(
        {
            "mode": "release",  # the test plays Kueue: no other releaser on its gate
            "kinds": [{"group": "batch", "kind": "Job"}],
            "watch": {"backoffInitialSeconds": 0.01, "backoffMaxSeconds": 0.05},
        }
    )


def admitted_job(fake: FakeKube, name: str = "train") -> None:
    j = fake.put(JOBS, job(name, parallelism=1, completions=1))
    fake.put(PODS, job_pod(j, index=0, created=1))
    fake.put(WORKLOADS, workload(j, {"main": 1}, admitted={"main": 1}))


# -- the scenarios the inner sessions run ------------------------------------------------------


class PatchRaises(FakeKube):
    """A client whose pod patch has a bug: it raises inside the patcher's task group."""

    error: BaseException = TypeError("'NoneType' object is not subscriptable")

    async def json_patch(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        raise self.error


async def patch_bug_in_task_group(error: BaseException) -> None:
    fake = PatchRaises()
    fake.error = error
    admitted_job(fake)
    async with running(fake, config(), observed=True) as ctl:
        await eventually(lambda: ctl.stats.reconcile_errors >= 1, what="a failed reconcile")


async def reconcile_raises(error: BaseException) -> None:
    """The worker's own catch: the reconcile itself raises (not inside a task group)."""
    fake = FakeKube()
    admitted_job(fake)
    async with running(fake, config(), observed=True) as ctl:

        async def reconcile(key: Any) -> None:
            raise error

        ctl.reconciler.reconcile = reconcile  # type: ignore[method-assign]
        ctl.queue.add(next(iter(ctl.workloads.owner_keys())))
        await eventually(lambda: ctl.stats.reconcile_errors >= 1, what="a failed reconcile")


class OneEvent:
    """A client whose first watch delivers one ADDED pod; later watches stay open and quiet."""

    def __init__(self) -> None:
        self.watches = 0

    async def list_pages(self, *args: Any) -> AsyncIterator[tuple[list[dict[str, Any]], str]]:
        yield [], "1"

    async def watch(self, *args: Any) -> AsyncIterator[dict[str, Any]]:
        self.watches += 1
        if self.watches == 1:
            meta = {"name": "train-1", "uid": "u1", "resourceVersion": "2"}
            yield {"type": "ADDED", "object": {"metadata": meta}}
        await anyio.sleep_forever()


async def handler_bug(error: BaseException) -> None:
    """A watch event whose handler raises: the reflector logs it and watches again."""

    def on_change(old: Any, new: Any) -> None:
        raise error

    client = OneEvent()
    reflector: Reflector[Any] = Reflector(
        client,  # type: ignore[arg-type]
        PODS,
        "team-a",
        dict,
        on_change,
        backoff_initial=0.01,
        backoff_max=0.05,
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(reflector.run)
        await eventually(lambda: client.watches >= 2, what="a second watch")
        assert reflector.resource_version == "2"  # the event's bookkeeping is lost
        tg.cancel_scope.cancel()


class SelectorRaises:
    """The Job plugin with a bug in its pod selector hook (the registry wraps it)."""

    error: BaseException = KeyError("controller-uid")
    ungater_kinds = staticmethod(job_plugin.ungater_kinds)
    ungater_owns_pod = staticmethod(job_plugin.ungater_owns_pod)
    ungater_pod_set = staticmethod(job_plugin.ungater_pod_set)
    ungater_owner_facts = staticmethod(job_plugin.ungater_owner_facts)
    ungater_desired_counts = staticmethod(job_plugin.ungater_desired_counts)

    @staticmethod
    @hookimpl
    def ungater_pod_selector(owner: Any) -> Any:
        raise SelectorRaises.error


async def plugin_bug(error: BaseException) -> None:
    SelectorRaises.error = error
    fake = FakeKube()
    admitted_job(fake)
    async with running(fake, config(), plugins={"job": SelectorRaises}) as ctl:
        await eventually(lambda: ctl.stats.plugin_errors >= 1, what="a plugin error")


SCENARIOS: dict[str, Callable[[BaseException], Awaitable[None]]] = {
    "patch_bug_in_task_group": patch_bug_in_task_group,
    "reconcile_raises": reconcile_raises,
    "handler_bug": handler_bug,
    "plugin_bug": plugin_bug,
}

INNER = """
import pytest

from tests.unit.suite.test_logged_bugs import SCENARIOS


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
