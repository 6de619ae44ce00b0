"""``python -m bench.dashboard [--out DIR] [--png FILE]``: record metrics beside the real Kueue
(about 4 minutes), answer the dashboard's queries with Prometheus's engine, photograph it.

``--scrapes DIR`` skips the recording and uses scrapes made before.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

from bench.dashboard import record, render
from ungater_devtools.devcluster.gotool import ensure_go_tool

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "helm" / "ungater" / "dashboards" / "ungater.json"
PANELQUERY = Path(__file__).with_name("panelquery") / "main.go"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.dashboard", description=__doc__)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "dashboard")
    p.add_argument("--scrapes", type=Path, help="use these scrapes instead of recording")
    p.add_argument("--png", type=Path, default=ROOT / "docs" / "dashboard.png")
    args = p.parse_args(argv)
    scrapes = args.scrapes
    if scrapes is None:
        scrapes = args.out / "scrapes"
        record.record(scrapes)
    tool = ensure_go_tool(
        "panelquery", PANELQUERY, "github.com/prometheus/prometheus", "v0.316.0", "1.26.7"
    )
    dashboard = render.load_json(DASHBOARD)
    with tempfile.TemporaryDirectory() as tmp:
        qfile = Path(tmp) / "queries.json"
        qfile.write_text(json.dumps(render.queries(dashboard)))
        proc = subprocess.run(
            [str(tool), "-scrapes", str(scrapes), "-queries", str(qfile), "-step", "2s"],
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
        )
    answer = json.loads(proc.stdout)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "series.json").write_text(json.dumps(answer))
    text = render.page(dashboard, answer)
    (args.out / "dashboard.html").write_text(text)
    render.screenshot(text, args.png)
    print(f"wrote {args.png} ({args.png.stat().st_size // 1024} KiB) from {scrapes}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
