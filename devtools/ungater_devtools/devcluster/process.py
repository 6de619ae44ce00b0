"""Processes of the dev cluster: how one is recorded, stopped by pid, tied to this process's
life, and how the state directories of dead runs are swept.  Nothing here knows which program
runs; the plane and the peers both spawn through it."""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "OWNER_FILE",
    "TEMP_PREFIX",
    "ControlPlaneStartError",
    "ProcessInfo",
    "parent_death_signal",
    "sweep_stale_temp_dirs",
    "tail",
    "terminate_pid",
]

STOP_GRACE_S = 10.0
KILL_WAIT_S = 5.0
_PR_SET_PDEATHSIG = 1
TEMP_PREFIX = "ungater-cp-"
OWNER_FILE = "owner.pid"
_SWEEP_MIN_AGE_S = 300.0


class ControlPlaneStartError(RuntimeError):
    """A control-plane process did not become healthy in time, or exited."""


@dataclass
class ProcessInfo:
    """One control-plane process: what it is, its pid and its log file."""

    name: str
    args: list[str]
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def parent_death_signal() -> Callable[[], None] | None:
    """A preexec hook making a child receive SIGKILL when this process dies (Linux only).

    SIGKILL rather than SIGTERM: a kube-apiserver whose etcd is going away at the same time
    can spend minutes in graceful shutdown.  Only safe when the spawning thread lives as long
    as the process, i.e. the main thread: the kernel signals when the *thread* that forked exits.
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

    return hook


def terminate_pid(pid: int, *, grace: float = STOP_GRACE_S, popen: Any = None) -> None:
    """SIGTERM ``pid``, wait up to ``grace`` seconds, then SIGKILL and wait briefly."""

    def gone() -> bool:
        if popen is not None:
            return popen.poll() is not None
        try:
            waited, _ = os.waitpid(pid, os.WNOHANG)
            if waited == pid:
                return True
        except ChildProcessError:
            pass
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return _is_zombie(pid)

    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, KILL_WAIT_S)):
        if gone():
            return
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if gone():
                return
            time.sleep(0.05)


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"


def sweep_stale_temp_dirs() -> None:
    """Remove temporary state dirs whose owning Python process is gone (e.g. was SIGKILLed).

    The control-plane processes of such a dir already got SIGKILL from the kernel (see
    :func:`parent_death_signal`); only the files are left behind.  Directories touched in
    the last few minutes are left alone, in case a process is still on its way out.
    """
    root = Path(tempfile.gettempdir())
    now = time.time()
    for candidate in root.glob(f"{TEMP_PREFIX}*"):
        try:
            owner = int((candidate / OWNER_FILE).read_text().strip())
            if now - candidate.stat().st_mtime < _SWEEP_MIN_AGE_S:
                continue
        except (OSError, ValueError):
            continue
        try:
            os.kill(owner, 0)
        except ProcessLookupError:
            shutil.rmtree(candidate, ignore_errors=True)
        except PermissionError:
            continue
