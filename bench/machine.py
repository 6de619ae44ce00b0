"""What the numbers were measured on: CPU, memory, load, Python, Kubernetes and the commit."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

__all__ = ["CpuMeter", "control_plane_pids", "load_average", "machine_info", "run_span"]


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


def _controller_commit() -> str:
    """The commit the controller ran at: this tree's, or ``--controller-src``'s."""
    src = os.environ.get("UNGATER_BENCH_CONTROLLER_SRC")
    if not src:
        return _git("rev-parse", "--short", "HEAD")
    out = subprocess.run(
        ["git", "-C", src, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return f"{out.stdout.strip()} ({src})"


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run_span(
    started: float, load_before: list[float], ended: float, load_after: list[float]
) -> dict[str, Any]:
    """The ``meta`` fields of a whole run: when it started (wall clock), how long it took and
    the load average before and after it. Taken around everything ``python -m bench run`` does
    (control planes started, every scenario, the Kueue runs included), so a run that measured
    only the Kueue cases does not carry the span of the empty plain pass that made its meta."""
    return {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "duration_seconds": round(ended - started, 1),
        "load_average_before": load_before,
        "load_average_after": load_after,
    }


def machine_info(kubernetes_version: str) -> dict[str, Any]:
    return {
        "nproc": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "mem_total_gib": _mem_total_gib(),
        "python": platform.python_version(),
        "kubernetes": kubernetes_version,
        "platform": platform.platform(),
        "commit": _git("rev-parse", "--short", "HEAD"),
        "controller_commit": _controller_commit(),
        "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
    }


def _proc_cpu_seconds(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _machine_busy_seconds() -> float:
    """CPU seconds spent busy by the whole machine since boot (all cores; idle, iowait out)."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return (sum(values[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def control_plane_pids(apiserver_port: int) -> dict[str, int]:
    """The local control plane's processes, found by the API server's port (LocalControlPlane
    layout: etcd data and the controller manager's kubeconfig sit in the same state dir)."""
    procs = {
        int(p.name): _cmdline(int(p.name)) for p in Path("/proc").iterdir() if p.name.isdigit()
    }
    found: dict[str, int] = {}
    state = ""
    for pid, argv in procs.items():
        if f"--secure-port={apiserver_port}" in argv and "kube-apiserver" in argv[0]:
            found["kube-apiserver"] = pid
            cert = next((a for a in argv if a.startswith("--cert-dir=")), "")
            state = str(Path(cert.partition("=")[2]).parent) if cert else ""
    if state:
        for pid, argv in procs.items():
            if f"--data-dir={state}/etcd" in argv:
                found["etcd"] = pid
            elif f"--kubeconfig={state}/kube-controller-manager.kubeconfig" in argv:
                found["kube-controller-manager"] = pid
    return found


class CpuMeter:
    """CPU seconds used by named processes, and by the whole machine, over an interval."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = dict(pids)
        self._start: dict[str, float] = {}
        self._t0 = 0.0

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._start = {n: _proc_cpu_seconds(p) or 0.0 for n, p in self.pids.items()}
        self._start["machine"] = _machine_busy_seconds()

    def stop(self) -> dict[str, float]:
        """Cores used on average over the interval, per process, by the machine and the rest."""
        wall = max(time.monotonic() - self._t0, 1e-9)
        out: dict[str, float] = {}
        for name, pid in self.pids.items():
            now = _proc_cpu_seconds(pid)
            if now is not None:
                out[name] = round((now - self._start[name]) / wall, 3)
        out["machine"] = round((_machine_busy_seconds() - self._start["machine"]) / wall, 3)
        out["others"] = round(out["machine"] - sum(v for k, v in out.items() if k != "machine"), 3)
        out["wall_seconds"] = round(wall, 3)
        return out
