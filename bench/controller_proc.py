"""The controller as a user runs it: ``python -m ungater.cli run --kubeconfig K --config C``.

The harness writes the config file, starts the process, timestamps every line it logs (so
"caches synced" gives the time to sync), reads its memory from ``/proc/PID/status`` and stops
it with SIGTERM by pid (SIGKILL after a grace period). Optionally ``py-spy record`` attaches to
it for a profile.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import yaml
from anyio.streams.buffered import BufferedByteReceiveStream

__all__ = ["ControllerProcess", "controller_config", "memory_mb", "stop_process"]

_SYNCED = "caches synced"
_STOP_GRACE_S = 15.0
_MAX_LINE = 1 << 20


def controller_config(namespace: str, raised: bool) -> dict[str, Any]:
    """The config file: one namespace, batch/v1 Job only; ``raised`` lifts the client limits."""
    config: dict[str, Any] = {
        "namespaces": [namespace],
        "kinds": [{"group": "batch", "kind": "Job"}],
    }
    if raised:
        config["client"] = {"qps": 100000, "burst": 100000}
    return config


def memory_mb(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (peak RSS) of ``pid`` in MB (10^6 bytes)."""
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024 / 1e6
    return out


async def stop_process(proc: anyio.abc.Process, sig: int = signal.SIGTERM) -> int | None:
    """Signal ``proc`` by pid, wait up to a grace period, then SIGKILL; its exit code."""
    with anyio.CancelScope(shield=True):
        if proc.returncode is None:
            proc.send_signal(sig)
            with anyio.move_on_after(_STOP_GRACE_S):
                return await proc.wait()
            proc.kill()
            with anyio.move_on_after(5):
                await proc.wait()
        return proc.returncode


class ControllerProcess:
    def __init__(self, kubeconfig: Path, config: dict[str, Any], workdir: Path, label: str) -> None:
        self.kubeconfig = kubeconfig
        self.config = config
        self.label = label
        self.config_path = workdir / f"ungater-{label}.yaml"
        self.log_path = workdir / f"controller-{label}.log"
        self.proc: anyio.abc.Process | None = None
        self.started_at = 0.0
        self.synced_at = 0.0
        self.lines: list[tuple[float, str]] = []
        self._synced = anyio.Event()
        self._profiler: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def sync_seconds(self) -> float:
        return self.synced_at - self.started_at

    def count(self, needle: str) -> int:
        return sum(1 for _, line in self.lines if needle in line)

    async def start(self, tg: anyio.abc.TaskGroup, timeout: float = 120.0) -> None:
        """Start the process, read its log in ``tg`` and wait for "caches synced"."""
        self.config_path.write_text(yaml.safe_dump(self.config, sort_keys=False))
        args = [
            sys.executable,
            "-m",
            "ungater.cli",
            "run",
            "--kubeconfig",
            str(self.kubeconfig),
            "--config",
            str(self.config_path),
        ]
        self.started_at = time.monotonic()
        self.proc = await anyio.open_process(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        tg.start_soon(self._read_log, self.proc)
        try:
            with anyio.fail_after(timeout):
                await self._synced.wait()
        except TimeoutError:
            await self.stop()
            raise RuntimeError(
                f"controller {self.label} did not sync; see {self.log_path}"
            ) from None

    async def _read_log(self, proc: anyio.abc.Process) -> None:
        assert proc.stderr is not None
        stream = BufferedByteReceiveStream(proc.stderr)
        with self.log_path.open("w") as log:
            while True:
                try:
                    raw = await stream.receive_until(b"\n", _MAX_LINE)
                except (anyio.EndOfStream, anyio.IncompleteRead):
                    return
                now = time.monotonic()
                line = raw.decode(errors="replace")
                self.lines.append((now, line))
                log.write(f"{now - self.started_at:9.3f} {line}\n")
                if _SYNCED in line and not self._synced.is_set():
                    self.synced_at = now
                    self._synced.set()

    def memory(self) -> dict[str, float]:
        return memory_mb(self.pid)

    def profile(self, py_spy: str, out: Path, rate: int = 50) -> None:
        """Attach ``py-spy record`` (collapsed stacks, native frames off) to the controller."""
        args = [py_spy, "record", "--pid", str(self.pid), "-r", str(rate), "-f", "raw"]
        self._profiler = subprocess.Popen(
            [*args, "-o", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    async def stop_profile(self) -> None:
        """Stop py-spy with SIGINT, on which it writes its file."""
        profiler, self._profiler = self._profiler, None
        if profiler is not None and profiler.poll() is None:
            profiler.send_signal(signal.SIGINT)
            await anyio.to_thread.run_sync(profiler.wait, 30)

    async def stop(self) -> int | None:
        """SIGTERM (the controller's clean shutdown), then SIGKILL; the exit code."""
        await self.stop_profile()
        proc, self.proc = self.proc, None
        return None if proc is None else await stop_process(proc)
