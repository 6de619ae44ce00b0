"""The cost of deciding again on one owner by its size (bench/reconcile_cost.py,
``owner_size_cost``): both ways measured call by call, summarized and reported."""

from __future__ import annotations

import pytest

from bench.reconcile_cost import owner_size_cost
from bench.report import table_rows
from bench.runner import _owner_size_summary
from bench.stats import summarize


@pytest.mark.anyio
async def test_each_size_is_timed_both_ways_the_same_number_of_times() -> None:
    got = await owner_size_cost((10, 30), calls=60)
    assert set(got) == {"reused", "asked"}
    # at least 5 timed calls each, calls // size when more, the two untimed first ones aside
    assert [len(got["reused"][s]) for s in ("10", "30")] == [6, 5]
    assert [len(got["asked"][s]) for s in ("10", "30")] == [6, 5]
    assert all(t > 0 for way in got.values() for samples in way.values() for t in samples)


def test_the_summary_and_rows_give_each_way_and_their_ratio() -> None:
    summary = _owner_size_summary({"reused": {"1000": [2.0, 2.0]}, "asked": {"1000": [30.0]}})
    assert summary["1000"]["ratio"] == 15.0
    rc = {
        "releasing": {"1000": summarize([5.0], "us")},
        "idle": {"1000": summarize([4.0], "us")},
        "releasing_ratio": 1.0,
        "idle_ratio": 1.0,
        "bytes_per_cached_pod": 1000,
        "owner_size": summary,
    }
    rows = [r for r in table_rows({"reconcile_cost": rc}) if "one owner" in r["metric"]]
    assert [(r["metric"], r["median"]) for r in rows] == [
        ("idle reconcile of one owner of 1000 pods, answers reused", 2.0),
        ("idle reconcile of one owner of 1000 pods, every pod asked", 30.0),
        ("idle reconcile of one owner of 1000 pods: asked / reused", 15.0),
    ]
