"""The dashboard and the alerts speak of metrics ungater exports, and every alert has a
runbook. (tests/integration/test_observability.py renders them through helm and parses every
query with Prometheus's own parser.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.unit.deploy.dashboard import DASHBOARD, dashboard_exprs
from ungater._observe.metrics import Metrics

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "deploy" / "helm" / "ungater"
RULES = CHART / "templates" / "prometheusrule.yaml"
OPERATIONS = ROOT / "docs" / "operations.md"
_METRIC = re.compile(r"\b((?:ungater|workqueue)_[a-z_]+)")


def exported() -> set[str]:
    text = Metrics().render().decode()
    return set(re.findall(r"^# TYPE (\S+) ", text, re.M))


def referenced(expr: str) -> set[str]:
    return {re.sub(r"_(bucket|sum|count)$", "", m) for m in _METRIC.findall(expr)}


def test_every_dashboard_query_names_an_exported_metric() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    names = exported()
    exprs = dashboard_exprs(dashboard)
    assert len(exprs) >= 12
    for expr in exprs:
        used = referenced(expr)
        assert used, expr
        assert used <= names, f"{expr}: not exported: {sorted(used - names)}"


def test_every_alert_names_exported_metrics_and_has_a_runbook() -> None:
    text = RULES.read_text()
    alerts = re.findall(r"- alert: (\w+)", text)
    assert len(alerts) == 7, alerts
    exprs = re.findall(r"expr: (?:>-\n)?((?:.*\n)+?)\s+(?:for|labels):", text)
    assert len(exprs) == len(alerts)
    names = exported()
    for expr in exprs:
        assert referenced(expr) <= names, (
            f"{expr}: not exported: {sorted(referenced(expr) - names)}"
        )
    headings = {
        re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
        for h in re.findall(r"^#+ (.+)$", OPERATIONS.read_text(), re.M)
    }
    for alert in alerts:
        assert f'#{alert.lower()}"' in text, alert
        assert alert.lower() in headings, f"docs/operations.md has no runbook heading {alert}"


def test_dashboard_shows_what_an_operator_asks_about() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    used = set().union(*(referenced(e) for e in dashboard_exprs(dashboard)))
    wanted = {
        "ungater_pods_released_total",
        "ungater_release_latency_seconds",
        "ungater_release_wait_seconds",
        "ungater_gated_pods",
        "ungater_audit_findings",
        "ungater_stood_down",
        "ungater_pods_release_blocked",
        "workqueue_depth",
        "workqueue_retries_total",
        "ungater_watch_restarts_total",
        "ungater_watch_relists_total",
        "ungater_leader",
    }
    assert wanted <= used, sorted(wanted - used)
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    # panels never overlap on Grafana's 24-column grid
    cells: set[tuple[int, int]] = set()
    for p in dashboard["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not mine & cells, p["title"]
        cells |= mine
