"""``rulecheck`` (``rulecheck/main.go`` here), built from the Prometheus Go module.

It parses Prometheus rule files exactly as Prometheus loads them; the tests run it on the
chart's PrometheusRule and on the dashboard's queries.
"""

from __future__ import annotations

from pathlib import Path

from ungater_devtools.devcluster.gotool import ensure_go_tool

__all__ = ["PROMETHEUS_MODULE", "PROMETHEUS_VERSION", "ensure_rulecheck"]

PROMETHEUS_MODULE = "github.com/prometheus/prometheus"
PROMETHEUS_VERSION = "v0.316.0"
SOURCE = Path(__file__).with_name("rulecheck") / "main.go"


def ensure_rulecheck() -> Path:
    return ensure_go_tool("rulecheck", SOURCE, PROMETHEUS_MODULE, PROMETHEUS_VERSION, "1.26.7")
