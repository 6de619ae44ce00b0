"""Builds ``rulecheck`` (``main.go`` here) from the Prometheus Go module into the tools cache.

The program parses Prometheus rule files exactly as Prometheus loads them; the tests run it on
the chart's PrometheusRule and on the dashboard's queries. The binary is keyed by the Prometheus
version and the hash of ``main.go``, so an edit rebuilds it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

from ungater.devcluster.build import ControlPlaneUnavailable, file_lock
from ungater.devcluster.helm import tools_root

__all__ = ["PROMETHEUS_MODULE", "PROMETHEUS_VERSION", "ensure_rulecheck"]

PROMETHEUS_MODULE = "github.com/prometheus/prometheus"
PROMETHEUS_VERSION = "v0.316.0"
SOURCE = Path(__file__).with_name("rulecheck") / "main.go"
_TIMEOUT_S = 30 * 60


def _key() -> str:
    return hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]


def ensure_rulecheck() -> Path:
    directory = tools_root() / f"rulecheck-prometheus-{PROMETHEUS_VERSION}"
    binary = directory / "rulecheck"
    stamp = directory / "stamp.json"

    def complete() -> bool:
        try:
            return json.loads(stamp.read_text()).get("source") == _key() and binary.is_file()
        except (OSError, ValueError):
            return False

    if complete():
        return binary
    go = os.environ.get("UNGATER_GO") or shutil.which("go")
    if not go:
        raise ControlPlaneUnavailable("the Go toolchain is needed to build rulecheck")
    directory.mkdir(parents=True, exist_ok=True)
    with file_lock(directory / "build.lock", lambda _: None):
        if complete():
            return binary
        src = directory / "src"
        src.mkdir(exist_ok=True)
        shutil.copyfile(SOURCE, src / "main.go")
        (src / "go.mod").write_text(
            "// written by tests/tools/rulecheck.py; lives in the tools cache only\n"
            "module ungater.invalid/rulecheck\n\ngo 1.26.7\n\n"
            f"require {PROMETHEUS_MODULE} {PROMETHEUS_VERSION}\n"
        )
        env = {**os.environ, "CGO_ENABLED": "0", "GOTOOLCHAIN": "local", "GOWORK": "off"}
        log = directory / "build.log"
        with log.open("w") as out:
            for cmd in (
                [go, "mod", "tidy"],
                [go, "build", "-p", "2", "-trimpath", "-o", str(binary), "."],
            ):
                proc = subprocess.run(
                    cmd, cwd=src, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=_TIMEOUT_S
                )
                if proc.returncode != 0:
                    raise ControlPlaneUnavailable(
                        f"`{' '.join(cmd)}` failed (log: {log}):\n{log.read_text()[-3000:]}"
                    )
        stamp.write_text(json.dumps({"source": _key(), "prometheus": PROMETHEUS_VERSION}) + "\n")
    return binary
