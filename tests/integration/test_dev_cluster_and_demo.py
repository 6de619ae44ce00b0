"""`ungater dev-cluster up/down` and `ungater demo` as a newcomer runs them. Each starts its own
control plane from the cached binaries (the session fixture only makes sure they are built)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration


def cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ungater.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split()[2] == "Z")


def test_dev_cluster_up_then_down_leaves_nothing(control_plane: Any, tmp_path: Path) -> None:
    state = tmp_path / "dev"
    pid_list: list[int] = []
    up = cli("dev-cluster", "up", "--state-dir", str(state))
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        kubeconfig = state / "kubeconfig"
        assert f"export KUBECONFIG={kubeconfig}" in up.stdout
        record = json.loads((state / "pids.json").read_text())
        pid_list = [int(p["pid"]) for p in record["processes"].values()]
        assert len(pid_list) == 3 and all(alive(p) for p in pid_list)
        again = cli("dev-cluster", "up", "--state-dir", str(state))
        assert again.returncode == 0 and "already running" in again.stdout
        probe = cli("explain", "default/none", "--kubeconfig", str(kubeconfig))
        assert probe.stderr.strip() == "ungater: error: workload default/none not found"
    finally:
        down = cli("dev-cluster", "down", "--state-dir", str(state))
    assert down.returncode == 0, down.stdout + down.stderr
    assert not any(alive(p) for p in pid_list)


def test_demo_runs_the_narrated_scenario(control_plane: Any) -> None:
    proc = cli("demo", "--fast", timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert out.count("[simulating Kueue]") >= 4
    assert "ungater releases exactly 2 pods" in out
    assert "released 2 pod(s) of pod set main of Job.batch ungater-demo/train" in out
    # the final table: three pods, all released
    final = out.split("== 6.")[1]
    assert final.count("released") >= 3 and "gated " not in final.split("What the controller")[0]
