"""Under CI a skipped test fails the run, with the skip's reason (the top ``conftest.py``).

Each case runs in an inner pytest session with that conftest (``pytester``), once
with ``$CI`` set and once without: a skip in the test body, in a fixture and by a ``skipif``
mark fails under CI (the last two as errors: they skip in setup) and stays a skip elsewhere; an ``xfail`` is left alone; ``CI=1`` and
``CI=True`` count as CI, ``CI=false`` does not.
"""

from __future__ import annotations

from pathlib import Path

import pytest

CONFTEST = Path(__file__).parents[3] / "conftest.py"  # the repository's top conftest

INNER = """
import pytest

@pytest.fixture
def tool():
    pytest.skip("no tool here")

def test_body():
    pytest.skip("the body skipped")

def test_fixture(tool):
    pass

@pytest.mark.skipif(True, reason="a mark skipped")
def test_mark():
    pass

@pytest.mark.xfail(reason="known")
def test_expected_failure():
    assert False

def test_passes():
    pass
"""


def _run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ci: str | None):
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(INNER)
    return pytester.runpytest_inprocess("-p", "no:cacheprovider", "-q", "-rA")


@pytest.mark.parametrize("ci", ["true", "1", "True", "yes"])
def test_a_skip_fails_under_ci_with_its_reason(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ci: str
) -> None:
    result = _run(pytester, monkeypatch, ci)
    result.assert_outcomes(passed=1, failed=1, errors=2, xfailed=1)  # setup skips: errors
    for reason in ("the body skipped", "no tool here", "a mark skipped"):
        result.stdout.fnmatch_lines([f"*skipped under CI*{reason}*"])


@pytest.mark.parametrize("ci", [None, "false", ""])
def test_outside_ci_a_skip_stays_a_skip(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ci: str | None
) -> None:
    _run(pytester, monkeypatch, ci).assert_outcomes(passed=1, skipped=3, xfailed=1)
