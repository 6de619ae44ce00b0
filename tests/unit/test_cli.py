"""The command line: exit codes, one-line errors, JSON output."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
import yaml

from ungater import __version__
from ungater._cli import main


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ungater", *args], capture_output=True, text=True, timeout=60
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
    from ungater._cli import _parser

    args = _parser().parse_args(["run", "--no-leader-election"])
    assert args.no_leader_election is True


# -- check-config refuses what run refuses -------------------------------------------------

REFUSED_AT_START = {
    "a kind no installed plugin serves": (
        "kinds: [{group: example.com, kind: Widget}]\n",
        "no plugin serves kind Widget.example.com",
    ),
    "a plugin that does not serve the kind named": (
        "kinds: [{group: batch, kind: Job, plugin: raycluster}]\n",
        "plugin 'raycluster' does not serve kind Job.batch",
    ),
    "an unknown plugin in the allow list": (
        "plugins: {allow: [job, nosuch]}\nkinds: [{group: batch, kind: Job}]\n",
        "plugins.allow: no installed plugin is named 'nosuch'",
    ),
    "no kinds at all": ("kinds: []\n", "kinds: List should have at least 1 item"),
    "a gate that is no qualified name": ("gate: 'bad gate'\n", "is not a qualified name"),
}


@pytest.mark.parametrize("case", sorted(REFUSED_AT_START))
def test_check_config_and_run_refuse_the_same_with_the_same_message(
    tmp_path: Path, case: str
) -> None:
    """`check-config` exits 2 for what `run` refuses before touching a cluster, and both say
    the same thing (run is given a kubeconfig that leads nowhere: it must refuse first)."""
    text, message = REFUSED_AT_START[case]
    f = tmp_path / "c.yaml"
    f.write_text(text)
    kubeconfig = tmp_path / "kc"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    check = run_cli("check-config", str(f))
    run = run_cli("run", "--config", str(f), "--kubeconfig", str(kubeconfig))
    assert check.returncode == 2, check.stdout + check.stderr
    assert message in check.stderr, check.stderr
    assert run.returncode == 2, run.stderr
    assert run.stderr == check.stderr
    assert "Traceback" not in check.stderr + run.stderr


def test_a_kind_served_by_two_plugins_needs_one_named() -> None:
    """The same pure resolution run and check-config use refuses an ambiguous kind and accepts
    it once the config names the plugin."""
    import plugins.job as job_plugin
    from ungater._config import Config, KindConfig
    from ungater._kinds import StartupError, resolve_kinds
    from ungater._registry import PluginRegistry

    hooks = {
        name: getattr(job_plugin, name) for name in dir(job_plugin) if name.startswith("ungater_")
    }
    copy = types.SimpleNamespace(**hooks)  # a second plugin object with the same hooks
    registry = PluginRegistry.from_modules({"job": job_plugin, "job-copy": copy})
    ambiguous = Config(kinds=[KindConfig(group="batch", kind="Job")])
    with pytest.raises(StartupError, match="served by several plugins"):
        resolve_kinds(ambiguous, registry)
    named = Config(kinds=[KindConfig(group="batch", kind="Job", plugin="job-copy")])
    resolved = resolve_kinds(named, registry)
    assert [rk.handler.plugin.name for rk in resolved.kinds.values()] == ["job-copy"]


def test_check_config_prints_where_the_lease_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("gate: example.com/mine\n")
    assert main(["check-config", str(f)]) == 0
    out = yaml.safe_load(capsys.readouterr().out)
    from ungater._config import default_lease_name

    assert out["leaderElection"]["namespace"] == "kube-system"
    assert out["leaderElection"]["leaseName"] == default_lease_name(["example.com/mine"])


# -- small things a user meets ---------------------------------------------------------------


def test_debug_is_accepted_before_and_after_the_command() -> None:
    from ungater._cli import _parser

    parse = _parser().parse_args
    assert parse(["run", "--debug"]).debug is True
    assert parse(["--debug", "explain", "a/b"]).debug is True
    assert parse(["explain", "a/b"]).debug is False


def test_every_command_and_option_has_help() -> None:
    import argparse

    from ungater._cli import _parser

    parser = _parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert {c.dest for c in subparsers._choices_actions} == set(subparsers.choices)
    missing = [
        f"{name} {action.dest}"
        for name, sub in subparsers.choices.items()
        for action in sub._actions
        if not action.help
    ]
    assert not missing, missing
    assert all(c.help for c in subparsers._choices_actions)


def test_a_closed_pipe_is_not_an_error() -> None:
    """`ungater plugins | head -0`: the reader is gone before the first line is written."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ungater", "plugins"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # long before the interpreter has imported anything
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0, err
    assert err == ""
