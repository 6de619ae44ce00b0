"""``python -m bench report``: a result's table as the docs quote it, made again from the
samples, whole or one scenario's rows (bench/doc_report.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.__main__ import main
from bench.doc_report import markdown_table, report, report_rows
from bench.report import SECTIONS, table_rows
from bench.stats import render_table, summarize


def metrics() -> dict[str, Any]:
    return {
        "release_latency": {"raised": {"100": summarize([0.2, 0.25, 0.31], "s")}},
        "freed_slot_latency": {"raised": summarize([0.014, 0.012, 0.02], "s")},
        "reconcile_cost": {
            "releasing": {"1000": summarize([471.0, 500.0], "us")},
            "idle": {"1000": summarize([179.0, 180.0], "us")},
            "releasing_ratio": 1.0,
            "idle_ratio": 1.0,
            "bytes_per_cached_pod": 1624,
        },
    }


def test_every_row_is_tagged_with_its_scenario() -> None:
    rows = table_rows(metrics())
    assert [r["section"] for r in rows] == ["latency", "freed"] + ["reconcile"] * 5
    assert set(SECTIONS) >= {r["section"] for r in rows}


def test_the_rows_are_made_from_the_samples_not_read_from_the_stored_table() -> None:
    rows = report_rows({"metrics": metrics(), "table": [{"metric": "stale"}]}, "freed")
    assert [(r["metric"], r["status"]) for r in rows] == [("freed-slot latency", "pass")]


def test_markdown_has_the_printed_tables_columns_and_values() -> None:
    rows = report_rows({"metrics": metrics()}, "latency")
    assert markdown_table(rows).splitlines() == [
        "| metric | config | median | p95 | n | goal | status |",
        "|---|---|---|---|---|---|---|",
        "| release latency, 100 pods | raised | 250 ms | 304 ms | 3 | median < 0.3 s | pass |",
    ]
    assert "250 ms" in render_table(rows)


def test_an_unknown_section_or_one_without_rows_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"metrics": metrics()}))
    with pytest.raises(ValueError, match="unknown section"):
        report(path, "nope")
    with pytest.raises(ValueError, match="no rows of section 'scale'"):
        report(path, "scale")


def test_the_command_prints_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"metrics": metrics()}))
    assert main(["report", str(path), "--section", "freed"]) == 0
    assert capsys.readouterr().out == report(path, "freed") + "\n"
    assert main(["report", str(path), "--format", "text"]) == 0
    assert capsys.readouterr().out == render_table(table_rows(metrics())) + "\n"
    assert main(["report", str(tmp_path / "missing.json")]) == 2


def test_a_kueue_run_is_quoted_whole_or_by_part_and_every_row_is_in_one_part() -> None:
    k: dict[str, Any] = {
        "kueue_version": "v0.19.2",
        "mode": "each-alone",
        "sizes": {"shrink": [4, 12, 8]},
        "cases": {
            "shrink": {
                "kueue": summarize([0.2] * 5, "s"),
                "ungater": summarize([0.1] * 5, "s"),
                "ratio_median": 2.0,
                "ratio_p95": 2.0,
                "stalls": {"kueue": 0, "ungater": 0},
                "missing": {"kueue": 0, "ungater": 0},
            }
        },
        "over_cap": {"shrink": {"kueue": {"count": 0}, "ungater": {"count": 0}}},
        "floor": {"get_samples_ms": [1.0], "patch_samples_ms": [2.0]},
    }
    run = {"metrics": {"kueue": k}}
    whole = report_rows(run, "kueue")
    parts = {p: report_rows(run, f"kueue/{p}") for p in ("headline", "spans", "checks")}
    assert all(parts.values())
    assert sorted(r["metric"] for p in parts.values() for r in p) == sorted(
        r["metric"] for r in whole
    )
    assert all("ratio" in r["metric"] or "alone" in r["metric"] for r in parts["headline"])
    assert report_rows(run, "kueue/nothing") == []
    with pytest.raises(ValueError, match="unknown section"):
        report_rows(run, "nothing/headline")
