"""Sampling profiles with py-spy, attached by pid for exactly the timed windows.

Each window writes collapsed stacks ("frame;frame;frame count" lines); :func:`merge` sums the
windows into one file, and :func:`top` lists the frames with the largest inclusive share.
:func:`summary` groups one file's samples by function and by module group (self: the sampled
frame; inclusive: anywhere on the stack), and ``python -m bench.profile FILE [FILE...]`` prints
it, side by side when given the controller's and the raw loop's.
"""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.abc

from bench.controller_proc import stop_process

__all__ = ["GROUPS", "PySpy", "Summary", "group_of", "merge", "render", "summary", "top"]

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


#: Module groups, first match wins: (name, prefixes of the frame's file as py-spy shows it).
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ungater._kube", ("ungater/_kube/",)),
    ("ungater._model", ("ungater/_model/",)),
    ("ungater._decide", ("ungater/_decide/",)),
    ("ungater._controller", ("ungater/_controller/",)),
    ("ungater._observe", ("ungater/_observe/",)),
    ("ungater (other)", ("ungater/", "ungater_plugins/")),
    ("bench", ("bench/",)),
    ("json", ("json/",)),
    ("orjson", ("orjson",)),
    ("kubernetes_asyncio", ("kubernetes_asyncio/",)),
    (
        "aiohttp/yarl/multidict",
        ("aiohttp/", "yarl/", "multidict/", "propcache/", "aiohappyeyeballs/"),
    ),
    ("ssl", ("ssl.py",)),
    ("logging", ("logging/",)),
    ("prometheus_client", ("prometheus_client/",)),
    ("anyio", ("anyio/",)),
    ("asyncio", ("asyncio/",)),
    # the event loop waiting in epoll, a thread waiting for work: py-spy samples a process that
    # is runnable as active, so these are mostly not CPU
    ("waiting (selectors, threading)", ("selectors.py", "threading.py", "queue.py")),
)

_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")


def _split(frame: str) -> tuple[str, str]:
    """``func (file:line)`` -> (func, file); a frame of another shape is its own function."""
    m = _FRAME.match(frame)
    return (m["func"], m["file"]) if m else (frame, "")


def group_of(file: str) -> str:
    """The module group of a frame's file (``GROUPS``), else "other"."""
    for name, prefixes in GROUPS:
        if any(file.startswith(p) or f"/{p}" in file for p in prefixes):
            return name
    return "other"


@dataclass
class Summary:
    """One profile's samples: in total, and by function and module group, self and inclusive."""

    total: int = 0
    self_fn: Counter[str] = field(default_factory=Counter)
    incl_fn: Counter[str] = field(default_factory=Counter)
    self_group: Counter[str] = field(default_factory=Counter)
    incl_group: Counter[str] = field(default_factory=Counter)
    #: by what the event loop was running: the task's coroutine (the frame under anyio's
    #: task runner), else the loop callback (under ``Handle._run``), else the loop itself
    by_task: Counter[str] = field(default_factory=Counter)


def _stacks(path: Path) -> Iterator[tuple[list[str], int]]:
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            yield stack.split(";"), int(count)


_TASK_RUNNERS = ("TaskHandle._run_coro (", "Task.__step (", "Handle._run (")
_WAITING = "waiting (selectors, threading)"


def _task_of(fns: list[str], leaf_group: str) -> str:
    """What the loop was running in one stack: the frame under the innermost task runner
    (anyio's or asyncio's task step, else a loop callback), the waiting loop, or "other"."""
    for i in range(len(fns) - 1, -1, -1):
        if fns[i].startswith(_TASK_RUNNERS) and i + 1 < len(fns):
            return fns[i + 1]
    return "(waiting)" if leaf_group == _WAITING else "(other)"


def summary(path: Path) -> Summary:
    """Samples by function (``func (file)``, lines merged) and by module group: self counts the
    sampled (innermost) frame, inclusive counts each function or group once per stack."""
    out = Summary()
    for frames, n in _stacks(path):
        out.total += n
        fns = []
        groups = []
        for frame in frames:
            func, file = _split(frame)
            fns.append(f"{func} ({file})" if file else func)
            groups.append(group_of(file))
        out.self_fn[fns[-1]] += n
        out.self_group[groups[-1]] += n
        out.by_task[_task_of(fns, groups[-1])] += n
        for fn in set(fns):
            out.incl_fn[fn] += n
        for g in set(groups):
            out.incl_group[g] += n
    return out


def _pct(n: int, total: int) -> str:
    return f"{100 * n / total:5.1f}%" if total else "    -"


def render(named: dict[str, Summary], rows: int = 15) -> str:
    """Markdown tables: groups (self and inclusive share of each profile's samples), then each
    profile's top functions by self and by inclusive samples."""
    names = list(named)
    lines = [
        "| group | " + " | ".join(f"{n} self | {n} incl." for n in names) + " |",
        "|---|" + "---:|---:|" * len(names),
    ]
    groups = Counter[str]()
    for s in named.values():
        for g, c in s.self_group.items():
            groups[g] += c
        for g, c in s.incl_group.items():
            groups[g] += c
    for g, _ in groups.most_common():
        cells = [
            f"{_pct(s.self_group[g], s.total)} | {_pct(s.incl_group[g], s.total)}"
            for s in named.values()
        ]
        lines.append(f"| {g} | " + " | ".join(cells) + " |")
    lines.append("| (samples) | " + " | ".join(f"{s.total} | " for s in named.values()) + " |")
    for name, s in named.items():
        # the frames under every stack (the process's main, the event loop) say nothing
        roots = {fn for fn, c in s.incl_fn.items() if c >= 0.8 * s.total}
        inclusive = Counter({fn: c for fn, c in s.incl_fn.items() if fn not in roots})
        for title, counter in (
            ("what the loop ran (task or callback)", s.by_task),
            ("self samples", s.self_fn),
            ("inclusive samples (the frames under 80% or more of the stacks left out)", inclusive),
        ):
            lines += ["", f"{name}, top functions by {title}:", ""]
            lines += ["| function | samples | share |", "|---|---:|---:|"]
            for fn, c in counter.most_common(rows):
                lines.append(f"| `{fn}` | {c} | {_pct(c, s.total).strip()} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.profile",
        description="summarize py-spy collapsed stacks (a run's profile-<who>-<label>.txt)",
    )
    p.add_argument("files", nargs="+", type=Path, help="NAME=FILE or FILE")
    p.add_argument("--rows", type=int, default=15, help="functions listed per table")
    args = p.parse_args(argv)
    named: dict[str, Summary] = {}
    for spec in args.files:
        name, _, file = str(spec).rpartition("=")
        named[name or Path(file).stem] = summary(Path(file))
    print(render(named, args.rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
