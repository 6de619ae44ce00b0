"""`ungater run` as a user runs it: a separate process on a kubeconfig, stopped by SIGTERM;
`ungater explain` on the same cluster."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.integration.jobs import make_job, released_indexes
from tests.integration.k8s import Kube
from tests.integration.support import admit, create_workload
from tests.polling import equals, eventually

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


async def test_run_releases_and_exits_zero_on_sigterm(
    kube: Kube, kube_namespace: str, control_plane: Any, tmp_path: Path
) -> None:
    ns = kube_namespace
    config = tmp_path / "ungater.yaml"
    config.write_text(
        f"namespaces: [{ns}]\nlogging: {{format: json}}\nserver: {{address: '127.0.0.1:0'}}\n"
        f"leaderElection: {{namespace: {ns}}}\n"
        "mode: release\n"  # no Kueue releases here: the test plays it
    )
    job, sel = await make_job(kube, ns, "cli", 3)
    await create_workload(kube, job, "job-cli-a", {"main": 3})
    await admit(kube, ns, "job-cli-a", {"main": 2})
    log = tmp_path / "ungater.log"
    with log.open("w") as out:
        proc = subprocess.Popen(  # noqa: ASYNC220 (Popen does not block)
            [
                sys.executable,
                "-m",
                "ungater",
                "run",
                "--kubeconfig",
                str(control_plane.kubeconfig_path),
                "--config",
                str(config),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        await eventually(
            lambda: equals(released_indexes(kube, ns, sel), [0, 1]),
            timeout=30,
            what=f"release by the ungater process (log: {log})",
        )
        proc.send_signal(signal.SIGTERM)
        code = await anyio.to_thread.run_sync(lambda: proc.wait(timeout=20))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    text = log.read_text()
    assert code == 0, text
    assert '"msg": "received SIGTERM, shutting down"' in text
    assert '"msg": "stopped"' in text

    explain = await anyio.to_thread.run_sync(
        lambda: subprocess.run(
            [
                sys.executable,
                "-m",
                "ungater",
                "explain",
                f"{ns}/job-cli-a",
                "--kubeconfig",
                str(control_plane.kubeconfig_path),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    )
    assert explain.returncode == 0, explain.stderr
    assert "pod set main: cap 2 (spec 3, admitted 2, owner 3), released 2" in explain.stdout
    assert "cap reached (2 of 2 released)" in explain.stdout
    assert "* job-cli-a" in explain.stdout  # the active slice is marked


async def test_explain_unknown_workload_is_one_line(
    control_plane: Any, kube_namespace: str
) -> None:
    proc = await anyio.to_thread.run_sync(
        lambda: subprocess.run(
            [
                sys.executable,
                "-m",
                "ungater",
                "explain",
                f"{kube_namespace}/nope",
                "--kubeconfig",
                str(control_plane.kubeconfig_path),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    )
    assert proc.returncode == 1
    assert proc.stderr.strip() == f"ungater: error: workload {kube_namespace}/nope not found"
