"""The results-table rows of the Kueue benchmark (bench/kueue_run.py).

Per case: each releaser's median and p95 (each alone on Kueue's gate, or head to head each on
its own gate), their ratio, stalls, missing samples (triggers that gave no sample and no stall);
per story the releases past the cap of each releaser; the index each released first in a
partial wave; the bursts' totals, or how many of their pods kept a gate. The config column
names the Kueue that ran and the mode. Goals, each alone (issues 34 and 43): Kueue / ungater at least
``RATIO_GOALS`` at the median and at p95; no stall, no missing sample and no release past the
cap for ungater; verdicts only where a case has 5 samples or more per releaser. Head to head is
the order demonstration: ahead (> 1) is all it is judged on.
"""

from __future__ import annotations

import math
from typing import Any

from bench.stats import summarize

__all__ = ["PARTS", "RATIO_GOALS", "kueue_rows"]

#: The parts of the table (``row["part"]``), each quotable alone (``--section kueue/PART``):
#: each case's figures and ratio; where ungater's waves went and the server's floor; the checks
#: (stalls, missing samples, releases past the cap, the partial wave's order, the bursts).
HEADLINE, SPANS, CHECKS = "headline", "spans", "checks"
PARTS = (HEADLINE, SPANS, CHECKS)
CHECK = {"part": CHECKS}

#: Each releaser alone, Kueue / ungater at the median and at p95 (issue 34): 2x where a
#: Workload event alone starts the wave, 10x where a pod event does (Kueue batches those 1 s).
#: Where both patch on the same Workload event with the pods already there (a scale-up, a
#: RayCluster's, the shrink race), the floor is one patch round after the event, which Kueue's
#: Go sits on: parity at the floor, not a multiple (issue 43).
RATIO_GOALS = {
    "initial": 2.0,
    "scale_up": 1.0,
    "shrink": 1.0,
    "rc_scale": 1.0,
    "burst": 2.0,
    "succeeded": 10.0,
    "recreated": 10.0,
    "freed_pending": 10.0,
}

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


def _gate(who: str, alone: bool = False) -> str:
    """Who released: each alone both release Kueue's gate; head to head each its own."""
    name = "Kueue" if who == "kueue" else who
    return f"{name} alone" if alone else f"{name}'s gate"


def _count(metric: str, config: str, n: int, who: str) -> dict[str, Any]:
    """A count whose goal is 0, judged for ungater alone (Kueue's is reported)."""
    ok = n == 0 if who == "ungater" else None
    return _row(metric, config, summarize([n], "count"), "0", ok)


def _case_rows(
    label: str, config: str, c: dict[str, Any], alone: bool = False, goal: float | None = None
) -> list[dict[str, Any]]:
    """A case's rows for each gate it timed (one or both) and, where both ran, their ratio
    (judged against ``goal``, else ahead at all)."""
    rows: list[dict[str, Any]] = []
    timed = list(c["stalls"])  # the labels of the gates timed, in order
    for who in timed:
        rows.append(_row(f"{label}: {_gate(who, alone)}", config, c[who]))
    if "kueue" in timed and "ungater" in timed:
        judged = min(c["kueue"]["n"], c["ungater"]["n"]) >= 5
        med, p95 = c.get("ratio_median", math.nan), c.get("ratio_p95", math.nan)
        need = goal if goal is not None else 1.0
        text = f">= {need:g}" if goal is not None else "> 1"

        def verdict(ratio: float) -> bool | None:
            if not judged or math.isnan(ratio):
                return None
            return ratio >= need if goal is not None else ratio > 1

        rows.append(
            _row(
                f"{label}: ratio Kueue/ungater",
                config,
                summarize([med], "ratio"),
                text,
                verdict(med),
            )
        )
        rows.append(
            _row(f"{label}: ratio at p95", config, summarize([p95], "ratio"), text, verdict(p95))
        )
    for who in timed:
        rows.append(_count(f"{label}: stalls ({who})", config, c["stalls"][who], who) | CHECK)
    for who in timed:  # triggers that gave no sample and no stall: counted, never dropped
        if who in c.get("missing", {}):
            n = c["missing"][who]
            rows.append(_count(f"{label}: missing samples ({who})", config, n, who) | CHECK)
    return rows


def _over_cap_rows(config: str, k: dict[str, Any]) -> list[dict[str, Any]]:
    """Per story and releaser, the releases past the cap: a count of 0 passes only when the
    judge saw the whole history and judged at least one release (when the run recorded how many
    it judged); a history with gaps, or a story not judged, is a MISS for ungater, never a pass."""
    gaps = int(k.get("over_cap_history_gaps") or 0)
    rows: list[dict[str, Any]] = []
    if gaps:
        metric = f"releases past the cap: not judged, {gaps} gaps in the watched history"
        rows.append(_row(metric, config, summarize([gaps], "count"), "0", False))
    for story, found in k.get("over_cap", {}).items():
        for who, oc in found.items():
            metric = f"{story}: releases past the cap ({who}'s gate)"
            count, judged = oc.get("count"), oc.get("judged")
            if gaps or count is None or oc.get("gaps"):
                ok = False if who == "ungater" else None
                said = f"{metric}: no result (history with gaps)"
                rows.append(_row(said, config, summarize([], "count"), "0", ok))
                continue
            if judged is not None:
                metric = f"{metric}, of {judged} judged"
            row = _count(metric, config, count, who)
            if judged == 0 and who == "ungater":
                row["status"] = "MISS"  # 0 past the cap of 0 judged proves nothing
            rows.append(row)
    return rows


def _burst_released_rows(config: str, totals: dict[str, Any]) -> list[dict[str, Any]]:
    """From the quota change to the last removal, per gate; or how many pods kept the gate."""
    rows: list[dict[str, Any]] = []
    for key, t in totals.items():
        if not (key.startswith("all_released_") and key.endswith("_s")):
            continue
        who = key.removeprefix("all_released_").removesuffix("_s")
        metric = f"burst: quota raised to all released ({who}'s gate)"
        if t is not None:
            rows.append(_row(metric, config, summarize([t], "s")))
            continue
        gated = totals.get(f"still_gated_{who}")
        said = "not all released" if gated is None else f"{gated} pods still gated"
        ok = False if who == "ungater" else None
        rows.append(_row(f"{metric}: {said}", config, summarize([], "s"), "all released", ok))
    return rows


_SPAN_NAMES = {
    "event": "event seen",
    "reconcile_start": "reconcile started",
    "decided": "decided",
    "first_patch_sent": "first patch sent",
    "last_patch_answered": "last patch answered",
    "end": "last release seen",
}


def _span_rows(label: str, config: str, spans: dict[str, Any]) -> list[dict[str, Any]]:
    """Where ungater's waves of a case went (``--trace``): each span from the trigger seen, each
    kind of read (its time), over the waves whose trace was found; the others counted."""
    each = [w for w in spans.get("each", []) if w is not None]
    rows = []
    for name, said in _SPAN_NAMES.items():
        got = [w[name] / 1000 for w in each if w.get(name) is not None]
        rows.append(_row(f"{label}: span to {said} (ungater)", config, summarize(got, "s")))
    reads: dict[str, list[float]] = {}
    for w in each:
        per: dict[str, float] = {}
        for r in w.get("reads", []):
            per[r["what"]] = per.get(r["what"], 0.0) + (r["ms"] or 0.0)
        for what, ms in per.items():
            reads.setdefault(what, []).append(ms / 1000)
    for what, got in sorted(reads.items()):
        rows.append(
            _row(f"{label}: {what} reads, time per wave (ungater)", config, summarize(got, "s"))
        )
    missing = spans.get("missing", 0)
    rows.append(_count(f"{label}: waves without a trace (ungater)", config, missing, "ungater"))
    return rows


def _floor_rows(config: str, floor: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for what, key in (
        ("one quorum GET", "get_samples_ms"),
        ("one guarded PATCH", "patch_samples_ms"),
    ):
        got = [ms / 1000 for ms in floor.get(key, [])]
        metric = f"floor: {what} of a gated pod, sequential"
        rows.append(_row(metric, config, summarize(got, "s")))
    return rows


def _parted(rows: list[dict[str, Any]], part: str) -> list[dict[str, Any]]:
    """Each row tagged with the part of the table it belongs to, unless it has one."""
    return [r if "part" in r else r | {"part": part} for r in rows]


def kueue_rows(k: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of one Kueue run: each releaser alone (``mode`` each-alone) or head to head
    (the runs before the mode was recorded were head to head)."""
    mode = k.get("mode", "head-to-head")
    alone = mode == "each-alone"
    config = f"Kueue {k.get('kueue_version', '?')}, {mode.replace('-', ' ')}"
    rows: list[dict[str, Any]] = []
    labels: dict[str, None] = {}  # the gates timed in this run, in order (one or both)
    for case, c in k["cases"].items():
        goal = RATIO_GOALS.get(case) if alone else None
        rows.extend(_parted(_case_rows(_label(case, k), config, c, alone, goal), HEADLINE))
        if case in k.get("spans", {}):
            rows.extend(_parted(_span_rows(_label(case, k), config, k["spans"][case]), SPANS))
        labels |= dict.fromkeys(c["stalls"])
    rows.extend(_over_cap_rows(config, k))
    waves = k.get("order", {}).get("freed_pending", [])
    if waves:
        gated = waves[0]["gated"]
        span = f"{min(gated)}..{max(gated)}" if gated else "-"
        for who in [w for w in labels or ("kueue", "ungater") if any(w in v for v in waves)]:
            went = [w.get(who) for w in waves if who in w]
            shown = " ".join("-" if i is None else str(i) for i in went)
            metric = f"partial wave, gated {span}, one slot: index released ({who}): {shown}"
            s = summarize([i for i in went if i is not None], "count")
            rows.append(_row(metric, config, s))
    if k.get("floor"):
        rows.extend(_parted(_floor_rows(config, k["floor"]), SPANS))
    totals = k.get("burst_totals", {})
    # per side (each alone: its own burst) or, in older runs, one burst's totals
    sides = totals if all(isinstance(v, dict) for v in totals.values()) else {"": totals}
    for side, t_side in sides.items():
        whose = f" ({side}'s burst)" if side and alone else ""
        for what in ("last_admission_s", "last_pod_created_s"):
            t = t_side.get(what)
            if t is not None:
                metric = f"burst: quota raised to the {what[:-2].replace('_', ' ')}{whose}"
                rows.append(_row(metric, config, summarize([t], "s")))
        rows.extend(_burst_released_rows(config, t_side))
    return _parted(rows, CHECKS)
