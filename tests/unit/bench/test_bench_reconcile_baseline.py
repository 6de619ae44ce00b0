"""The reconcile cost's baseline (bench/reconcile_cost.py, ``reconcile_cost``): the same
reconciles on a controller that caches only its two owners, timed call by call beside the one
whose caches fill, then summarized and reported."""

from __future__ import annotations

from typing import Any

import pytest

from bench import reconcile_cost as rc_module
from bench.report import table_rows
from bench.runner import _reconcile_summary


@pytest.mark.anyio
async def test_the_baseline_is_timed_as_often_and_caches_only_its_owners(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[Any] = []
    real = rc_module._controller

    def controller() -> Any:
        made.append(real())
        return made[-1]

    monkeypatch.setattr(rc_module, "_controller", controller)
    got = await rc_module.reconcile_cost((20, 50), repeats=3)
    ours, base = made
    assert len(ours.state.workloads) == 2 + 5 + 100  # the bytes traced add 100 owners
    assert len(base.state.workloads) == 2
    for mode in ("releasing", "idle"):
        assert set(got[mode]) == set(got["baseline"][mode]) == {"20", "50"}
        for size in ("20", "50"):
            assert len(got[mode][size]) == len(got["baseline"][mode][size]) == 3
            assert all(t > 0 for t in got["baseline"][mode][size])


def test_the_summary_gives_the_baseline_growth_and_the_rows_name_it() -> None:
    raw = {
        "bytes_per_cached_pod": 1000.0,
        "releasing": {"1000": [10.0], "10000": [15.0]},
        "idle": {"1000": [4.0], "10000": [4.0]},
        "baseline": {
            "releasing": {"1000": [10.0], "10000": [14.0]},
            "idle": {"1000": [2.0], "10000": [3.0]},
        },
    }
    summary = _reconcile_summary(raw)
    assert summary["releasing_ratio"] == 1.5
    assert summary["baseline"]["releasing_ratio"] == 1.4
    assert summary["baseline"]["idle_ratio"] == 1.5
    rows = [r for r in table_rows({"reconcile_cost": summary}) if "baseline" in r["metric"]]
    assert [(r["metric"], r["median"]) for r in rows] == [
        ("baseline: reconcile (releasing), 1000 pods cached by another controller", 10.0),
        ("baseline: reconcile (releasing), 10000 pods cached by another controller", 14.0),
        ("baseline: reconcile (releasing) growth (max median / at smallest)", 1.4),
        ("baseline: reconcile (idle), 1000 pods cached by another controller", 2.0),
        ("baseline: reconcile (idle), 10000 pods cached by another controller", 3.0),
        ("baseline: reconcile (idle) growth (max median / at smallest)", 1.5),
    ]
