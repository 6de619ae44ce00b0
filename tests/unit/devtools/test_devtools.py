"""The dev tools' small promises, without a control plane: `dev-cluster up` names the command
that stops it, the demo leaves no temporary directory behind, every option has help."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ungater._cli.main import main


class FakePlane:
    """Stands in for LocalControlPlane: records what was asked of it, starts nothing."""

    made: list[FakePlane] = []

    def __init__(self, *args: Any, state_dir: Path | None = None, **kwargs: Any) -> None:
        self.state_dir = state_dir
        self.server_url = "https://127.0.0.1:1"
        self.apiserver_port = 1
        self.etcd_url = "http://127.0.0.1:2"
        self.binaries = SimpleNamespace(kubernetes_version="v0.0.0")
        self.peers = None
        self.processes: dict[str, Any] = {}
        self.kubeconfig_path = Path("/nonexistent/kubeconfig")
        self.stopped = False
        FakePlane.made.append(self)

    def start(self) -> None:
        pass

    def stop(self) -> None:
        self.stopped = True


@pytest.fixture
def fake_plane(monkeypatch: pytest.MonkeyPatch) -> type[FakePlane]:
    from ungater_devtools.devcluster import environment

    FakePlane.made = []
    monkeypatch.setattr(environment, "LocalControlPlane", FakePlane)
    return FakePlane


@pytest.mark.parametrize(
    ("run", "stop"),
    [
        (lambda argv: main(["dev-cluster", *argv]), "ungater dev-cluster down"),
        (
            lambda argv: __import__(
                "ungater_devtools.devcluster.__main__"
            ).devcluster.__main__.main(argv),
            "python -m ungater_devtools.devcluster down",
        ),
    ],
    ids=["ungater dev-cluster", "python -m ungater_devtools.devcluster"],
)
def test_dev_cluster_up_names_the_command_that_stops_it(
    fake_plane: type[FakePlane],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    run: Any,
    stop: str,
) -> None:
    """The way to stop it is printed in the form it was started with."""
    state = tmp_path / "dev"
    assert run(["up", "--state-dir", str(state), "--no-peers"]) == 0
    out = capsys.readouterr().out
    assert f"export KUBECONFIG={state / 'kubeconfig'}" in out
    stop_lines = out.split("stop it with:\n")[1].splitlines()
    assert stop_lines[0].strip() == f"{stop} --state-dir {state}", out
    assert fake_plane.made and fake_plane.made[0].state_dir == state


def test_the_demo_leaves_no_temporary_directory_behind(
    fake_plane: type[FakePlane], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its config and log directory goes with the control plane even when the scenario fails,
    and the controller process it started is stopped."""
    from ungater_devtools import demo

    seen: dict[str, Any] = {}

    def failing_scenario(plane: Any, pause: float, leading: Any) -> str:
        seen["dirs"] = sorted(p.name for p in tmp_path.iterdir())
        raise RuntimeError("the scenario failed")

    started: list[Any] = []
    real_popen = demo.subprocess.Popen

    def popen(*args: Any, **kwargs: Any) -> Any:
        # the controller, told to read a kubeconfig that is not there: it exits on its own
        proc = real_popen(*args, **kwargs)
        started.append(proc)
        return proc

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(demo, "_scenario", failing_scenario)
    monkeypatch.setattr(demo.subprocess, "Popen", popen)
    monkeypatch.setattr(demo.anyio, "run", lambda func, *a: func(*a))
    with pytest.raises(RuntimeError, match="the scenario failed"):
        demo.run_demo(fast=True)
    assert [d for d in seen["dirs"] if d.startswith("ungater-demo-")], seen  # it made one
    assert list(tmp_path.iterdir()) == []
    assert fake_plane.made[0].stopped
    assert started and all(p.poll() is not None for p in started)
    assert started[0].args[:4] == [sys.executable, "-m", "ungater", "run"]


def _undocumented(parser: argparse.ArgumentParser, path: str) -> list[str]:
    """Every action without help in the whole argparse tree below ``parser``."""
    missing = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helped = {c.dest for c in action._choices_actions if c.help}
            missing += [f"{path} {name}" for name in action.choices if name not in helped]
            for name, sub in action.choices.items():
                missing += _undocumented(sub, f"{path} {name}")
        elif not action.help:
            missing.append(f"{path} {action.dest}")
    return missing


def test_every_command_and_option_has_help_in_both_command_lines() -> None:
    from ungater._cli.main import _parser
    from ungater_devtools.devcluster.__main__ import parser as devcluster_parser
    from ungater_devtools.devcluster.helm import parser as helm_parser

    assert _undocumented(_parser(), "ungater") == []
    assert _undocumented(devcluster_parser(), "devcluster") == []
    assert _undocumented(helm_parser(), "helm") == []
    # and the walk does notice a missing one
    broken = _parser()
    broken.add_argument("--undocumented")
    assert _undocumented(broken, "ungater") == ["ungater undocumented"]


# -- the fixtures' one "build or reuse" step -------------------------------------------------


class Unavailable(Exception):
    pass


def _build_or_reuse(mode: str, find: Any, ensure: Any) -> Any:
    from ungater_devtools.pytest_plugin import _built_or_reused

    said: list[str] = []
    return _built_or_reused("the thing", find, ensure, Unavailable, mode, said.append, None)


def test_a_cached_build_is_reused_and_a_missing_one_built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    built: list[Any] = []

    def ensure(log: Any) -> str:
        built.append(log)
        log("building")
        return "new"

    assert _build_or_reuse("", lambda: "cached", ensure) == "cached"
    assert built == []
    assert _build_or_reuse("", lambda: None, ensure) == "new"
    assert len(built) == 1


def test_reuse_mode_never_builds_and_skips_outside_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)

    def ensure(log: Any) -> str:
        raise AssertionError("built under UNGATER_CONTROL_PLANE=reuse")

    with pytest.raises(pytest.skip.Exception, match="reuse and no cached build of the thing"):
        _build_or_reuse("reuse", lambda: None, ensure)


def test_a_failed_build_skips_outside_ci_and_fails_under_ci(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def ensure(log: Any) -> str:
        raise Unavailable("no Go toolchain")

    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no Go toolchain"):
        _build_or_reuse("", lambda: None, ensure)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="unavailable under CI=true: no Go toolchain"):
        _build_or_reuse("reuse", lambda: None, ensure)  # reuse mode does not hold under CI
