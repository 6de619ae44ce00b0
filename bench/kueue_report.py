"""The results-table rows of the side-by-side Kueue benchmark (bench/kueue.py).

Per case: Kueue's gate and ungater's at median and p95, their ratio, stalls; per story the
releases past the cap of each gate; the index each released first in a partial wave. The
config column names the Kueue that ran. Goals (issue 25): ungater ahead of Kueue at the median
and at p95 on every case, no stall and no release past the cap; verdicts only where a case has
5 samples or more per gate.
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
    "shrink": "shrunk slice admitted, last release",
    "rc_scale": "RayCluster scale-up, last worker",
    "burst": "workloads admitted at once, per workload",
}


def _row(
    metric: str, config: str, s: dict[str, Any], goal: str = "", ok: bool | None = None
) -> dict[str, Any]:
    return {
        "metric": metric,
        "config": config,
        "median": s["median"],
        "p95": s["p95"],
        "n": s["n"],
        "unit": s["unit"],
        "goal": goal,
        "status": "-" if ok is None else ("pass" if ok else "MISS"),
    }


def _label(case: str, k: dict[str, Any]) -> str:
    label = _LABELS.get(case, case)
    sz = k["sizes"]
    if case == "burst":
        return f"{sz['workloads']} x {sz['workload_pods']} {label}"
    if case == "shrink":
        start, big, to = sz["shrink"]
        return f"{label} ({start} -> {big} -> {to})"
    return label


def kueue_rows(k: dict[str, Any]) -> list[dict[str, Any]]:
    config = f"Kueue {k.get('kueue_version', '?')}"
    rows: list[dict[str, Any]] = []
    for case, c in k["cases"].items():
        label = _label(case, k)
        judged = min(c["kueue"]["n"], c["ungater"]["n"]) >= 5
        rows.append(_row(f"{label}: Kueue's gate", config, c["kueue"]))
        rows.append(_row(f"{label}: ungater's gate", config, c["ungater"]))
        med, p95 = c.get("ratio_median", math.nan), c.get("ratio_p95", math.nan)
        ok = med > 1 if judged and not math.isnan(med) else None
        rows.append(
            _row(f"{label}: ratio Kueue/ungater", config, summarize([med], "ratio"), "> 1", ok)
        )
        ok = p95 > 1 if judged and not math.isnan(p95) else None
        rows.append(_row(f"{label}: ratio at p95", config, summarize([p95], "ratio"), "> 1", ok))
        for who in ("kueue", "ungater"):
            n = c["stalls"][who]
            ok = n == 0 if who == "ungater" else None
            rows.append(_row(f"{label}: stalls ({who})", config, summarize([n], "count"), "0", ok))
    for story, found in k.get("over_cap", {}).items():
        for who in ("kueue", "ungater"):
            n = found[who]["count"]
            ok = n == 0 if who == "ungater" else None
            metric = f"{story}: releases past the cap ({who}'s gate)"
            rows.append(_row(metric, config, summarize([n], "count"), "0", ok))
    waves = k.get("order", {}).get("freed_pending", [])
    if waves:
        gated = waves[0]["gated"]
        span = f"{min(gated)}..{max(gated)}" if gated else "-"
        for who in ("kueue", "ungater"):
            went = [w.get(who) for w in waves]
            shown = " ".join("-" if i is None else str(i) for i in went)
            metric = f"partial wave, gated {span}, one slot: index released ({who}): {shown}"
            s = summarize([i for i in went if i is not None], "count")
            rows.append(_row(metric, config, s))
    totals = k.get("burst_totals", {})
    for what in ("last_admission_s", "last_pod_created_s"):
        t = totals.get(what)
        if t is not None:
            metric = f"burst: quota raised to the {what[:-2].replace('_', ' ')}"
            rows.append(_row(metric, config, summarize([t], "s")))
    for who in ("kueue", "ungater"):
        t = totals.get(f"all_released_{who}_s")
        if t is not None:
            rows.append(
                _row(
                    f"burst: quota raised to all released ({who}'s gate)",
                    config,
                    summarize([t], "s"),
                )
            )
    return rows
