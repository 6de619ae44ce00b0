"""The side-by-side benchmark's table rows (bench/kueue_report.py): the Kueue that ran, the
releases past the cap per story, the order of a partial wave, the goals' verdicts."""

from __future__ import annotations

from typing import Any

from bench.kueue_report import kueue_rows
from bench.stats import summarize


def result(kueue: list[float], ungater: list[float]) -> dict[str, Any]:
    return {
        "kueue_version": "v0.19.2",
        "sizes": {"workloads": 3, "workload_pods": 2, "shrink": [4, 12, 8]},
        "cases": {
            "shrink": {
                "kueue": summarize(kueue, "s"),
                "ungater": summarize(ungater, "s"),
                "ratio_median": summarize(kueue, "s")["median"] / summarize(ungater, "s")["median"],
                "ratio_p95": summarize(kueue, "s")["p95"] / summarize(ungater, "s")["p95"],
                "stalls": {"kueue": 0, "ungater": 0},
            }
        },
        "over_cap": {"shrink": {"kueue": {"count": 40}, "ungater": {"count": 0}}},
        "order": {
            "freed_pending": [
                {"gated": [7, 8, 9, 10, 11, 12], "kueue": 10, "ungater": 7},
                {"gated": [7, 8, 9, 10, 11, 12], "kueue": None, "ungater": 7},
            ]
        },
        "burst_totals": {"last_pod_created_s": 40.0, "all_released_ungater_s": 41.7},
    }


def by_metric(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["metric"]: r for r in rows}


def test_every_row_names_the_kueue_that_ran() -> None:
    rows = kueue_rows(result([0.2] * 5, [0.1] * 5))
    assert rows and {r["config"] for r in rows} == {"Kueue v0.19.2, head to head"}
    alone = kueue_rows(result([0.2] * 5, [0.1] * 5) | {"mode": "each-alone"})
    assert {r["config"] for r in alone} == {"Kueue v0.19.2, each alone"}


def test_each_alone_is_judged_on_the_case_goal_and_names_who_released() -> None:
    label = "shrunk slice admitted, last release (4 -> 12 -> 8)"
    each = {"mode": "each-alone"}
    # issue 43: parity where both patch on the same Workload event, so behind is a miss
    short = by_metric(kueue_rows(result([0.2] * 5, [0.3] * 5) | each))
    assert short[f"{label}: ratio Kueue/ungater"]["status"] == "MISS"
    assert short[f"{label}: ratio Kueue/ungater"]["goal"] == ">= 1"
    assert f"{label}: Kueue alone" in short and f"{label}: ungater alone" in short
    enough = by_metric(kueue_rows(result([0.4] * 5, [0.2] * 5) | each))
    assert enough[f"{label}: ratio Kueue/ungater"]["status"] == "pass"
    assert enough[f"{label}: ratio at p95"]["status"] == "pass"


def test_each_alone_reports_each_sides_burst_and_partial_wave() -> None:
    r = result([0.2] * 5, [0.1] * 5) | {"mode": "each-alone"}
    r["order"] = {"freed_pending": [{"gated": [7, 8], "kueue": 8}, {"gated": [7, 8], "ungater": 7}]}
    r["burst_totals"] = {
        "kueue": {"last_admission_s": 2.0, "all_released_kueue_s": 3.0},
        "ungater": {
            "last_admission_s": 2.5,
            "all_released_ungater_s": None,
            "still_gated_ungater": 4,
        },
    }
    rows = by_metric(kueue_rows(r))
    assert "partial wave, gated 7..8, one slot: index released (kueue): 8" in rows
    assert "partial wave, gated 7..8, one slot: index released (ungater): 7" in rows
    assert rows["burst: quota raised to the last admission (kueue's burst)"]["median"] == 2.0
    assert rows["burst: quota raised to the last admission (ungater's burst)"]["median"] == 2.5
    assert rows["burst: quota raised to all released (kueue's gate)"]["median"] == 3.0
    gated = rows["burst: quota raised to all released (ungater's gate): 4 pods still gated"]
    assert gated["status"] == "MISS"


def test_ungater_behind_kueue_is_a_miss_and_ahead_a_pass() -> None:
    label = "shrunk slice admitted, last release (4 -> 12 -> 8)"
    behind = by_metric(kueue_rows(result([0.2] * 5, [0.3] * 5)))
    assert behind[f"{label}: ratio Kueue/ungater"]["status"] == "MISS"
    ahead = by_metric(kueue_rows(result([0.3] * 5, [0.2] * 5)))
    assert ahead[f"{label}: ratio Kueue/ungater"]["status"] == "pass"
    assert ahead[f"{label}: ratio at p95"]["status"] == "pass"
    few = by_metric(kueue_rows(result([0.3] * 4, [0.2] * 4)))  # under 5 samples: no verdict
    assert few[f"{label}: ratio Kueue/ungater"]["status"] == "-"


def test_releases_past_the_cap_judge_ungater_alone() -> None:
    rows = by_metric(kueue_rows(result([0.2] * 5, [0.1] * 5)))
    kueue = rows["shrink: releases past the cap (kueue's gate)"]
    ours = rows["shrink: releases past the cap (ungater's gate)"]
    assert (kueue["median"], kueue["status"]) == (40, "-")
    assert (ours["median"], ours["status"]) == (0, "pass")


def test_the_partial_wave_shows_each_index_released() -> None:
    rows = by_metric(kueue_rows(result([0.2] * 5, [0.1] * 5)))
    kueue = rows["partial wave, gated 7..12, one slot: index released (kueue): 10 -"]
    ours = rows["partial wave, gated 7..12, one slot: index released (ungater): 7 7"]
    assert (kueue["n"], kueue["median"]) == (1, 10)
    assert (ours["n"], ours["median"]) == (2, 7)


def test_the_burst_totals_say_when_the_last_pod_came() -> None:
    rows = by_metric(kueue_rows(result([0.2] * 5, [0.1] * 5)))
    assert rows["burst: quota raised to the last pod created"]["median"] == 40.0
    assert rows["burst: quota raised to all released (ungater's gate)"]["median"] == 41.7


LABEL = "shrunk slice admitted, last release (4 -> 12 -> 8)"


def test_missing_samples_are_a_row_per_gate_judged_for_ungater() -> None:
    k = result([0.2] * 5, [0.1] * 5)
    k["cases"]["shrink"]["missing"] = {"kueue": 2, "ungater": 1}
    rows = by_metric(kueue_rows(k))
    kueue = rows[f"{LABEL}: missing samples (kueue)"]
    ours = rows[f"{LABEL}: missing samples (ungater)"]
    assert (kueue["median"], kueue["goal"], kueue["status"]) == (2, "0", "-")
    assert (ours["median"], ours["goal"], ours["status"]) == (1, "0", "MISS")
    k["cases"]["shrink"]["missing"] = {"kueue": 0, "ungater": 0}
    assert by_metric(kueue_rows(k))[f"{LABEL}: missing samples (ungater)"]["status"] == "pass"


def test_a_run_that_timed_one_gate_gets_its_rows_without_a_ratio() -> None:
    k = result([0.2] * 5, [0.1] * 5)
    k["cases"]["shrink"] = {
        "ungater": summarize([0.1] * 5, "s"),
        "stalls": {"ungater": 0},
        "missing": {"ungater": 0},
    }
    k["over_cap"] = {"shrink": {"ungater": {"count": 0}}}
    k["order"] = {"freed_pending": [{"gated": [7, 8], "ungater": 7}]}
    rows = by_metric(kueue_rows(k))
    assert rows[f"{LABEL}: ungater's gate"]["n"] == 5
    assert rows[f"{LABEL}: missing samples (ungater)"]["status"] == "pass"
    assert "partial wave, gated 7..8, one slot: index released (ungater): 7" in rows
    assert not [m for m in rows if "ratio" in m or "kueue)" in m or "kueue's" in m]


def test_a_burst_not_all_released_is_a_row_saying_how_many_kept_the_gate() -> None:
    k = result([0.2] * 5, [0.1] * 5)
    k["burst_totals"] |= {
        "all_released_kueue_s": None,
        "still_gated_kueue": 4,
        "all_released_ungater_s": None,
        "still_gated_ungater": 3,
    }
    rows = by_metric(kueue_rows(k))
    ours = rows["burst: quota raised to all released (ungater's gate): 3 pods still gated"]
    assert (ours["n"], ours["status"]) == (0, "MISS")
    kueue = rows["burst: quota raised to all released (kueue's gate): 4 pods still gated"]
    assert kueue["status"] == "-"
    del k["burst_totals"]["still_gated_ungater"]  # a result from before the count was kept
    rows = by_metric(kueue_rows(k))
    said = rows["burst: quota raised to all released (ungater's gate): not all released"]
    assert said["status"] == "MISS"


def test_spans_and_floor_are_rows_and_a_wave_without_trace_is_counted() -> None:
    r = result([0.2] * 5, [0.1] * 5) | {"mode": "each-alone"}
    wave = {"event": 1.0, "reconcile_start": 1.5, "decided": 2.0, "first_patch_sent": 2.5}
    wave |= {"last_patch_answered": 9.0, "end": 10.0, "reconciles": 1, "patches": 8}
    wave["reads"] = [{"what": "owner", "ms": 3.0}, {"what": "slice", "ms": 4.0}]
    r["spans"] = {"shrink": {"waves": 2, "missing": 1, "each": [wave, None]}}
    r["floor"] = {"get_samples_ms": [1.0, 2.0, 3.0], "patch_samples_ms": [4.0, 5.0, 6.0]}
    rows = by_metric(kueue_rows(r))
    label = "shrunk slice admitted, last release (4 -> 12 -> 8)"
    assert rows[f"{label}: span to decided (ungater)"]["median"] == 0.002
    assert rows[f"{label}: span to last release seen (ungater)"]["median"] == 0.01
    assert rows[f"{label}: slice reads, time per wave (ungater)"]["median"] == 0.004
    missing = rows[f"{label}: waves without a trace (ungater)"]
    assert (missing["median"], missing["status"]) == (1, "MISS")
    assert rows["floor: one quorum GET of a gated pod, sequential"]["median"] == 0.002
    assert rows["floor: one guarded PATCH of a gated pod, sequential"]["median"] == 0.005


def test_a_result_with_history_gaps_never_prints_pass() -> None:
    """Issue 41: ``over_cap_history_gaps`` set to 7 in a result file still printed "pass"."""
    k = result([0.2] * 5, [0.1] * 5)
    k["over_cap"] = {"shrink": {"kueue": {"count": 0}, "ungater": {"count": 0}}}
    assert by_metric(kueue_rows(k))["shrink: releases past the cap (ungater's gate)"]["status"] == (
        "pass"
    )
    k["over_cap_history_gaps"] = 7
    rows = by_metric(kueue_rows(k))
    assert "shrink: releases past the cap (ungater's gate)" not in rows
    ours = rows["shrink: releases past the cap (ungater's gate): no result (history with gaps)"]
    assert ours["status"] == "MISS" and ours["n"] == 0
    gaps = rows["releases past the cap: not judged, 7 gaps in the watched history"]
    assert (gaps["median"], gaps["status"]) == (7, "MISS")
    assert all(r["status"] != "pass" for m, r in rows.items() if "past the cap" in m)


def test_a_story_the_judge_refused_is_no_result() -> None:
    """The judge's own refusal (``count`` None, its gaps named) is never read as 0."""
    k = result([0.2] * 5, [0.1] * 5)
    refused = {"count": None, "judged": 0, "gaps": ["pods events after rv 5 ..."]}
    k["over_cap"] = {"shrink": {"kueue": refused, "ungater": refused}}
    rows = by_metric(kueue_rows(k))
    said = ": no result (history with gaps)"
    assert rows[f"shrink: releases past the cap (ungater's gate){said}"]["status"] == "MISS"
    assert rows[f"shrink: releases past the cap (kueue's gate){said}"]["status"] == "-"


def test_the_rows_say_how_many_releases_were_judged_and_none_is_no_pass() -> None:
    k = result([0.2] * 5, [0.1] * 5)
    k["over_cap"] = {
        "shrink": {"kueue": {"count": 2, "judged": 9}, "ungater": {"count": 0, "judged": 8}}
    }
    rows = by_metric(kueue_rows(k))
    assert rows["shrink: releases past the cap (ungater's gate), of 8 judged"]["status"] == "pass"
    assert rows["shrink: releases past the cap (kueue's gate), of 9 judged"]["median"] == 2
    k["over_cap"]["shrink"]["ungater"] = {"count": 0, "judged": 0}
    rows = by_metric(kueue_rows(k))
    assert rows["shrink: releases past the cap (ungater's gate), of 0 judged"]["status"] == "MISS"
