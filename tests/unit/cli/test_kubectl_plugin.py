"""``kubectl ungater``: kubectl's conventions translated onto the ``ungater`` commands."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ungater._cli.kubectl import context_namespace, kubeconfig_paths, translate

KUBECONFIG = """\
apiVersion: v1
kind: Config
current-context: dev
contexts:
  - name: dev
    context: {cluster: c, user: u, namespace: team-a}
  - name: prod
    context: {cluster: c, user: u}
clusters: []
users: []
"""


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Path:
    path = tmp_path / "config"
    path.write_text(KUBECONFIG)
    return path


def test_explain_takes_the_namespace_of_the_current_context(kubeconfig: Path) -> None:
    env = {"KUBECONFIG": str(kubeconfig)}
    assert translate(["explain", "job-a-1"], env) == ["explain", "team-a/job-a-1"]


def test_explain_namespace_flag_context_flag_and_slash_form(kubeconfig: Path) -> None:
    env = {"KUBECONFIG": str(kubeconfig)}
    assert translate(["explain", "w", "-n", "ml"], env) == ["explain", "ml/w"]
    # a context without a namespace means `default`, as for kubectl
    assert translate(["explain", "w", "--context", "prod"], env) == [
        "explain",
        "default/w",
        "--context",
        "prod",
    ]
    assert translate(["explain", "ops/w", "--json", "--kubeconfig", str(kubeconfig)], {}) == [
        "explain",
        "ops/w",
        "--kubeconfig",
        str(kubeconfig),
        "--json",
    ]


def test_a_namespace_given_twice_differently_is_refused(kubeconfig: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        translate(["explain", "ops/w", "-n", "ml"], {"KUBECONFIG": str(kubeconfig)})
    assert exc.value.code == 2


def test_audit_is_namespaced_like_kubectl_unless_all_namespaces(kubeconfig: Path) -> None:
    env = {"KUBECONFIG": str(kubeconfig)}
    assert translate(["audit"], env) == ["audit", "--namespace", "team-a"]
    assert translate(["audit", "-A", "--json"], env) == ["audit", "--json"]
    assert translate(["audit", "--exit-zero"], env)[-1] == "--exit-zero"
    with pytest.raises(SystemExit):
        translate(["audit", "-A", "-n", "x"], env)


def test_plugins_and_version() -> None:
    assert translate(["plugins", "--json"], {}) == ["plugins", "--json"]
    assert translate(["version"], {}) == ["--version"]
    with pytest.raises(SystemExit) as exc:
        translate([], {})
    assert exc.value.code == 2


def test_kubeconfig_lists_merge_first_file_wins(tmp_path: Path, kubeconfig: Path) -> None:
    first = tmp_path / "first"
    first.write_text(
        "current-context: prod\ncontexts:\n  - name: prod\n    context: {namespace: ops}\n"
    )
    env = {"KUBECONFIG": os.pathsep.join([str(tmp_path / "missing"), str(first), str(kubeconfig)])}
    paths = kubeconfig_paths(None, env)
    assert paths[1:] == [first, kubeconfig]
    assert translate(["audit"], env) == ["audit", "--namespace", "ops"]
    # the context's definition in the first file that has it wins, too
    assert context_namespace([{"contexts": [{"name": "dev", "context": {}}]}], "dev") == "default"


def test_default_kubeconfig_is_under_home(tmp_path: Path) -> None:
    assert kubeconfig_paths(None, {"HOME": str(tmp_path)}) == [tmp_path / ".kube" / "config"]
    assert kubeconfig_paths("/x", {"KUBECONFIG": "/y"}) == [Path("/x")]
