"""The command line: exit codes, one-line errors, JSON output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ungater import __version__
from ungater.cli import main


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ungater.cli", *args], capture_output=True, text=True, timeout=60
    )


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"ungater {__version__}"


def test_check_config_prints_effective_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("gate: example.com/mine\nnamespaces: [a, b]\n")
    assert main(["check-config", str(f)]) == 0
    out = capsys.readouterr().out
    assert "gate: example.com/mine" in out
    assert "requireElasticAnnotation: true" in out
    assert "- b" in out


def test_check_config_bad_input_exits_2_naming_file_and_key(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("client:\n  qps: fast\nwat: 1\n")
    proc = run_cli("check-config", str(f))
    assert proc.returncode == 2
    assert f"{f}: client.qps:" in proc.stderr
    assert f"{f}: wat: unknown key" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_check_config_missing_file(tmp_path: Path) -> None:
    proc = run_cli("check-config", str(tmp_path / "nope.yaml"))
    assert proc.returncode == 2
    assert "cannot read" in proc.stderr


def test_plugins_json_lists_the_builtins_through_entry_points() -> None:
    proc = run_cli("plugins", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    assert rows["job"]["kinds"] == ["Job.batch"]
    assert rows["jobset"]["kinds"] == ["JobSet.jobset.x-k8s.io"]
    assert rows["raycluster"]["kinds"] == ["RayCluster.ray.io"]
    assert rows["job"]["distribution"] == "ungater"
    assert all(not r["error"] for r in rows.values())


def test_plugins_text() -> None:
    proc = run_cli("plugins")
    assert proc.returncode == 0
    assert "RayCluster.ray.io" in proc.stdout


def test_explain_needs_namespace_and_name() -> None:
    proc = run_cli("explain", "just-a-name")
    assert proc.returncode == 2
    assert "NAMESPACE/WORKLOAD" in proc.stderr


def test_run_without_cluster_is_one_clear_line(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kc"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    proc = run_cli("run", "--kubeconfig", str(kubeconfig))
    assert proc.returncode == 1
    assert proc.stderr.strip().count("\n") == 0, proc.stderr
    assert proc.stderr.startswith("ungater: error:")


def test_run_accepts_no_leader_election() -> None:
    from ungater.cli import _parser

    args = _parser().parse_args(["run", "--no-leader-election"])
    assert args.no_leader_election is True
