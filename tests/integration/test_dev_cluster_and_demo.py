"""`ungater dev-cluster up/down` and `ungater demo` as a newcomer runs them. Each starts its own
control plane from the cached binaries (the session fixture only makes sure they are built)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from ungater_devtools.ci import in_ci
from ungater_devtools.devcluster import versions

pytestmark = pytest.mark.integration


def cli(
    *args: str, timeout: float = 180, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ungater", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
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
        # the way to stop it, in the form it was started with
        assert f"stop it with:\n  ungater dev-cluster down --state-dir {state}\n" in up.stdout
        record = json.loads((state / "pids.json").read_text())
        pid_list = [int(p["pid"]) for p in record["processes"].values()]
        assert len(pid_list) == 6 and all(alive(p) for p in pid_list)  # with the peers
        # the Kueue that runs (the default pin, or its fallback) is named and recorded
        assert f"Kueue {record['kueue_version']}\n" in up.stdout
        assert record["kueue_version"] in versions.KUEUE_PINS
        again = cli("dev-cluster", "up", "--state-dir", str(state))
        assert again.returncode == 0 and "already running" in again.stdout
        probe = cli("explain", "default/none", "--kubeconfig", str(kubeconfig))
        assert probe.stderr.strip() == "ungater: error: workload default/none not found"
    finally:
        down = cli("dev-cluster", "down", "--state-dir", str(state))
    assert down.returncode == 0, down.stdout + down.stderr
    assert not any(alive(p) for p in pid_list)


WAVE_ROW = re.compile(r"^ +(\d+)  (train-\d+-\w+) +([+-]\d+) +([+-]\d+) +([+-]\d+)$", re.M)


def wave_rows(out: str, title: str) -> list[tuple[int, int, int, int]]:
    """(index, ms to the pod seen, to Kueue's gate off, to ungater's) of the wave ``title``."""
    table = out.split(f"{title}: ms after the demo saw slice")[1].split("last pod free")[0]
    return [(int(m[0]), int(m[2]), int(m[3]), int(m[4])) for m in WAVE_ROW.findall(table)]


def check_demo_output(out: str) -> None:
    """What the demo must show on Kueue v0.19.2, from its output alone."""
    assert "simulating" not in out
    assert "ClusterQueue 'demo': 6 CPUs" in out
    # each wave's table: every pod of the wave, both gates timed (ms after the admission)
    first = wave_rows(out, "Initial admission")
    assert [row[0] for row in first] == [0, 1, 2], first
    assert all(0 <= seen <= min(k, u) for _, seen, k, u in first), first
    # Kueue reconciles a pod event 1 s after it (its UpdatesBatchPeriod): its column, not ours
    assert min(k for _, _, k, _ in first) - min(seen for _, seen, _, _ in first) >= 800, first
    step4 = out.split("== 4.")[1].split("== 5.")[0]
    assert "pending: waiting for quota" in step4  # the quota held the scale-up slice back
    step5 = out.split("== 5.")[1].split("== 6.")[0]
    assert "ADMITTED 6" in step5
    second = wave_rows(step5, "Scale-up admission")
    assert [row[0] for row in second] == [3, 4, 5], step5
    assert all(seen < 0 <= min(k, u) for _, seen, k, u in second), second  # made while pending
    # the freed slot: ungater takes the lowest waiting index, Kueue the lowest pod name
    step6 = out.split("== 6.")[1].split("== 7.")[0]
    assert "asks for 12   pending: waiting for quota" in step6
    picks = dict(re.findall(r"^ +(ungater|Kueue): +(train-\d+)-\w+ \(index \d+\)", step6, re.M))
    assert picks == {"ungater": "train-6", "Kueue": "train-10"}, step6
    assert re.search(r"train-5-\w+ keeps both gates", step6), step6
    assert "neither can be scheduled" in step6
    assert "ungater must be the only releaser of a gate" in step6
    releases = re.findall(r"released (\d+) pod\(s\) of pod set main .*\(slice (\S+)\)", out)
    per_slice: dict[str, int] = {}
    for n, name in releases:
        per_slice[name] = per_slice.get(name, 0) + int(n)
    assert list(per_slice.values()) == [3, 4], releases  # 3 admitted; 3 more, then the slot
    # the scale-down shows the state before and after it, each under its caption
    step7 = out.split("== 7.")[1].split("What the controller")[0]
    before, after = step7.split("Before the scale-down:")[1].split("After it:")
    assert before.count("released        released") == 5, step7
    # the final table: three pods, both gates off, the slice lowered to 3 and admitted
    final = after.strip().split("\n\n")[0]
    assert final.count("released        released") == 3, final
    assert "asks for  3   ADMITTED 3" in final, final
    assert "pod set main: cap 3 (spec 3, admitted 3, owner 3), released 3" in out


def test_demo_runs_the_narrated_scenario(control_plane: Any, tmp_path: Path) -> None:
    """The demo runs the real Kueue: no step plays Kueue's part; quota holds a scale-up back.
    It leaves no temporary directory behind (its own TMPDIR is empty afterwards)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = cli("demo", "--fast", timeout=400, env={"TMPDIR": str(tmp)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in tmp.iterdir()) == []
    assert "; Kueue v0.19.2 runs" in proc.stdout  # the picks below are v0.19.2's
    check_demo_output(proc.stdout)


def _toy_archive(root: Path) -> Path:
    """A main module whose one dependency exists only in its ``vendor/``: it builds offline
    with ``-mod=vendor`` and nothing else."""
    tree = root / "toy-v1.0.0"
    files = {
        "go.mod": "module example.com/toy\n\ngo 1.26.0\n\nrequire example.com/dep v1.0.0\n",
        "main.go": (
            'package main\n\nimport (\n\t"fmt"\n\n\t"example.com/dep"\n)\n\n'
            'var GitVersion = "dev"\n\nfunc main() { fmt.Println(GitVersion, dep.Name) }\n'
        ),
        "vendor/modules.txt": "# example.com/dep v1.0.0\n## explicit; go 1.26\nexample.com/dep\n",
        "vendor/example.com/dep/dep.go": 'package dep\n\nconst Name = "vendored"\n',
        "config/components/crd/bases/toy.yaml": "kind: CustomResourceDefinition\n",
    }
    for rel, text in files.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)
    archive = root / "toy-v1.0.0.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tree, arcname=tree.name)
    return archive


def test_a_peer_builds_offline_from_its_verified_source_archive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The way Kueue v0.19.2 is built when its archive is given: verified, kept in the cache,
    unpacked, built with its vendor/ and GOPROXY=off, its config/ kept for the manifests."""
    from ungater_devtools.devcluster import peerbuild

    if shutil.which("go") is None and not in_ci():
        pytest.skip("no Go toolchain")
    archive = _toy_archive(tmp_path / "shared")
    pin = versions.Peer(
        name="toy",
        module="example.com/toy",
        version="v1.0.0",
        package=".",
        binary="toy",
        version_ldflags=("main.GitVersion={version}",),
        archive=versions.SourceArchive(
            file=archive.name,
            sha256=hashlib.sha256(archive.read_bytes()).hexdigest(),
            top="toy-v1.0.0",
        ),
    )
    monkeypatch.setenv("UNGATER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(peerbuild.PEER_SOURCES_ENV, str(archive.parent))
    monkeypatch.setenv("GOPROXY", "off")  # and the module itself is nowhere: no fallback to it
    said: list[str] = []
    [built] = peerbuild.ensure_peers([pin], log=said.append).values()
    run = subprocess.run([str(built.path)], capture_output=True, text=True, check=True)
    assert run.stdout.split() == ["v1.0.0", "vendored"]
    assert built.module_dir == peerbuild.peer_dir(pin) / "source"
    assert (built.module_dir / "config/components/crd/bases/toy.yaml").is_file()
    assert (peerbuild.sources_dir() / archive.name).read_bytes() == archive.read_bytes()
    stamp = peerbuild.read_peer_stamp(pin) or {}
    assert stamp["source"].startswith(f"archive {archive.name} sha256:")
    assert not (peerbuild.peer_dir(pin) / "src").exists(), "the unpacked tree is removed"
    assert any("sha256 verified" in line for line in said), said
    # a later checkout without the shared directory: found built, nothing looked up
    monkeypatch.delenv(peerbuild.PEER_SOURCES_ENV)
    archive.unlink()
    assert peerbuild.find_peers([pin]) == {"toy": built}
