"""``python -m bench run`` stamps ``meta`` with the whole run's span and load average.

A Kueue-only run used to keep the meta of the empty plain pass that made it (0.6 s, and the
load average of that moment), not of the Kueue cases that took minutes. Here the control plane,
the plain pass and the Kueue run are stand-ins, on a clock the test moves.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import bench.__main__ as cli


def test_a_kueue_only_run_records_its_own_duration_and_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1000.0]
    loads = iter([[0.5, 0.4, 0.3], [3.1, 2.0, 1.0]])

    @contextmanager
    def cluster(kubeconfig: Path | None, version: str | None) -> Iterator[tuple[Path, str]]:
        clock[0] += 40  # the Kueue plane's start is part of the run
        yield tmp_path / "kubeconfig", "v0.19.2"

    async def empty_pass(opts: Any) -> dict[str, Any]:
        clock[0] += 0.6  # its own span, as run_all stamps it
        then = [1.2, 1.1, 1.0]
        meta = {"duration_seconds": 0.6, "load_average_before": then, "load_average_after": then}
        return {"meta": meta, "metrics": {}}

    async def kueue(*args: Any) -> dict[str, Any]:
        clock[0] += 429
        return {"mode": "each-alone", "kueue_version": "v0.19.2"}

    monkeypatch.setattr(cli, "_kueue_cluster", cluster)
    monkeypatch.setattr(cli, "run_all", empty_pass)
    monkeypatch.setattr(cli, "kueue_run", kueue)
    monkeypatch.setattr(cli, "table_rows", lambda metrics: [])
    monkeypatch.setattr(cli, "render_table", lambda rows: "")
    monkeypatch.setattr(cli, "_now", lambda: clock[0])
    monkeypatch.setattr(cli, "_load", lambda: next(loads))
    out = tmp_path / "run.json"
    assert cli.main(["run", "--only", "kueue", "--out", str(out)]) == 0
    meta = json.loads(out.read_text())["meta"]
    assert meta["duration_seconds"] == 469.6
    assert meta["load_average_before"] == [0.5, 0.4, 0.3]
    assert meta["load_average_after"] == [3.1, 2.0, 1.0]
