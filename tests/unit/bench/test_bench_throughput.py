"""The throughput run's summary (bench/throughput.py): spread and CPU per 1000 released pods."""

from __future__ import annotations

import math

import pytest

from bench.release import Release
from bench.report import table_rows
from bench.runner import _cpu_summary
from bench.throughput import cpu_per_1000, spread, throughput_run


def rel(seconds: float, process: str, cores: float, pods: int = 1000) -> Release:
    return Release(pods, seconds, 0.01, {process: cores, "wall_seconds": seconds})


def test_spread_is_the_range_over_the_median() -> None:
    assert spread([2.0, 2.0, 2.0]) == 0
    assert spread([1.0, 2.0, 4.0]) == pytest.approx(1.5)


def test_cpu_per_1000_is_cpu_seconds_in_the_window_per_1000_pods() -> None:
    # 0.5 cores for 2 s over 500 pods: 1 CPU-s per 500, 2 CPU-s per 1000
    assert cpu_per_1000(rel(2.0, "controller", 0.5, pods=500), "controller") == pytest.approx(2.0)
    assert cpu_per_1000(rel(2.0, "controller", 0.5), "bench.raw") is None


def test_a_run_compares_the_controller_with_the_baseline() -> None:
    ours = [rel(2.0, "controller", 0.4), rel(4.0, "controller", 0.2)]  # 0.8 CPU-s each
    theirs = [rel(2.0, "bench.raw", 0.2), rel(2.0, "bench.raw", 0.3)]  # 0.4 and 0.6
    run = throughput_run(ours, theirs, theirs)
    assert run["controller"]["median"] == pytest.approx(375.0)  # 500/s and 250/s
    assert run["ratio"] == pytest.approx(0.75)
    assert run["spread_controller"] == pytest.approx(250 / 375)
    assert run["spread_baseline"] == 0
    assert run["cpu_per_1000_controller"]["median"] == pytest.approx(0.8)
    assert run["cpu_ratio"] == pytest.approx(0.8 / 0.5)


def test_a_raw_loop_that_registered_no_cpu_gives_no_ratio_rather_than_a_crash() -> None:
    # /proc counts CPU in ticks: a short window on busy cores can register none
    ours = [rel(2.0, "controller", 0.4)]
    theirs = [rel(2.0, "bench.raw", 0.0)]
    run = throughput_run(ours, theirs, theirs)
    assert run["cpu_per_1000_baseline"]["median"] == 0
    assert math.isnan(run["cpu_ratio"])


def test_a_window_without_a_cpu_reading_is_counted_and_shown() -> None:
    ours = [rel(2.0, "controller", 0.4), Release(1000, 2.0, 0.01, {"wall_seconds": 2.0})]
    theirs = [rel(2.0, "bench.raw", 0.2)]
    run = throughput_run(ours, theirs, theirs)
    assert run["cpu_per_1000_controller"]["n"] == 1
    assert run["cpu_per_1000_controller"]["missing"] == 1  # the controller had gone, say
    assert run["cpu_per_1000_baseline"]["missing"] == 0
    t = {"pods": 1000, **run}
    rows = {r["metric"]: r for r in table_rows({"throughput": {"raised": t}})}
    row = rows["CPU per 1000 released: controller: windows without a reading"]
    assert (row["median"], row["status"]) == (1, "MISS")
    assert not [m for m in rows if "raw baseline: windows without" in m]


def test_the_mean_cores_of_a_process_leave_out_the_windows_without_its_reading() -> None:
    samples = [rel(2.0, "controller", 0.4), Release(1000, 2.0, 0.01, {"wall_seconds": 2.0})]
    assert _cpu_summary(samples)["controller"] == pytest.approx(0.4)  # not (0.4 + 0) / 2
