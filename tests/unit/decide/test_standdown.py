"""Standing down when another writer keeps removing our gate, and /readyz's detail lines: the
pure parts. The controller end to end (and the slice hand-over grace for PodsUnmapped) is
tested in tests/unit/controller/test_stand_down.py."""

from __future__ import annotations

import aiohttp
import pytest

from ungater._decide.standdown import StandDown
from ungater._model.config import StandDownConfig
from ungater._observe.metrics import Metrics
from ungater._observe.server import HealthServer


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_a_kind_stood_down_resumes_once_no_foreign_release_is_seen_for_the_wait() -> None:
    """Issue 40's stuck gate: a stand-down is not for good. Each removal seen while down
    restarts the wait; ``resumeAfterSeconds: 0`` keeps the kind down."""
    now = [0.0]
    cfg = StandDownConfig.model_validate(
        {"foreignReleases": 1, "windowSeconds": 10, "resumeAfterSeconds": 60}
    )
    sd = StandDown(cfg, clock=lambda: now[0])
    assert sd.resume_at("Job.batch") is None  # not down
    assert sd.record("Job.batch", "g", "ns/a") is not None
    assert sd.resume_at("Job.batch") == 60.0
    now[0] = 50.0
    sd.still_at_work("Job.batch")
    assert sd.resume_at("Job.batch") == 110.0
    sd.resume("Job.batch")
    assert sd.resume_at("Job.batch") is None and "Job.batch" not in sd.tripped
    assert sd.record("Job.batch", "g", "ns/b") is not None  # it can trip again
    never = StandDown(
        StandDownConfig.model_validate({"foreignReleases": 1, "resumeAfterSeconds": 0}),
        clock=lambda: now[0],
    )
    assert never.record("Job.batch", "g", "ns/a") is not None
    assert never.resume_at("Job.batch") is None


def test_stand_down_trips_on_the_nth_foreign_release_within_the_window() -> None:
    now = [0.0]
    cfg = StandDownConfig.model_validate({"foreignReleases": 3, "windowSeconds": 10})
    sd = StandDown(cfg, clock=lambda: now[0])
    assert sd.record("Job.batch", "g", "ns/a") is None
    now[0] = 5.0
    assert sd.record("Job.batch", "g", "ns/b") is None
    assert sd.record("RayCluster.ray.io", "g", "ns/r") is None  # per kind
    now[0] = 11.0  # the first one left the window
    assert sd.record("Job.batch", "g", "ns/c") is None
    verdict = sd.record("Job.batch", "g", "ns/d")
    assert verdict is not None and verdict.count == 3 and verdict.action == "audit"
    assert "gate g" in verdict.message and "ns/d" in verdict.message
    assert "switched to audit mode" in verdict.message
    assert sd.record("Job.batch", "g", "ns/e") is None  # once
    keep = StandDown(
        StandDownConfig.model_validate({"foreignReleases": 1, "action": "keepReleasing"})
    )
    assert keep.record("Job.batch", "g", "a") is not None
    assert keep.record("Job.batch", "g", "b") is not None  # says so every time


@pytest.mark.anyio
async def test_readyz_shows_the_detail_lines() -> None:
    lines = ["Job.batch: audit (gate g); STOOD DOWN: because"]
    server = HealthServer(
        "127.0.0.1", 0, Metrics(), ready=lambda: True, healthy=lambda: True, detail=lambda: lines
    )
    async with server, aiohttp.ClientSession() as s:
        async with s.get(f"{server.url}/readyz") as r:
            assert r.status == 200
            assert await r.text() == "ok\n" + lines[0] + "\n"
        lines.clear()
        async with s.get(f"{server.url}/readyz") as r:
            assert await r.text() == "ok\n"

    def broken() -> list[str]:
        raise RuntimeError("nope")

    server = HealthServer(
        "127.0.0.1", 0, Metrics(), ready=lambda: False, healthy=lambda: True, detail=broken
    )
    async with server, aiohttp.ClientSession() as s, s.get(f"{server.url}/readyz") as r:
        assert r.status == 503
        assert (await r.text()).startswith("not ready\ndetail unavailable")
