"""The controller as a user runs it: ``python -m ungater run --kubeconfig K --config C``.

The harness writes the config file, starts the process, timestamps every line it logs ("caches
synced", "leading"), polls its ``/readyz``, reads its memory from ``/proc/PID/status`` and stops
it with SIGTERM by pid (SIGKILL after a grace period).
"""

from __future__ import annotations

import os
import re
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
_LEADING = "leading (term"
_SERVING = re.compile(r"serving /metrics, /healthz, /readyz on (http://\S+)")
_READYZ_POLL_S = 0.02
_STOP_GRACE_S = 15.0
_MAX_LINE = 1 << 20


#: A source tree whose ``ungater`` package the controller runs instead of the installed one
#: (``python -m bench run --controller-src DIR``): another design measured by the same harness.
CONTROLLER_SRC = "UNGATER_BENCH_CONTROLLER_SRC"


def controller_env() -> dict[str, str]:
    """The controller's environment: this one, with ``--controller-src`` first on the path."""
    env = dict(os.environ)
    src = env.get(CONTROLLER_SRC)
    if src:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    return env


def controller_config(namespace: str, raised: bool, workers: int | None = None) -> dict[str, Any]:
    """The config file: one namespace, batch/v1 Job only; ``raised`` lifts the client limits,
    ``workers`` (when given) replaces the default number of reconcile workers.

    Two settings differ from a user's for the shared machine only: the probe server listens on
    a free loopback port (not ``:8080``), and the Lease has its own name, so a stale Lease of
    another run or test never delays the start. And ``mode: release``: the bench plays Kueue,
    so no other releaser is there and no admission policy is needed.
    """
    config: dict[str, Any] = {
        "namespaces": [namespace],
        "mode": "release",
        "kinds": [{"group": "batch", "kind": "Job"}],
        "server": {"address": "127.0.0.1:0"},
        "leaderElection": {"leaseName": "ungater-bench"},
    }
    if raised:
        config["client"] = {"qps": 100000, "burst": 100000}
    if workers is not None:
        config["workers"] = workers
    return config


def memory_mb(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (peak RSS) of ``pid`` in MB (10^6 bytes)."""
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024 / 1e6
    return out


async def stop_process(proc: anyio.abc.Process, sig: signal.Signals = signal.SIGTERM) -> int | None:
    """Signal ``proc`` by pid, wait up to a grace period, then SIGKILL; its exit code."""
    with anyio.CancelScope(shield=True):
        if proc.returncode is None:
            proc.send_signal(sig)
            with anyio.move_on_after(_STOP_GRACE_S) as waited:
                await proc.wait()
            if waited.cancelled_caught:
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
        self.leading_at = 0.0
        self.ready_at = 0.0
        self.url = ""
        self.lines: list[tuple[float, str]] = []
        self._synced = anyio.Event()
        self._leading = anyio.Event()
        self._serving = anyio.Event()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def sync_seconds(self) -> float:
        """From process start to the "caches synced" log line."""
        return self.synced_at - self.started_at

    @property
    def ready_seconds(self) -> float:
        """From process start to the first 200 from ``/readyz``."""
        return self.ready_at - self.started_at

    def count(self, needle: str) -> int:
        return sum(1 for _, line in self.lines if needle in line)

    async def start(self, tg: anyio.abc.TaskGroup, timeout: float = 120.0) -> None:
        """Start the process, read its log in ``tg``; wait until it is ready and leading."""
        self.config_path.write_text(yaml.safe_dump(self.config, sort_keys=False))
        args = [
            sys.executable,
            "-m",
            "ungater",
            "run",
            "--kubeconfig",
            str(self.kubeconfig),
            "--config",
            str(self.config_path),
        ]
        self.started_at = time.monotonic()
        self.proc = await anyio.open_process(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=controller_env(),
        )
        tg.start_soon(self._read_log, self.proc)
        try:
            with anyio.fail_after(timeout):
                await self._serving.wait()
                await self._poll_readyz()
                await self._synced.wait()
                await self._leading.wait()
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
                elif _LEADING in line and not self._leading.is_set():
                    self.leading_at = now
                    self._leading.set()
                elif (m := _SERVING.search(line)) and not self._serving.is_set():
                    self.url = m.group(1)
                    self._serving.set()

    async def _poll_readyz(self) -> None:
        """Poll ``/readyz`` until it answers 200 (the caller bounds the time)."""
        import aiohttp

        async with aiohttp.ClientSession() as session:
            while True:
                try:
                    async with session.get(f"{self.url}/readyz") as resp:
                        if resp.status == 200:
                            self.ready_at = time.monotonic()
                            return
                except aiohttp.ClientError:
                    pass
                await anyio.sleep(_READYZ_POLL_S)

    def memory(self) -> dict[str, float]:
        return memory_mb(self.pid)

    async def stop(self) -> int | None:
        """SIGTERM (the controller's clean shutdown), then SIGKILL; the exit code."""
        proc, self.proc = self.proc, None
        return None if proc is None else await stop_process(proc)
