"""Every figure in the docs, and what backs it: ``docs/figures.txt`` (``python -m bench figures``).

A figure is a number in the prose of README.md, docs/*.md or docs/plugins/*.md (outside code
blocks, inline code, HTML comments, link targets and the tables ``python -m bench report``
generates) that is followed by a unit (``ms``, ``s``, ``min``, ``MB``, ``KB``, ``%``, ``/s``,
``CPU-s``, a ratio's ``x``, ``cores``), by a count's noun (``tests``, ``passed``, ``failed``,
``seeds``, ``mutants``, ...), by ``of N`` or ``/ N``, or that has a decimal point. A number after
a comparison (``< 0.3 s``) is a goal, not a figure.

``docs/figures.txt`` lists, page by page and in page order, every figure and what backs it:

- ``bench EXPR``: a measurement, computed from a committed result file under
  ``bench/results/`` by ``EXPR`` (Python over :data:`HELPERS`, in the figure's own unit);
- ``timing KEY``: a CI or build timing, from the committed record ``bench/results/timings.json``
  (which names the machine), in seconds;
- ``code MODULE:EXPR``: a setting, equal to ``EXPR`` evaluated in ``MODULE`` (a default);
- ``setting WHY``: a number the docs choose or the code is given (a test's parameter, a size
  the harness uses, a version), not a measurement.

A figure backed by ``bench``, ``timing`` or ``code`` must equal its source to the precision it
is printed with (``55 ms`` holds for 54.5 to 55.5 ms). The lists must match exactly, so a
figure changed, added or removed in a page without its line here fails
tests/unit/docs/test_doc_figures.py, and so does a source that no longer gives the figure.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import importlib
import json
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.doc_report import report_rows

__all__ = [
    "HELPERS",
    "LEDGER",
    "Entry",
    "Figure",
    "add_parser",
    "command",
    "figures",
    "pages",
    "problems",
    "read_ledger",
    "skeleton",
]

ROOT = Path(__file__).resolve().parents[1]
LEDGER = "docs/figures.txt"
RESULTS = "bench/results"
TIMINGS = "bench/results/timings.json"

_UNIT = (
    r"(?:ns|µs|us|ms|s|min|h|[KkMG]i?B|B|CPU-s|pods/s|/s|(?:second|minute|hour|day)s?)(?![\w/%-])"
)
_COUNT = r"(?:tests?|passed|failed|pass|fail|seeds?|mutants?|states|runs|repeats)\b"
_ONE = r"\d+(?:,\d{3})*(?:\.\d+)?"
# one number, or a range or pair sharing the unit that follows: 14-20 s (a hyphen or an en
# dash), 69 to 156 ms, 76 and 82 ms
_NUMBER = rf"(?<![\w.])(?P<number>{_ONE}(?:(?:\s(?:to|and)\s|[-\u2013]){_ONE})?)"
_FIGURE = re.compile(
    _NUMBER + r"(?:"
    rf"\s?{_UNIT}"
    r"|\s?%"
    r"|x\b"
    r"|\s(?P<cores>cores?)\b"
    rf"|\s{_COUNT}"
    r"|\s(?:of|/)\s(?:the\s(?:first\s)?)?\d+(?!\w|\.\d)"
    r"|(?<=\.\d)(?![\d.]\d|\w)"  # a bare decimal (a ratio, a load, a share of the cores)
    r"|(?<=\.\d\d)(?![\d.]\d|\w)"
    r"|(?<=\.\d\d\d)(?![\d.]\d|\w)"
    r")"
)
_GOAL = ("<", ">", "≤", "≥", "<=", ">=")
_MASK = re.compile(r"`[^`]*`|<!--.*?-->|\]\([^)]*\)|https?://\S+")
_BEGIN = re.compile(r"^<!-- bench report .*-->$")
_END = "<!-- end bench report -->"


@dataclass(frozen=True)
class Figure:
    """One figure of a page: its text, the line it is on and where on the line it starts."""

    text: str
    line: int
    column: int = 0


@dataclass(frozen=True)
class Entry:
    """One line of the ledger: the figure's text, its kind and the kind's argument."""

    text: str
    kind: str
    arg: str
    line: int


def pages(root: Path = ROOT) -> list[str]:
    """The pages whose figures the ledger lists."""
    found = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    found += sorted((root / "docs" / "plugins").glob("*.md"))
    return [str(p.relative_to(root)) for p in found]


def figures(text: str) -> list[Figure]:
    """The figures of a page, in order."""
    out: list[Figure] = []
    in_code = generated = False
    for no, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if generated:
            generated = stripped != _END
            continue
        if stripped.startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            continue
        if _BEGIN.match(stripped):
            generated = True
            continue
        prose = _MASK.sub(lambda m: " " * len(m[0]), line)
        for m in _FIGURE.finditer(prose):
            if prose[: m.start()].rstrip().endswith(_GOAL) and not prose[
                : m.start()
            ].rstrip().endswith("->"):
                continue
            if m["cores"] and "." not in m["number"]:
                continue  # the machine's cores, not a share of them
            out.append(Figure(m[0], no, m.start()))
    return out


def read_ledger(text: str) -> dict[str, list[Entry]]:
    """The ledger's entries per page (``[PAGE]`` opens a page; ``#`` starts a comment)."""
    out: dict[str, list[Entry]] = {}
    page: list[Entry] | None = None
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            page = out.setdefault(line[1:-1], [])
            continue
        if page is None or " | " not in line:
            raise ValueError(f"{LEDGER}:{no}: not `FIGURE | KIND ARG` under a [PAGE]: {raw}")
        figure, _, source = line.partition(" | ")
        kind, _, arg = source.strip().partition(" ")
        page.append(Entry(figure.strip(), kind, arg.strip(), no))
    return out


# The helpers a ``bench`` expression may use, on the committed result files.


@functools.cache
def _result(name: str) -> dict[str, Any]:
    return json.loads((ROOT / RESULTS / f"{name}.json").read_text())


def j(name: str, path: str) -> Any:
    """The value at ``path`` (dot-separated keys, list indexes as numbers) in result ``name``."""
    value: Any = _result(name)
    for key in path.split("."):
        value = value[int(key)] if isinstance(value, list) else value[key]
    return value


def cell(name: str, metric: str, col: str = "median", config: str | None = None) -> float:
    """A cell of ``python -m bench report`` for result ``name``: the row whose metric is
    ``metric`` (and config ``config``), in the row's unit (seconds for a time)."""
    rows = [
        r
        for r in report_rows(_result(name))
        if r["metric"] == metric and (config is None or r.get("config") == config)
    ]
    if len(rows) != 1:
        raise KeyError(f"{name}: {len(rows)} rows named {metric!r} (config {config!r})")
    return float(rows[0][col])


def ms(name: str, metric: str, col: str = "median", config: str | None = None) -> float:
    """:func:`cell` of a time, in milliseconds."""
    return 1000 * cell(name, metric, col, config)


def span(name: str, case: str, point: str) -> float:
    """The median span (ms) of ungater's waves to ``point`` in ``case`` (``--trace`` runs)."""
    return float(j(name, f"metrics.kueue.spans.{case}.{point}.median_ms"))


def samples(name: str, case: str, who: str) -> list[float]:
    """The samples (s) of one releaser in one case of a Kueue run."""
    return [float(s) for s in j(name, f"metrics.kueue.cases.{case}.{who}.samples")]


#: Kueue's two paths on a scale-up: its slow one waits for its one-second pod-event batch.
SLOW_PATH_S = 0.5


def slow(name: str, case: str) -> list[float]:
    """Kueue's samples (s) in ``case`` that took its slow path (its pod-event batch)."""
    return [s for s in samples(name, case, "kueue") if s >= SLOW_PATH_S]


def fast(name: str, case: str) -> list[float]:
    """Kueue's samples (s) in ``case`` released by the admission's own reconcile."""
    return [s for s in samples(name, case, "kueue") if s < SLOW_PATH_S]


def met(name: str, ratio: str) -> tuple[int, int]:
    """How many cases of a Kueue run met their goal at ``ratio`` (``ratio Kueue/ungater``: the
    median, ``ratio at p95``), and of how many, from the report's verdicts."""
    rows = [r for r in report_rows(_result(name), "kueue/headline") if r["metric"].endswith(ratio)]
    return sum(r["status"] == "pass" for r in rows), len(rows)


def timing(key: str, root: Path = ROOT) -> float:
    """A timing (s) of the committed record."""
    return float(json.loads((root / TIMINGS).read_text())["timings"][key]["seconds"])


HELPERS: dict[str, Callable[..., Any]] = {
    "j": j,
    "cell": cell,
    "ms": ms,
    "span": span,
    "samples": samples,
    "slow": slow,
    "fast": fast,
    "met": met,
    "min": min,
    "max": max,
    "len": len,
    "sum": sum,
    "sorted": sorted,
    "range": range,
    "abs": abs,
}


def _numbers(text: str) -> list[tuple[float, float]]:
    """The numbers of a figure (one, or two for a range, a pair or ``N of M``), each with half
    a unit of its last printed digit: the tolerance of its rounding."""
    out = []
    for m in re.finditer(r"\d+(?:,\d{3})*(?:\.(\d+))?", text):
        out.append((float(m[0].replace(",", "")), 0.5 * 10 ** -len(m[1] or "")))
    return out


def value(entry: Entry, root: Path = ROOT) -> list[float] | None:
    """What backs ``entry``, one number per number of the figure, in the figure's unit; None
    for a ``setting``."""
    if entry.kind == "bench":
        got = eval(entry.arg, {"__builtins__": {}, **HELPERS})
    elif entry.kind == "timing":
        got = timing(entry.arg, root)
    elif entry.kind == "code":
        module, _, expr = entry.arg.partition(":")
        got = eval(expr, vars(importlib.import_module(module)))
    elif entry.kind == "setting":
        if not entry.arg:
            raise ValueError("a setting says what it is")
        return None
    else:
        raise ValueError(f"unknown kind {entry.kind!r}")
    return [float(v) for v in got] if isinstance(got, tuple | list) else [float(got)]


def _pairs(
    page: str, found: list[Figure], listed: list[Entry]
) -> Iterator[tuple[Figure | None, Entry | None]]:
    for i in range(max(len(found), len(listed))):
        yield (found[i] if i < len(found) else None, listed[i] if i < len(listed) else None)


def problems(root: Path = ROOT, only: str | None = None) -> list[str]:
    """Every figure of every page (of the page ``only``) against the ledger, one message per
    finding."""
    try:
        ledger = read_ledger((root / LEDGER).read_text())
    except ValueError as e:
        return [str(e)]
    out: list[str] = []
    listed_pages = pages(root)
    for page in sorted(set(ledger) - set(listed_pages)):
        out.append(f"{LEDGER}: [{page}] is not a page")
    for page in listed_pages if only is None else [only]:
        found = figures((root / page).read_text())
        for fig, entry in _pairs(page, found, ledger.get(page, [])):
            if fig is None and entry is not None:
                out.append(f"{LEDGER}:{entry.line}: {entry.text!r} is no longer in {page}")
                break
            if entry is None and fig is not None:
                out.append(f"{page}:{fig.line}: {fig.text!r} is not in {LEDGER}")
                break
            assert fig is not None and entry is not None
            if fig.text != entry.text:
                out.append(
                    f"{page}:{fig.line}: {fig.text!r}, where {LEDGER}:{entry.line} lists "
                    f"{entry.text!r} (a figure changed, added or removed)"
                )
                break
            try:
                backing = value(entry, root)
            except Exception as e:  # a source that cannot be read is a finding, not a crash
                out.append(f"{LEDGER}:{entry.line}: {entry.text!r}: {type(e).__name__}: {e}")
                continue
            if backing is None:
                continue
            printed = _numbers(entry.text)
            if len(printed) != len(backing) or any(
                math.isnan(b) or abs(n - b) > tol + 1e-9
                for (n, tol), b in zip(printed, backing, strict=False)
            ):
                got = ", ".join(f"{b:.6g}" for b in backing)
                out.append(
                    f"{page}:{fig.line}: {entry.text!r} is {got} by its source "
                    f"({LEDGER}:{entry.line}: {entry.kind} {entry.arg})"
                )
    return out


def skeleton(root: Path = ROOT) -> str:
    """The ledger's lines for the pages as they are: a figure that the ledger lists at the
    matching place (the two lists aligned as a diff aligns lines) keeps its source, a new one
    gets ``?`` (which the test refuses until it is filled in)."""
    try:
        old = read_ledger((root / LEDGER).read_text())
    except (OSError, ValueError):
        old = {}
    lines: list[str] = []
    for page in pages(root):
        lines.append(f"[{page}]")
        kept = old.get(page, [])
        found = figures((root / page).read_text())
        source: dict[int, Entry] = {}
        matcher = difflib.SequenceMatcher(a=[e.text for e in kept], b=[f.text for f in found])
        for block in matcher.get_matching_blocks():
            for k in range(block.size):
                source[block.b + k] = kept[block.a + k]
        for i, fig in enumerate(found):
            e = source.get(i)
            lines.append(
                f"{fig.text} | {e.kind} {e.arg}" if e else f"{fig.text} | ?  # line {fig.line}"
            )
        lines.append("")
    return "\n".join(lines)


def add_parser(sub: Any) -> None:
    """The ``figures`` subcommand, on the subparsers of ``python -m bench``."""
    p = sub.add_parser("figures", help=f"every figure of the docs beside what backs it ({LEDGER})")
    p.add_argument(
        "--skeleton", action="store_true", help=f"print {LEDGER} for the pages as they are"
    )


def command(args: argparse.Namespace) -> int:
    if args.skeleton:
        print(skeleton())
        return 0
    ledger = read_ledger((ROOT / LEDGER).read_text())
    for page, entries in ledger.items():
        for e in entries:
            try:
                got = value(e)
                shown = "-" if got is None else ", ".join(f"{v:.6g}" for v in got)
            except Exception as exc:  # shown, and the test fails on it
                shown = f"{type(exc).__name__}: {exc}"
            print(f"{page}\t{e.text}\t{shown}\t{e.kind} {e.arg}")
    found = problems()
    for p in found:
        print(p)
    return 1 if found else 0
