"""The controller's audit as the tests read it: what its auditor reported and when (spied on in
place), and ``ungater audit --json`` run once as an operator runs it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ungater._decide.findings import Finding


class Reports:
    """What the controller's auditor reported (counted, logged, announced), and when."""

    def __init__(self, auditor: Any) -> None:
        self.seen: list[tuple[float, Finding]] = []
        report = auditor._report

        def spy(f: Finding, wl: Any, version: str) -> None:
            self.seen.append((time.monotonic(), f))
            report(f, wl, version)

        setattr(auditor, "_report", spy)  # noqa: B010

    def of(self, finding: str) -> list[tuple[float, Finding]]:
        return [(t, f) for t, f in self.seen if f.finding == finding]


def one_shot(kubeconfig: Path, config_file: Path, ns: str) -> dict[str, Any]:
    """``ungater audit --json`` as an operator runs it."""
    cmd = [sys.executable, "-m", "ungater", "audit", "-n", ns, "--json"]
    cmd += ["--config", str(config_file), "--kubeconfig", str(kubeconfig)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode in (0, 3), proc.stdout + proc.stderr
    report: dict[str, Any] = json.loads(proc.stdout)
    assert (proc.returncode == 3) == any(f["severity"] == "warning" for f in report["findings"])
    return report
