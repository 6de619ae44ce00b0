"""Sampling profiles with py-spy, attached by pid for exactly the timed windows.

Each window writes collapsed stacks ("frame;frame;frame count" lines); :func:`merge` sums the
windows into one file, and :func:`top` lists the frames with the largest inclusive share.
"""

from __future__ import annotations

import signal
import subprocess
from collections import Counter
from pathlib import Path

import anyio
import anyio.abc

from bench.controller_proc import stop_process

__all__ = ["PySpy", "merge", "top"]

_ATTACH_S = 0.5  # py-spy needs a moment to attach before the window starts


class PySpy:
    def __init__(self, py_spy: str, out: Path, rate: int = 100) -> None:
        self.py_spy = py_spy
        self.out = out
        self.rate = rate
        self.windows: list[Path] = []
        self._proc: anyio.abc.Process | None = None

    async def start(self, pid: int) -> None:
        path = self.out.with_suffix(f".{len(self.windows)}.txt")
        self.windows.append(path)
        args = [self.py_spy, "record", "--pid", str(pid), "-r", str(self.rate), "-f", "raw"]
        self._proc = await anyio.open_process(
            [*args, "-o", str(path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        await anyio.sleep(_ATTACH_S)

    async def stop(self) -> None:
        """SIGINT makes py-spy write its file and exit."""
        proc, self._proc = self._proc, None
        if proc is not None:
            await stop_process(proc, signal.SIGINT)

    def finish(self) -> Path:
        """Merge the windows into ``out``, remove them, and return ``out``."""
        merge(self.windows, self.out)
        for w in self.windows:
            w.unlink(missing_ok=True)
        return self.out


def merge(paths: list[Path], out: Path) -> None:
    counts: Counter[str] = Counter()
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            stack, _, n = line.rpartition(" ")
            if stack and n.isdigit():
                counts[stack] += int(n)
    out.write_text("".join(f"{s} {n}\n" for s, n in counts.most_common()))


def top(path: Path, n: int = 25) -> list[tuple[str, float]]:
    """Frames by inclusive share of all samples (each frame counted once per stack)."""
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        total += int(count)
        for frame in set(stack.split(";")):
            inclusive[frame] += int(count)
    return [(f, c / total) for f, c in inclusive.most_common(n)] if total else []
