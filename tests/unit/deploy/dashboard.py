"""The chart's Grafana dashboard, as the unit tests, the integration tests (which parse each query
with Prometheus's parser) and the bench's dashboard preview read it."""

from __future__ import annotations

from typing import Any

from tests.unit.deploy.deploy_checks import CHART

DASHBOARD = CHART / "dashboards" / "ungater.json"


def dashboard_exprs(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", ())]
