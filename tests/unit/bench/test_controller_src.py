"""``python -m bench run --controller-src DIR``: the controller process runs DIR's ungater,
and the result says which commit ran."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bench.controller_proc import CONTROLLER_SRC, controller_env
from bench.machine import machine_info


def test_without_a_source_tree_the_environment_is_left_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(CONTROLLER_SRC, raising=False)
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    assert controller_env()["PYTHONPATH"] == "/somewhere"


def test_a_source_tree_goes_first_on_the_path_and_its_commit_is_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(
        [
            "git",
            "-C",
            str(tmp_path),
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            "x",
        ],
        check=True,
    )
    monkeypatch.setenv(CONTROLLER_SRC, str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    assert controller_env()["PYTHONPATH"].split(":") == [str(tmp_path), "/somewhere"]
    head = subprocess.run(
        ["git", "-C", str(tmp_path), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert machine_info("v0")["controller_commit"] == f"{head} ({tmp_path})"
