"""Goals, pass/miss, and the rows of the results table, from the measured samples."""

from __future__ import annotations

import math
from typing import Any

from bench.stats import summarize

__all__ = ["GOALS", "table_rows"]

GOALS = {
    "release_latency_100": "median < 0.3 s",
    "throughput_ratio": "ratio >= 0.8",
    "rss_after_sync": "< 200 MB",
    "reconcile_flat": "max/min median <= 1.5",
    "freed_slot": "median < 0.1 s",
    "arrival": "median < 0.1 s",
}


def _status(ok: bool | None) -> str:
    return "-" if ok is None else ("pass" if ok else "MISS")


def _row(metric: str, config: str, s: dict[str, Any], goal: str = "", ok: bool | None = None):  # type: ignore[no-untyped-def]
    return {
        "metric": metric,
        "config": config,
        "median": s["median"],
        "p95": s["p95"],
        "n": s["n"],
        "unit": s["unit"],
        "goal": goal,
        "status": _status(ok),
    }


def table_rows(m: dict[str, Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for config, by_size in m.get("release_latency", {}).items():
        for size, s in by_size.items():
            goal = GOALS["release_latency_100"] if size == "100" else ""
            ok = s["median"] < 0.3 if size == "100" else None
            rows.append(_row(f"release latency, {size} pods", config, s, goal, ok))
    for config, t in m.get("throughput", {}).items():
        rows.append(_row(f"throughput {t['pods']} pods: controller", config, t["controller"]))
        rows.append(_row(f"throughput {t['pods']} pods: raw baseline", config, t["baseline"]))
        ratio = t["ratio"]
        ok = ratio >= 0.8 if config == "raised" else None
        r = summarize([ratio], "ratio")
        rows.append(_row("throughput ratio (medians)", config, r, GOALS["throughput_ratio"], ok))
    for config, s in m.get("freed_slot_latency", {}).items():
        rows.append(_row("freed-slot latency", config, s, GOALS["freed_slot"], s["median"] < 0.1))
    for config, s in m.get("arrival_latency", {}).items():
        rows.append(_row("arrival latency", config, s, GOALS["arrival"], s["median"] < 0.1))
    for config, c in m.get("scaleup_churn", {}).items():
        w = c["workloads"]
        rows.append(_row(f"scale-up churn, {w} workloads: all released", config, c["total"]))
        rows.append(_row("scale-up churn: per workload", config, c["per_workload"]))
    sc = m.get("scale")
    if sc:
        cfg = sc["config"]
        label = f"{sc['pods']} pods/{sc['workloads']} workloads"
        rss = sc["rss_synced_mb"]
        rows.append(
            _row(f"RSS after sync, {label}", cfg, rss, GOALS["rss_after_sync"], rss["median"] < 200)
        )
        rows.append(_row("RSS a few s after sync", cfg, sc["rss_settled_mb"]))
        rows.append(_row("time to sync (start -> caches synced)", cfg, sc["sync_seconds"]))
        if "release_all_seconds" in sc:
            rows.append(
                _row(f"admit all {sc['workloads']}: all released", cfg, sc["release_all_seconds"])
            )
            rows.append(_row("peak RSS after release-all", cfg, sc["peak_rss_mb"]))
    rc = m.get("reconcile_cost")
    if rc:
        for mode in ("releasing", "idle"):
            for size, s in rc[mode].items():
                rows.append(_row(f"reconcile ({mode}), {size} cached pods", "in-process", s))
            ratio = rc[f"{mode}_ratio"]
            ok = ratio <= 1.5 if not math.isnan(ratio) else None
            r = summarize([ratio], "ratio")
            rows.append(
                _row(
                    f"reconcile ({mode}) max/min median",
                    "in-process",
                    r,
                    GOALS["reconcile_flat"],
                    ok,
                )
            )
    return rows
