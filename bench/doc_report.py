"""``python -m bench report FILE [--section NAME] [--format markdown|text]``: a result's table.

The tables the docs quote are printed from a committed result JSON (bench/results/README.md).
The rows are made again from the run's samples (``result["metrics"]``) by the current
:func:`bench.report.table_rows`, not read from the ``table`` the run stored: a change to how
rows are built or judged shows in every doc table that quotes the file (and
tests/unit/docs/test_bench_figures.py fails until the doc is regenerated), while the samples
themselves never change. ``--section`` keeps the rows of one scenario (bench/report.py
``SECTIONS``: latency, throughput, freed, arrival, churn, scale, reconcile, kueue).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bench.report import SECTIONS, table_rows
from bench.stats import HEADER, cells, render_table

__all__ = ["FORMATS", "add_parser", "command", "markdown_table", "report", "report_rows"]

FORMATS = ("markdown", "text")


def report_rows(result: dict[str, Any], section: str | None = None) -> list[dict[str, Any]]:
    """The table rows of ``result`` (made from its metrics), of one section if named; a
    section ``S/PART`` keeps the rows of that part of it (the Kueue runs: ``kueue/headline``,
    ``kueue/spans``, ``kueue/checks``)."""
    scenario, _, part = (section or "").partition("/")
    if section is not None and scenario not in SECTIONS:
        raise ValueError(f"unknown section {section!r}: one of {', '.join(SECTIONS)}")
    rows = table_rows(result["metrics"])
    if section is None:
        return rows
    return [r for r in rows if r.get("section") == scenario and (not part or r.get("part") == part)]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The rows as a markdown table, values formatted as in the run's printed table."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines.extend("| " + " | ".join(_cell(c) for c in cells(r)) + " |" for r in rows)
    return "\n".join(lines)


def report(path: Path, section: str | None = None, fmt: str = "markdown") -> str:
    """The table of the result JSON at ``path``; ValueError if the section has no rows there."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}: one of {', '.join(FORMATS)}")
    rows = report_rows(json.loads(path.read_text()), section)
    if not rows:
        raise ValueError(f"{path}: no rows" + (f" of section {section!r}" if section else ""))
    return markdown_table(rows) if fmt == "markdown" else render_table(rows)


def add_parser(sub: Any) -> None:
    """The ``report`` subcommand, on the subparsers of ``python -m bench``."""
    p = sub.add_parser("report", help="print a result JSON's table (as the docs quote it)")
    p.add_argument("file", type=Path, help="a result JSON (bench/results/NAME.json)")
    p.add_argument(
        "--section",
        metavar="S[/PART]",
        help=f"the rows of one scenario only ({', '.join(SECTIONS)}); kueue/headline, "
        "kueue/spans, kueue/checks: one part of a Kueue run's",
    )
    p.add_argument("--format", choices=FORMATS, default="markdown", help="default: markdown")


def command(args: argparse.Namespace) -> int:
    try:
        print(report(args.file, args.section, args.format))
    except (OSError, ValueError, KeyError) as e:
        print(f"python -m bench report: {e}", file=sys.stderr)
        return 2
    return 0
