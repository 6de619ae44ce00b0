"""The results-table rows of the side-by-side Kueue benchmark (bench/kueue.py).

Goals (issue 13): ungater's gate at least 3x faster than Kueue's at the median on every case,
never slower at p95, and no stalls. Verdicts only where a case has 5 samples or more per gate.
"""

from __future__ import annotations

import math
from typing import Any

from bench.stats import summarize

__all__ = ["kueue_rows"]

_LABELS = {
    "initial": "initial admission",
    "scale_up": "scale-up slice admitted",
    "succeeded": "released pod Succeeded: next index",
    "recreated": "released pod deleted: recreated",
    "freed_pending": "freed slot, scale-up pending",
    "burst": "workloads scaling at once, per workload",
}


def _row(metric: str, s: dict[str, Any], goal: str = "", ok: bool | None = None) -> dict[str, Any]:
    return {
        "metric": metric,
        "config": "real Kueue",
        "median": s["median"],
        "p95": s["p95"],
        "n": s["n"],
        "unit": s["unit"],
        "goal": goal,
        "status": "-" if ok is None else ("pass" if ok else "MISS"),
    }


def kueue_rows(k: dict[str, Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for case, c in k["cases"].items():
        label = _LABELS.get(case, case)
        if case == "burst":
            label = f"{k['sizes']['workloads']} {label}"
        judged = min(c["kueue"]["n"], c["ungater"]["n"]) >= 5
        rows.append(_row(f"{label}: Kueue's gate", c["kueue"]))
        rows.append(_row(f"{label}: ungater's gate", c["ungater"]))
        med, p95 = c.get("ratio_median", math.nan), c.get("ratio_p95", math.nan)
        ok = med >= 3 if judged and not math.isnan(med) else None
        rows.append(_row(f"{label}: ratio Kueue/ungater", summarize([med], "ratio"), ">= 3", ok))
        ok = p95 >= 1 if judged and not math.isnan(p95) else None
        rows.append(_row(f"{label}: ratio at p95", summarize([p95], "ratio"), ">= 1", ok))
        for who in ("kueue", "ungater"):
            n = c["stalls"][who]
            ok = n == 0 if who == "ungater" else None
            rows.append(_row(f"{label}: stalls ({who})", summarize([n], "count"), "0", ok))
    for who in ("kueue", "ungater"):
        t = k.get("burst_totals", {}).get(f"all_released_{who}_s")
        if t is not None:
            rows.append(_row(f"burst: all released ({who}'s gate)", summarize([t], "s")))
    return rows
