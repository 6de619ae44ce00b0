"""The big wave (bench/kueue_wave.py): its plan, the summary of one side's wave, the CPU between
two moments, Kueue's writes, the other work that keeps Kueue's limiter busy, its table rows and
verdicts; and that the default run leaves it out (it is run when named)."""

from __future__ import annotations

import math
from pathlib import Path

import anyio
import pytest

from bench.kueue_wave import cpu_between, parse_wave_plan, wave_rows, wave_summary


def test_a_plan_runs_a_story_under_the_default_limits_or_under_the_one_named() -> None:
    plan = parse_wave_plan("job-1k,jobs-100x100,job-10k@shipped")
    assert plan == {
        "shipped": ["job-1k", "jobs-100x100", "job-10k"],
        "raised": ["job-1k", "jobs-100x100"],
    }
    assert parse_wave_plan("smoke@raised") == {"raised": ["smoke"]}
    # equal limits only when named: the busy story's scale model, not a default
    busy = parse_wave_plan("job-1k@equal,job-1k-busy@equal,smoke")
    assert busy == {"shipped": ["smoke"], "raised": ["smoke"], "equal": ["job-1k", "job-1k-busy"]}
    twice = parse_wave_plan("job-1k,job-1k@raised")  # a story runs once under one limits
    assert twice == {"shipped": ["job-1k"], "raised": ["job-1k"]}


@pytest.mark.parametrize("bad", ["job-2k", "job-1k@fast"])
def test_a_plan_with_an_unknown_story_or_limits_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="unknown"):
        parse_wave_plan(bad)


def test_the_summary_times_from_the_first_admission_and_from_the_last_pod_created() -> None:
    s = wave_summary(
        t0=10.0,
        admitted=[10.5, 10.7],
        created=[11.0, 11.5, 12.5],
        released=[12.0, 13.0, 14.5],
    )
    assert s["pods"] == 3 and s["released"] == 3 and s["still_gated"] == 0
    assert math.isclose(s["quota_to_first_admission_s"], 0.5)
    assert math.isclose(s["quota_to_last_admission_s"], 0.7)
    assert math.isclose(s["admission_to_last_pod_created_s"], 2.0)
    assert math.isclose(s["admission_to_first_release_s"], 1.5)
    assert math.isclose(s["admission_to_median_release_s"], 2.5)
    assert math.isclose(s["admission_to_last_release_s"], 4.0)
    assert math.isclose(s["pods_created_to_last_release_s"], 2.0)
    assert math.isclose(s["release_span_s"], 2.5)
    assert math.isclose(s["releases_per_s"], 2 / 2.5)


def test_a_wave_with_a_pod_still_gated_has_no_last_release() -> None:
    s = wave_summary(t0=0.0, admitted=[1.0], created=[1.0, 1.0], released=[2.0, None])
    assert s["still_gated"] == 1 and s["released"] == 1
    assert s["admission_to_last_release_s"] is None
    assert s["pods_created_to_last_release_s"] is None
    assert math.isclose(s["admission_to_first_release_s"], 1.0)


def test_a_wave_never_admitted_says_so() -> None:
    s = wave_summary(t0=0.0, admitted=[], created=[], released=[])
    assert s["admissions"] == 0 and "admission_to_last_release_s" not in s


def test_cpu_between_takes_the_samples_that_cover_the_interval() -> None:
    samples = [
        (0.0, {"kueue": 1.0, "ungater": 5.0}),
        (1.0, {"kueue": 1.5, "ungater": 5.0}),
        (2.0, {"kueue": 2.5, "ungater": 6.0}),
        (3.0, {"kueue": 3.0}),
    ]
    got = cpu_between(samples, 1.2, 1.8)  # from the sample at 1.0 to the one at 2.0
    assert got == {"kueue": 1.0, "ungater": 1.0, "wall_seconds": 1.0}
    whole = cpu_between(samples, 0.0, 2.5)  # ungater's gone from the last sample: left out
    assert whole == {"kueue": round(2.0 / 3, 3), "wall_seconds": 3.0}
    busy = cpu_between(
        [(0.0, {"kueue": 0.0, "machine": 0.0}), (2.0, {"kueue": 1.0, "machine": 3.0})], 0, 2
    )
    assert busy == {"kueue": 0.5, "machine": 1.5, "others": 1.0, "wall_seconds": 2.0}
    assert cpu_between(samples, 0.0, 3.5) is None  # not covered


def test_the_rows_show_each_releasers_last_release_and_its_over_cap_judgement() -> None:
    side = {
        "admission_to_last_release_s": 4.0,
        "pods_created_to_last_release_s": None,
        "still_gated": 0,
        "over_cap": {"count": 0, "judged": 1000},
    }
    w = {
        "limits": {
            "shipped": {
                "client_limits": {"kueue": {"qps": 300, "burst": 500}},
                "stories": {"job-1k": {"kueue": side}},
            }
        }
    }
    rows = wave_rows(w)
    assert [r["metric"] for r in rows] == [
        "wave job-1k: admission to last release (Kueue)",
        "wave job-1k: last pod created to last release (Kueue)",
        "wave job-1k: releases past the cap (Kueue)",
    ]
    assert rows[0]["config"] == "shipped (300/500)" and rows[0]["median"] == 4.0
    assert rows[1]["n"] == 0
    assert rows[2]["median"] == 0 and rows[2]["status"] == "of 1000 judged"


def test_the_default_run_leaves_the_wave_out() -> None:
    from bench.runner import PLAIN, SCENARIOS, WAVE

    assert "kueue-wave" in SCENARIOS and "kueue-wave" in WAVE and "kueue-wave" not in PLAIN


def test_the_run_starts_a_plane_per_limits_with_kueues_limits_and_keeps_each_share(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json
    from collections.abc import Iterator
    from contextlib import contextmanager
    from typing import Any

    import bench.__main__ as cli

    planes: list[tuple[float, int] | None] = []

    @contextmanager
    def cluster(
        kubeconfig: Path | None,
        version: str | None,
        kueue_client: tuple[float, int] | None = None,
        pids: dict[str, int] | None = None,
    ) -> Iterator[tuple[Path, str]]:
        planes.append(kueue_client)
        assert pids is not None
        pids["kueue"] = 42
        yield tmp_path / "kubeconfig", "v0.19.2"

    async def empty_pass(opts: Any) -> dict[str, Any]:
        return {"meta": {"duration_seconds": 0.1}, "metrics": {}}

    async def wave(kc: Path, pids: dict[str, int], limits: str, stories: list[str], *a: Any) -> Any:
        progress = a[-1]
        got = {"stories": {s: {} for s in stories}, "pids": dict(pids)}
        progress(got)
        return got

    monkeypatch.setattr(cli, "_kueue_cluster", cluster)
    monkeypatch.setattr(cli, "run_all", empty_pass)
    monkeypatch.setattr(cli, "wave_run", wave)
    monkeypatch.setattr(cli, "render_table", lambda rows: "")
    out = tmp_path / "wave.json"
    argv = ["run", "--only", "kueue-wave", "--wave", "job-1k,job-10k@shipped", "--out", str(out)]
    assert cli.main(argv) == 0
    assert planes == [(300, 500), (1000, 2000)]
    w = json.loads(out.read_text())["metrics"]["kueue_wave"]
    assert w["limits"]["shipped"]["stories"] == {"job-1k": {}, "job-10k": {}}
    assert w["limits"]["raised"]["stories"] == {"job-1k": {}}
    assert w["limits"]["raised"]["pids"] == {"kueue": 42}
    partial = json.loads((tmp_path / "wave.d" / "kueue-wave.partial.json").read_text())
    assert partial["meta"] == {"duration_seconds": 0.1} and partial["partial"] is True


_BEFORE = """# HELP apiserver_request_duration_seconds x
apiserver_request_duration_seconds_sum{resource="pods",scope="resource",verb="PATCH"} 1.0
apiserver_request_duration_seconds_count{resource="pods",scope="resource",verb="PATCH"} 10
apiserver_request_duration_seconds_sum{resource="jobs",scope="resource",verb="PATCH"} 9.0
apiserver_request_duration_seconds_count{resource="jobs",scope="resource",verb="PATCH"} 9
apiserver_request_duration_seconds_bucket{resource="pods",verb="PATCH",le="0.1"} 10
"""
_AFTER = """apiserver_request_duration_seconds_sum{resource="pods",scope="resource",verb="PATCH"} 3.0
apiserver_request_duration_seconds_count{resource="pods",scope="resource",verb="PATCH"} 20
apiserver_request_duration_seconds_sum{resource="pods",scope="namespace",verb="PATCH"} 1.0
apiserver_request_duration_seconds_count{resource="pods",scope="namespace",verb="PATCH"} 10
apiserver_request_duration_seconds_sum{resource="pods",scope="resource",verb="GET"} 0.5
apiserver_request_duration_seconds_count{resource="pods",scope="resource",verb="GET"} 5
apiserver_request_duration_seconds_sum{resource="jobs",scope="resource",verb="PATCH"} 99.0
apiserver_request_duration_seconds_count{resource="jobs",scope="resource",verb="PATCH"} 99
apiserver_admission_webhook_admission_duration_seconds_sum{name="vpod.kb.io",operation="UPDATE",rejected="false",type="validating"} 2.5
apiserver_admission_webhook_admission_duration_seconds_count{name="vpod.kb.io",operation="UPDATE",rejected="false",type="validating"} 10
apiserver_flowcontrol_request_wait_duration_seconds_sum{execute="true",flow_schema="a",priority_level="workload-low"} 0.5
apiserver_flowcontrol_request_wait_duration_seconds_count{execute="true",flow_schema="a",priority_level="workload-low"} 50
"""


def test_server_costs_are_the_calls_and_their_mean_between_two_scrapes() -> None:
    from bench.kueue_wave import server_costs

    got = server_costs(_BEFORE, _AFTER)
    # pods' PATCHes over both scopes: 20 more calls, 3 s more: 150 ms each; jobs are left out
    assert got["pods"] == {
        "PATCH": {"count": 20, "mean_ms": 150.0},
        "GET": {"count": 5, "mean_ms": 100.0},
    }
    assert got["webhooks"] == {"vpod.kb.io UPDATE false": {"count": 10, "mean_ms": 250.0}}
    assert got["flowcontrol_wait"] == {"workload-low": {"count": 50, "mean_ms": 10.0}}
    assert server_costs(_AFTER, _AFTER) == {"pods": {}, "webhooks": {}, "flowcontrol_wait": {}}


_WRITES_BEFORE = """# TYPE apiserver_request_total counter
apiserver_request_total{code="201",component="apiserver",group="kueue.x-k8s.io",resource="workloads",scope="resource",subresource="",verb="POST",version="v1beta2"} 4
apiserver_request_total{code="200",component="apiserver",group="kueue.x-k8s.io",resource="workloads",scope="resource",subresource="status",verb="APPLY",version="v1beta2"} 1
apiserver_request_total{code="200",component="apiserver",group="kueue.x-k8s.io",resource="workloads",scope="namespace",subresource="",verb="LIST",version="v1beta2"} 7
"""
_WRITES_AFTER = """apiserver_request_total{code="201",component="apiserver",group="kueue.x-k8s.io",resource="workloads",scope="resource",subresource="",verb="POST",version="v1beta2"} 14
apiserver_request_total{code="409",component="apiserver",group="kueue.x-k8s.io",resource="workloads",scope="resource",subresource="",verb="POST",version="v1beta2"} 2
apiserver_request_total{code="200",component="apiserver",group="kueue.x-k8s.io",resource="workloads",scope="resource",subresource="status",verb="APPLY",version="v1beta2"} 11
apiserver_request_total{code="200",component="apiserver",group="kueue.x-k8s.io",resource="workloads",scope="namespace",subresource="",verb="LIST",version="v1beta2"} 70
apiserver_request_total{code="200",component="apiserver",group="kueue.x-k8s.io",resource="localqueues",scope="resource",subresource="status",verb="PATCH",version="v1beta2"} 3
apiserver_request_total{code="201",component="apiserver",group="batch",resource="jobs",scope="resource",subresource="",verb="POST",version="v1"} 50
"""


def test_kueues_writes_are_the_writes_to_its_own_objects_between_two_scrapes() -> None:
    from bench.kueue_wave import kueue_writes

    # refused writes count too (they drew a token); reads and other resources' writes do not
    assert kueue_writes(_WRITES_BEFORE, _WRITES_AFTER) == {
        "localqueues/status PATCH": 3,
        "workloads POST": 12,
        "workloads/status APPLY": 10,
    }
    assert kueue_writes(_WRITES_AFTER, _WRITES_AFTER) == {}


def _side(last: float, writes: dict[str, int] | None = None) -> dict[str, object]:
    return {
        "admission_to_last_release_s": last,
        "pods_created_to_last_release_s": 1.0,
        "over_cap": {"count": 0, "judged": 1000},
        "kueue_writes": writes,
        "cpu_cores": {"wave": {"wall_seconds": 10.0}},
    }


def test_each_story_is_judged_by_kueues_time_over_ungaters_and_shows_kueues_writes() -> None:
    limits = {"kueue": {"qps": 50, "burst": 100}, "ungater": {"qps": 50, "burst": 100}}
    stories = {
        "job-1k": {"kueue": _side(8.0), "ungater": _side(10.0)},
        "job-1k-busy": {"kueue": _side(30.0, {"workloads POST": 200}), "ungater": _side(10.0)},
    }
    rows = wave_rows({"limits": {"equal": {"client_limits": limits, "stories": stories}}})
    verdicts = {r["metric"]: r for r in rows if "ratio" in r["metric"]}
    slow = verdicts["wave job-1k: admission to last release, ratio Kueue/ungater"]
    assert slow["median"] == pytest.approx(0.8) and slow["status"] == "MISS"
    busy = verdicts["wave job-1k-busy: admission to last release, ratio Kueue/ungater"]
    assert busy["median"] == pytest.approx(3.0) and busy["status"] == "pass"
    writes = [r for r in rows if "writes" in r["metric"]]
    assert [(r["metric"], r["median"]) for r in writes] == [
        ("wave job-1k-busy: Kueue's writes to its objects (Kueue side)", 20.0)
    ]
    still = {"job-1k": {"kueue": _side(8.0), "ungater": {**_side(0.0), "still_gated": 3}}}
    rows = wave_rows({"limits": {"equal": {"client_limits": limits, "stories": still}}})
    assert not [r for r in rows if "ratio" in r["metric"]]  # no verdict on a wave that never ended


class _Jobs:
    """Records each Job created; ``hold`` keeps every create waiting (a slow server)."""

    def __init__(self, hold: bool = False) -> None:
        self.names: list[str] = []
        self.hold = hold
        self.kube = self

    async def create(self, resource: object, ns: str, body: dict[str, object]) -> dict[str, object]:
        self.names.append(str(body["metadata"]["name"]))  # type: ignore[index]
        if self.hold:
            await anyio.sleep_forever()
        return {"metadata": {"uid": f"u{len(self.names)}"}}


@pytest.mark.anyio
async def test_the_other_work_keeps_its_rate_and_bounds_what_is_in_flight() -> None:
    from bench import kueue_wave

    got = {"created": 0, "failed": 0, "skipped": 0}
    api = _Jobs()
    with anyio.move_on_after(0.5):
        await kueue_wave._busy(api, "ns", 40.0, "kueue", got)  # type: ignore[arg-type]
    # about 20 in half a second at 40 per second, on a fixed schedule
    assert 15 <= got["created"] <= 21 and got["failed"] == got["skipped"] == 0
    assert api.names[:2] == ["busy-kueue-1", "busy-kueue-2"]
    held = _Jobs(hold=True)
    got = {"created": 0, "failed": 0, "skipped": 0}
    with anyio.move_on_after(1.0):
        await kueue_wave._busy(held, "ns", 50.0, "u", got)  # type: ignore[arg-type]
    assert len(held.names) == kueue_wave._BUSY_IN_FLIGHT and got["skipped"] >= 10
