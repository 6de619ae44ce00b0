"""What the numbers were measured on: CPU, memory, load, Python, Kubernetes and the commit."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

__all__ = ["load_average", "machine_info"]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return 0.0


def _git(*args: str) -> str:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip()


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def machine_info(kubernetes_version: str) -> dict[str, Any]:
    return {
        "nproc": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "mem_total_gib": _mem_total_gib(),
        "python": platform.python_version(),
        "kubernetes": kubernetes_version,
        "platform": platform.platform(),
        "commit": _git("rev-parse", "--short", "HEAD"),
        "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
    }
