"""The chart's PrometheusRule and the dashboard's queries, parsed by Prometheus's own rule
loader (``rulecheck``, built from the Prometheus Go module), and the dashboard ConfigMap."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.deploy import render
from tests.unit.deploy.dashboard import DASHBOARD, dashboard_exprs
from tests.unit.deploy.deploy_checks import by_kind, one
from ungater_devtools.ci import in_ci

pytestmark = [pytest.mark.integration]


@pytest.fixture(scope="module")
def rulecheck() -> Path:
    from tests.tools.rulecheck import ensure_rulecheck
    from ungater_devtools.devcluster.build import ControlPlaneUnavailable

    try:
        return ensure_rulecheck()
    except ControlPlaneUnavailable as exc:
        if in_ci():
            pytest.fail(f"rulecheck cannot be built under CI=true: {exc}", pytrace=False)
        pytest.skip(f"rulecheck cannot be built here: {exc}")


def check(
    rulecheck: Path, groups: list[dict[str, Any]], path: Path
) -> subprocess.CompletedProcess[str]:
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    return subprocess.run([str(rulecheck), str(path)], capture_output=True, text=True, timeout=60)


def test_prometheus_rule_loads_in_prometheus(helm: Path, rulecheck: Path, tmp_path: Path) -> None:
    assert not by_kind(render(helm), "PrometheusRule"), "off by default"
    objects = render(
        helm, prometheusRule={"enabled": True, "stalledMinutes": 20, "labels": {"release": "kps"}}
    )
    rule = one(objects, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kps"
    groups = rule["spec"]["groups"]
    proc = check(rulecheck, groups, tmp_path / "rules.yaml")
    assert proc.returncode == 0, proc.stderr
    assert "1 groups, 7 rules" in proc.stdout
    stalled = next(r for r in groups[0]["rules"] if r["alert"] == "UngaterPodsStalled")
    assert stalled["for"] == "20m"
    # the checker refuses what Prometheus would refuse
    broken = json.loads(json.dumps(groups))
    broken[0]["rules"][0]["expr"] = "max by (kind) (ungater_stood_down"
    bad = check(rulecheck, broken, tmp_path / "broken.yaml")
    assert bad.returncode == 1 and "parse error" in bad.stderr, bad.stderr


def test_dashboard_queries_parse_and_ship_in_a_config_map(
    helm: Path, rulecheck: Path, tmp_path: Path
) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    # Grafana fills $namespace in before it sends a query; any regex will do for the parser
    exprs = [e.replace("$namespace", ".*") for e in dashboard_exprs(dashboard)]
    recording = [{"record": f"ungater:panel_query_{i}", "expr": e} for i, e in enumerate(exprs)]
    proc = check(rulecheck, [{"name": "dashboard", "rules": recording}], tmp_path / "dash.yaml")
    assert proc.returncode == 0, proc.stderr
    assert f"{len(exprs)} rules" in proc.stdout

    objects = render(helm, grafanaDashboard={"enabled": True, "namespace": "monitoring"})
    cm = next(
        o for o in by_kind(objects, "ConfigMap") if o["metadata"]["name"].endswith("-dashboard")
    )
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["ungater.json"]) == dashboard
