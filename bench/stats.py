"""Summaries of samples (median, p95) and the results table printed at the end of a run."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

__all__ = ["HEADER", "cells", "percentile", "render_table", "summarize"]


def percentile(samples: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by linear interpolation between closest ranks."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(samples: Sequence[float], unit: str) -> dict[str, Any]:
    """Median, p95, min, max and count of ``samples``, with the raw samples kept."""
    return {
        "unit": unit,
        "n": len(samples),
        "median": statistics.median(samples) if samples else math.nan,
        "p95": percentile(samples, 95),
        "min": min(samples) if samples else math.nan,
        "max": max(samples) if samples else math.nan,
        "samples": [round(s, 6) for s in samples],
    }


def _fmt(value: Any, unit: str) -> str:
    if not isinstance(value, int | float) or math.isnan(value):
        return "-"
    if unit == "s":
        return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"
    if unit == "us":
        return f"{value:.0f} µs"
    if unit == "B":
        return f"{value:.0f} B"
    if unit == "MB":
        return f"{value:.0f} MB"
    if unit == "pods/s":
        return f"{value:.0f}/s"
    if unit == "CPU-s":
        return f"{value:.2f} CPU-s"
    if unit == "count":
        return f"{value:.0f}"
    return f"{value:.2f}"


HEADER = ("metric", "config", "median", "p95", "n", "goal", "status")


def cells(r: dict[str, Any]) -> list[str]:
    """One row's cells under :data:`HEADER`, values formatted with their unit."""
    return [
        str(r["metric"]),
        str(r.get("config", "")),
        _fmt(r.get("median"), r.get("unit", "")),
        _fmt(r.get("p95"), r.get("unit", "")),
        str(r.get("n", "")),
        str(r.get("goal", "")),
        str(r.get("status", "")),
    ]


def render_table(rows: Sequence[dict[str, Any]]) -> str:
    """Rows of ``{"metric", "config", "median", "p95", "unit", "goal", "status"}`` as text."""
    header = HEADER
    lines = [cells(r) for r in rows]
    widths = [max(len(h), *(len(row[i]) for row in lines)) for i, h in enumerate(header)]
    out = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    out.append("  ".join("-" * w for w in widths))
    out.extend("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in lines)
    return "\n".join(out)
