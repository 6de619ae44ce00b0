"""What a user reads from `ungater run` started and stopped cleanly: the endpoints announced
once, no error, a SIGTERM answered with exit 0 and not one warning from then on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration


def _records(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


def _said(log: Path, start: str) -> bool:
    """A whole line (the last one may be half written) logged a message starting so."""
    lines = log.read_text().split("\n")[:-1]
    return any(line.startswith("{") and json.loads(line)["msg"].startswith(start) for line in lines)


def _renewed(control_plane: Any, ns: str) -> bool:
    """The Lease in ``ns`` has been renewed since it was acquired (the leader's periodic
    write, every ``retryPeriodSeconds``)."""
    status, body = control_plane.request(
        "GET", f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"
    )
    assert status == 200, body
    return any(
        lease["spec"].get("renewTime") not in (None, lease["spec"].get("acquireTime"))
        for lease in body["items"]
    )


def test_a_clean_run_announces_its_endpoints_once_and_stops_without_a_warning(
    control_plane: Any, kube_namespace: str, tmp_path: Path
) -> None:
    config = tmp_path / "ungater.yaml"
    config.write_text(
        f"namespaces: [{kube_namespace}]\nlogging: {{format: json}}\n"
        f"server: {{address: '127.0.0.1:0'}}\nleaderElection: {{namespace: {kube_namespace}}}\n"
    )
    log = tmp_path / "ungater.log"
    argv = [sys.executable, "-m", "ungater", "run", "--config", str(config)]
    argv += ["--kubeconfig", str(control_plane.kubeconfig_path)]
    with log.open("w") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            if any("serving" in r["msg"] and "/metrics" in r["msg"] for r in _records(log)):
                break
            time.sleep(0.2)
        assert proc.poll() is None, log.read_text()
        # settled: caches synced, leading, and the Lease renewed once (its periodic work ran)
        deadline = time.monotonic() + 30
        while not (
            _said(log, "caches synced")
            and _said(log, "leading (term 1)")
            and _renewed(control_plane, kube_namespace)
        ):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"not settled after 30 s:\n{log.read_text()}"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    text = log.read_text()
    records = _records(log)
    assert code == 0, text
    assert len([line for line in text.splitlines() if line.strip()]) == len(records), text
    serving = [r["msg"] for r in records if "/metrics" in r["msg"]]
    assert len(serving) == 1, serving
    # (a start beside no admission policy warns that the gate is not guarded: that is meant)
    signalled = [r["msg"] for r in records].index("received SIGTERM, shutting down")
    after = records[signalled:]
    assert [r["msg"] for r in after if r["level"] in {"warning", "error", "critical"}] == []
    assert not [r for r in records if r["level"] in {"error", "critical"}], text
    assert records[-1]["msg"] == "stopped", text
