"""The command line: exit codes, one-line errors, JSON output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from collections.abc import Sequence
from pathlib import Path

import pytest
import yaml

from ungater import __version__
from ungater._cli.main import main


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


@pytest.mark.parametrize("via", ["--kubeconfig", "KUBECONFIG"])
def test_run_with_a_kubeconfig_that_does_not_exist_says_so(tmp_path: Path, via: str) -> None:
    """One line naming the missing file, not the library's warning and its complaint about a
    current-context; the exit code of any other start-up error."""
    missing = tmp_path / "no-such-kubeconfig"
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env["HOME"] = str(tmp_path)  # no ~/.kube/config to fall back on
    argv = [sys.executable, "-m", "ungater", "run"]
    if via == "--kubeconfig":
        argv += ["--kubeconfig", str(missing)]
    else:
        env["KUBECONFIG"] = str(missing)
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr == (
        "ungater: error: cannot configure a Kubernetes client: "
        f"kubeconfig {missing} (from {via}) does not exist\n"
    )


def test_a_kubeconfig_list_needs_one_file_that_exists(tmp_path: Path) -> None:
    from ungater._kube.adapter import _require_kubeconfig

    there = tmp_path / "kc"
    there.write_text("apiVersion: v1\nkind: Config\n")
    gone = tmp_path / "gone"
    _require_kubeconfig(f"{gone}{os.pathsep}{there}", "KUBECONFIG")  # the library merges
    with pytest.raises(FileNotFoundError, match=f"none of the kubeconfig files {gone}, {gone}2"):
        _require_kubeconfig(f"{gone}{os.pathsep}{gone}2", "KUBECONFIG")


def test_run_accepts_no_leader_election() -> None:
    from ungater._cli.main import _parser

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
    from ungater._model.config import Config, KindConfig
    from ungater._model.errors import StartupError
    from ungater._plugins.binding import resolve_kinds
    from ungater._plugins.registry import PluginRegistry

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
    from ungater._model.config import default_lease_name

    assert out["leaderElection"]["namespace"] == "kube-system"
    assert out["leaderElection"]["leaseName"] == default_lease_name(["example.com/mine"])


# -- small things a user meets ---------------------------------------------------------------


def test_debug_is_accepted_before_and_after_the_command() -> None:
    from ungater._cli.main import _parser

    parse = _parser().parse_args
    assert parse(["run", "--debug"]).debug is True
    assert parse(["--debug", "explain", "a/b"]).debug is True
    assert parse(["explain", "a/b"]).debug is False


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


# -- the dev tools' commands: there when installed, one line on how to get them when not ------

#: runs the CLI in a subprocess with the ``ungater.commands`` entry points replaced by ARGV[1]
#: (a JSON list of [name, value]) and, unless ARGV[2] is "keep", the dev tools' package hidden
HIDE_DEV_TOOLS = """
import json, sys, importlib.metadata as md
fake = md.EntryPoints(
    md.EntryPoint(name=n, value=v, group="ungater.commands") for n, v in json.loads(sys.argv[1])
)
real = md.entry_points
md.entry_points = lambda **kw: fake if kw.get("group") == "ungater.commands" else real(**kw)
if sys.argv[2] != "keep":
    sys.modules["ungater_devtools"] = None  # import ungater_devtools now fails
from ungater._cli.main import main
raise SystemExit(main(sys.argv[3:]))
"""


def run_without_dev_tools(
    *args: str, entry_points: Sequence[tuple[str, str]] = (), keep: bool = False
) -> subprocess.CompletedProcess[str]:
    hidden = [sys.executable, "-c", HIDE_DEV_TOOLS, json.dumps(entry_points)]
    return subprocess.run(
        [*hidden, "keep" if keep else "-", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_dev_cluster_and_demo_come_from_the_dev_tools_when_installed() -> None:
    from ungater._cli.main import _parser
    from ungater_devtools.commands import DEMO, DEV_CLUSTER

    parse = _parser().parse_args
    up = parse(["dev-cluster", "up", "--state-dir", "/s", "--no-peers", "--debug"])
    assert up.extra is DEV_CLUSTER
    assert (up.action, up.state_dir, up.no_peers, up.debug) == ("up", Path("/s"), True, True)
    demo = parse(["demo", "--fast"])
    assert demo.extra is DEMO and demo.fast is True
    shown = run_cli("dev-cluster", "--help")
    assert shown.returncode == 0 and "{up,down,build}" in shown.stdout, shown.stderr
    assert "needs the dev tools" not in run_cli("--help").stdout


@pytest.mark.parametrize(
    "argv",
    [
        ["dev-cluster", "up"],
        ["dev-cluster", "--state-dir", "/x", "up", "--no-peers"],
        ["demo", "--fast"],
    ],
)
def test_without_the_dev_tools_their_commands_say_how_to_install_them(argv: list[str]) -> None:
    proc = run_without_dev_tools(*argv)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1, proc.stderr  # one line, no traceback
    assert proc.stderr.startswith(f"ungater: error: `ungater {argv[0]}`: the dev tools are not")
    assert "make install" in proc.stderr and "pip install -e devtools" in proc.stderr


def test_without_the_dev_tools_the_runtime_commands_work_and_help_says_what_needs_them() -> None:
    shown = run_without_dev_tools("--help")
    assert shown.returncode == 0, shown.stderr
    assert "(needs the dev tools)" in shown.stdout.replace("\n                ", " ")
    assert run_without_dev_tools("plugins").returncode == 0
    bad = run_without_dev_tools("plugins", "--bogus")  # only a missing command takes anything
    assert bad.returncode == 2 and "unrecognized arguments: --bogus" in bad.stderr


def test_a_command_that_fails_to_load_says_why_and_breaks_nothing_else() -> None:
    broken = [("demo", "no_such_module_here:DEMO")]
    proc = run_without_dev_tools("demo", entry_points=broken, keep=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "cannot load it from no_such_module_here:DEMO: ModuleNotFoundError" in proc.stderr
    assert run_without_dev_tools("plugins", entry_points=broken, keep=True).returncode == 0


def test_an_entry_point_cannot_replace_a_runtime_command() -> None:
    proc = run_without_dev_tools(
        "run", "--help", entry_points=[("run", "ungater_devtools.commands:DEMO")], keep=True
    )
    assert proc.returncode == 0 and "--no-leader-election" in proc.stdout, proc.stderr
