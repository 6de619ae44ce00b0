"""The dashboard preview (bench/dashboard): every query is asked, every panel is drawn with
its legend, and an exited replica's series ends where its scrapes end."""

from __future__ import annotations

import re

from bench.dashboard import render
from tests.unit.deploy.dashboard import DASHBOARD

DASH = render.load_json(DASHBOARD)


def test_every_target_is_queried_with_the_namespace_variable_filled() -> None:
    asked = render.queries(DASH)
    assert len(asked) == sum(len(p.get("targets", ())) for p in DASH["panels"])
    assert all("$" not in q["expr"] for q in asked)
    assert len({q["id"] for q in asked}) == len(asked)


def test_each_panel_is_drawn_with_its_title_and_legend() -> None:
    first = next(p for p in DASH["panels"] if p.get("targets"))
    series = {
        f"{first['id']}/A": [
            {"metric": {"kind": "Job.batch", "pod_set": "main"}, "values": [[0, 1.0], [60, 2.0]]}
        ]
    }
    html = render.page(DASH, {"start": 0, "end": 120, "series": series})
    for panel in DASH["panels"]:
        assert panel["title"] in html
    assert "Job.batch main" in html  # legendFormat {{kind}} {{pod_set}}
    assert html.count("<polyline") == 1
    assert html.count("No data") == sum(1 for p in DASH["panels"] if p.get("targets")) - 1


def test_a_state_timeline_ends_with_its_last_sample() -> None:
    leader = next(p for p in DASH["panels"] if p["type"] == "state-timeline")
    series = {
        f"{leader['id']}/A": [
            {"metric": {"pod": "a"}, "values": [[0, 1.0], [2, 1.0], [4, 1.0]]},
        ]
    }
    html = render.page(DASH, {"start": 0, "end": 400, "series": series})
    widths = [float(w) for w in re.findall(r'<rect [^>]*width="([\d.]+)"', html)]
    assert len(widths) == 3
    assert sum(widths) < 0.05 * leader["gridPos"]["w"] * render.COLUMN_PX  # 6 s of 400 s
