"""The release-all case against the raw PATCH loop at the same scale (bench/scale.py, report)."""

from __future__ import annotations

import math

import pytest

from bench.report import table_rows
from bench.scale import release_all_comparison


def window(process: str, cores: float, wall: float, apiserver: float) -> dict[str, float]:
    return {process: cores, "kube-apiserver": apiserver, "machine": 1.9, "wall_seconds": wall}


OURS = {
    "pods": 100_000,
    "release_all_pods_per_s": 150.0,
    "release_all_cpu": window("controller", 0.4, 666.7, 1.3),
}
RAW = {
    "pods": 100_000,
    "release_all_seconds": 500.0,
    "release_all_pods_per_s": 200.0,
    "release_all_cpu": window("bench.raw", 0.2, 500.0, 1.4),
}


def test_the_controller_is_compared_with_the_loop_by_rate_and_by_cpu_per_release() -> None:
    vs = release_all_comparison(OURS, RAW)
    assert vs["ratio"] == pytest.approx(0.75)
    # 0.4 cores for 666.7 s over 100k pods; 0.2 cores for 500 s over 100k
    assert vs["cpu_per_1000_controller"] == pytest.approx(2.6668)
    assert vs["cpu_per_1000_raw"] == pytest.approx(1.0)
    assert vs["cpu_ratio"] == pytest.approx(2.6668)
    assert vs["apiserver_cores"] == (1.3, 1.4)


def test_a_process_missing_from_the_window_gives_no_cpu_figure() -> None:
    ours = {**OURS, "release_all_cpu": {"wall_seconds": 10.0}}
    vs = release_all_comparison(ours, RAW)
    assert math.isnan(vs["cpu_per_1000_controller"])
    assert math.isnan(vs["cpu_ratio"])


def summary(value: float, unit: str) -> dict[str, object]:
    return {"median": value, "p95": value, "n": 1, "unit": unit, "samples": [value]}


def test_the_table_shows_the_loop_beside_the_release_all() -> None:
    scale = {
        "config": "default",
        "pods": 100_000,
        "workloads": 10_000,
        "rss_synced_mb": summary(460, "MB"),
        "rss_settled_mb": summary(460, "MB"),
        "sync_seconds": summary(40, "s"),
        "ready_seconds": summary(40, "s"),
        "release_all_seconds": summary(666.7, "s"),
        "peak_rss_mb": summary(800, "MB"),
        "release_all_cpu": OURS["release_all_cpu"],
        "raw": RAW,
        "release_all_vs_raw": release_all_comparison(OURS, RAW),
    }
    rows = {r["metric"]: r for r in table_rows({"scale": scale})}
    assert rows["raw PATCH loop, same admissions: all 100000 released"]["median"] == 500.0
    # the API server's cores times the window, per 1000 released: 1.3 x 666.7 s, 1.4 x 500 s
    per_1000 = "release-all API server CPU per 1000 released: {} window"
    assert rows[per_1000.format("controller's")]["median"] == pytest.approx(8.6671)
    assert rows[per_1000.format("raw loop's")]["median"] == pytest.approx(7.0)
    assert rows["release-all rate ratio (controller / raw loop)"]["median"] == pytest.approx(0.75)
    cpu = rows["release-all CPU per release ratio (controller / raw)"]
    assert cpu["median"] == pytest.approx(2.6668)
    assert cpu["config"] == "default"


def test_a_raw_loop_that_could_not_run_is_a_missing_row_not_a_silence() -> None:
    scale = {
        "config": "default",
        "pods": 10_000,
        "workloads": 1_000,
        "rss_synced_mb": summary(160, "MB"),
        "rss_settled_mb": summary(160, "MB"),
        "sync_seconds": summary(4, "s"),
        "ready_seconds": summary(4, "s"),
        "clean_error": "TimeoutError('pod observer: timed out')",
    }
    rows = {r["metric"]: r for r in table_rows({"scale": scale})}
    row = rows["raw PATCH loop, same admissions: missing (namespace not emptied)"]
    assert (row["median"], row["goal"], row["status"]) == (1, "0", "MISS")
