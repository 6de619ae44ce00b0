"""Draws the dashboard (deploy/helm/ungater/dashboards/ungater.json) as a page of SVG charts laid
out on its own 24-column grid, from series that Prometheus's engine computed (``panelquery``),
and photographs the page with headless Chromium.

This is a preview of the dashboard's content (the same queries, titles, legends and layout),
not Grafana's rendering: Grafana itself cannot be built or installed on this machine.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

COLUMN_PX, ROW_PX, PAGE_PX = 66, 34, 24 * 66
PALETTE = ["#7eb26d", "#eab839", "#6ed0e0", "#ef843c", "#e24d42", "#1f78c1", "#ba43a9", "#705da0"]


def queries(dashboard: dict[str, Any]) -> list[dict[str, str]]:
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", ()):
            expr = target["expr"].replace("$namespace", ".*")
            out.append({"id": f"{panel['id']}/{target['refId']}", "expr": expr})
    return out


def _legend(fmt: str, metric: dict[str, str]) -> str:
    return (
        re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: metric.get(m.group(1), ""), fmt).strip() or "value"
    )


def _value(v: float, unit: str) -> str:
    if unit == "s":
        return f"{v * 1000:.0f} ms" if v < 1 else f"{v:.2f} s"
    suffix = "/s" if unit == "ops" else ""
    return (f"{v:.2f}" if v < 10 else f"{v:.0f}") + suffix


def _chart(
    panel: dict[str, Any],
    lines: list[tuple[str, list[list[float]]]],
    span: tuple[float, float],
    width: int,
    height: int,
) -> str:
    left, top, right, bottom = 44, 8, 8, 18
    w, h = width - left - right, height - top - bottom
    t0, t1 = span
    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
    out = [f'<svg width="{width}" height="{height}">']
    if panel["type"] == "state-timeline":
        band = h / max(1, len(lines))
        for i, (name, values) in enumerate(lines):
            y = top + i * band
            out.append(
                f'<text x="2" y="{y + band / 2 + 4:.0f}" class="tick">{html.escape(name)}</text>'
            )
            for (ta, va), (tb, _) in zip(
                values, [*values[1:], [values[-1][0] + 2.0, 0]], strict=False
            ):
                colour = PALETTE[0] if va >= 1 else "#3d3f45"
                xa = left + 60 + (ta - t0) / (t1 - t0) * (w - 60)
                xb = left + 60 + (tb - t0) / (t1 - t0) * (w - 60)
                out.append(
                    f'<rect x="{xa:.1f}" y="{y + 3:.1f}" width="{max(0.5, xb - xa) + 0.6:.1f}" '
                    f'height="{band - 6:.1f}" fill="{colour}"/>'
                )
        out.append("</svg>")
        return "".join(out)
    peak = max((v for _, vals in lines for _, v in vals), default=0.0)
    peak = peak * 1.15 if peak > 0 else 1.0
    for frac in (0, 0.5, 1):
        y = top + h - frac * h
        out.append(f'<line x1="{left}" x2="{left + w}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        out.append(
            f'<text x="{left - 4}" y="{y + 4:.1f}" class="tick" text-anchor="end">'
            f"{html.escape(_value(frac * peak, unit))}</text>"
        )
    for minute in range(0, int((t1 - t0) // 60) + 1):
        x = left + minute * 60 / (t1 - t0) * w
        out.append(f'<text x="{x:.1f}" y="{height - 4}" class="tick">{minute}m</text>')
    for i, (_, values) in enumerate(lines):
        points = " ".join(
            f"{left + (t - t0) / (t1 - t0) * w:.1f},{top + h - v / peak * h:.1f}" for t, v in values
        )
        out.append(
            f'<polyline points="{points}" fill="none" stroke="{PALETTE[i % len(PALETTE)]}" '
            'stroke-width="1.6"/>'
        )
    out.append("</svg>")
    return "".join(out)


def page(dashboard: dict[str, Any], answer: dict[str, Any]) -> str:
    span = (answer["start"], answer["end"])
    boxes = []
    for panel in dashboard["panels"]:
        g = panel["gridPos"]
        x, y, w, h = g["x"] * COLUMN_PX, g["y"] * ROW_PX, g["w"] * COLUMN_PX, g["h"] * ROW_PX
        style = f"left:{x}px;top:{y}px;width:{w - 8}px;height:{h - 8}px"
        if panel["type"] == "row":
            boxes.append(f'<div class="row" style="{style}">{html.escape(panel["title"])}</div>')
            continue
        lines: list[tuple[str, list[list[float]]]] = []
        for target in panel.get("targets", ()):
            for s in answer["series"].get(f"{panel['id']}/{target['refId']}", []):
                if s["values"]:
                    lines.append(
                        (_legend(target.get("legendFormat", ""), s["metric"]), s["values"])
                    )
        legend = (
            "".join(
                f'<span><i style="background:{PALETTE[i % len(PALETTE)]}"></i>{html.escape(n)}</span>'
                for i, (n, _) in enumerate(lines[:8])
            )
            if panel["type"] != "state-timeline"
            else ""
        )
        chart = (
            _chart(panel, lines, span, w - 8, h - 8 - 46)
            if lines
            else '<p class="empty">No data</p>'
        )
        boxes.append(
            f'<div class="panel" style="{style}"><h3>{html.escape(panel["title"])}</h3>'
            f'{chart}<div class="legend">{legend}</div></div>'
        )
    bottom = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in dashboard["panels"]) * ROW_PX
    return f"""<!doctype html><html><head><meta charset="utf-8"><style>
body {{ margin:0; background:#111217; color:#ccccdc; font:12px sans-serif; }}
header {{ padding:10px 12px; font-size:16px; }} header small {{ color:#8e8e9e; font-size:11px; }}
main {{ position:relative; width:{PAGE_PX}px; height:{bottom}px; margin:0 8px; }}
.panel {{ position:absolute; background:#181b1f; border:1px solid #2c3235; border-radius:2px; overflow:hidden; }}
.panel h3 {{ margin:6px 8px 2px; font-size:12px; font-weight:600; }}
.row {{ position:absolute; font-size:14px; font-weight:600; padding-top:6px; }}
.legend {{ padding:0 8px; font-size:10.5px; line-height:14px; }}
.legend span {{ margin-right:10px; white-space:nowrap; }}
.legend i {{ display:inline-block; width:10px; height:3px; margin-right:4px; vertical-align:middle; }}
.grid {{ stroke:#2c3235; }} .tick {{ fill:#8e8e9e; font-size:10px; }}
.empty {{ color:#8e8e9e; margin:30px; text-align:center; }}
</style></head><body><header>{html.escape(dashboard["title"])} <small>preview of
deploy/helm/ungater/dashboards/ungater.json: its queries answered by Prometheus's engine over
metrics recorded beside the real Kueue v0.17.0 (bench/dashboard)</small></header>
<main>{"".join(boxes)}</main></body></html>"""


def screenshot(html_text: str, png: Path, chromium: str = "chromium") -> None:
    exe = shutil.which(chromium) or chromium
    with tempfile.TemporaryDirectory() as tmp:
        page_file = Path(tmp) / "dashboard.html"
        page_file.write_text(html_text)
        height = int(re.search(r"height:(\d+)px; margin:0 8px", html_text).group(1)) + 60  # type: ignore[union-attr]
        subprocess.run(
            [
                exe,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={tmp}/profile",
                "--hide-scrollbars",
                f"--window-size={PAGE_PX + 16},{height}",
                f"--screenshot={png}",
                page_file.as_uri(),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )


def load_json(path: Path) -> Any:
    return json.loads(path.read_text())
