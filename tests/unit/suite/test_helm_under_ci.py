"""The chart tests of tests/integration (helm and the RBAC source come from its deploy.py) fail
under ``CI=true`` when helm cannot be had, as the control plane does, and skip elsewhere (their
RBAC tests then fall back to the plain manifests, outside CI only)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration import deploy
from ungater_devtools.devcluster import helm as helm_tool


def outcome(call: Callable[[], object]) -> BaseException | None:
    """What ``call`` raised, a skip included (a skip inside a test would skip it, not fail)."""
    try:
        call()
    except BaseException as exc:
        return exc
    return None


@pytest.fixture
def no_helm(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    builds: list[bool] = []

    def ensure_helm(build: bool = True, **kw: object) -> None:
        builds.append(build)

    monkeypatch.setattr(helm_tool, "find_helm", lambda: None)
    monkeypatch.setattr(helm_tool, "ensure_helm", ensure_helm)
    monkeypatch.delenv("UNGATER_CONTROL_PLANE", raising=False)
    return builds


@pytest.mark.parametrize("ci", ["true", "1", "YES"])
def test_no_helm_fails_the_chart_tests_under_ci(
    no_helm: list[bool], monkeypatch: pytest.MonkeyPatch, pytestconfig: pytest.Config, ci: str
) -> None:
    monkeypatch.setenv("CI", ci)
    raised = outcome(lambda: deploy.helm_for_tests(pytestconfig))
    assert isinstance(raised, pytest.fail.Exception), repr(raised)
    assert "helm is unavailable under CI=true" in str(raised)
    assert no_helm == [True], "a build was tried first"
    raised = outcome(deploy.rbac_source)
    assert isinstance(raised, pytest.fail.Exception), repr(raised)
    assert "the chart's RBAC is not checked" in str(raised)


def test_no_helm_skips_the_chart_tests_outside_ci(
    no_helm: list[bool], monkeypatch: pytest.MonkeyPatch, pytestconfig: pytest.Config
) -> None:
    monkeypatch.delenv("CI", raising=False)
    raised = outcome(lambda: deploy.helm_for_tests(pytestconfig))
    assert isinstance(raised, pytest.skip.Exception), repr(raised)
    assert "helm is unavailable, so the chart is not checked" in str(raised)
    objects, source = deploy.rbac_source()
    assert source == "deploy/manifests (helm unavailable)" and objects


def test_a_found_helm_is_used(monkeypatch: pytest.MonkeyPatch, pytestconfig: pytest.Config) -> None:
    monkeypatch.setenv("CI", "true")
    monkeypatch.setattr(helm_tool, "find_helm", lambda: Path("/opt/helm"))
    assert deploy.helm_for_tests(pytestconfig) == Path("/opt/helm")
