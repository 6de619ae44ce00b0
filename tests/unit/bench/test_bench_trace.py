"""bench/trace.py on a hand-made controller log: the trace points read back per owner among
other lines, a wave's spans from the harness's t0, one case's medians with the waves whose
trace is missing counted, and the floor's round trips on an in-memory server, cleaned up."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest

from bench.trace import (
    CONFIGMAPS,
    Read,
    measure_floor,
    parse_log,
    read_trace,
    summarize_waves,
    wave_spans,
)
from tests.fakekube import apply_json_patch
from ungater._kube.client import ApiError, Resource

NS = "bench"
A, B, C = "uid-a", "uid-b", "uid-c"
T0 = 5000.0


def text(t: float, rest: str) -> str:
    """A line as the harness writes it: its own seconds, then the controller's text line."""
    return f"{t - 4990:9.3f} 2025-01-01 10:00:00,000 DEBUG   ungater.trace: TRACE {t:.6f} {rest}"


def as_json(t: float, rest: str) -> str:
    body = {"ts": "2025-01-01T10:00:00.000Z", "level": "debug", "logger": "ungater.trace"}
    return f"{t - 4990:9.3f} " + json.dumps({**body, "msg": f"TRACE {t:.6f} {rest}"})


def wave_log(t0: float, uid: str, line: Any = text) -> list[str]:
    """One wave of owner ``uid``: the admission seen 2 ms after t0, a reconcile that decides
    nothing (the pods not yet seen), then the deciding one at 3 ms: reads of the owner (4..7
    ms) and of its slice (4..6 ms) at once, the decision at 8 ms, two patches sent at 9 and
    9.5 ms, answered at 12 and 15 ms (the last after the harness's end, at 14 ms)."""
    k = f"key={NS}/{uid}"
    at = [
        (0.0005, f"reconcile_start {k}"),  # the decision before: nothing to release
        (0.0010, f"decided {k} releases=0"),
        (0.0011, f"reconcile_end {k} outcome=decided"),
        (0.0020, f"workload_event {k} workload=w-1 rv=41 admitted=true deleted=false"),
        (0.0021, f"enqueue {k} dup=false"),
        (0.0030, f"reconcile_start {k}"),
        (0.0040, f"read_start {k} what=owner name=job-1"),
        (0.0040, f"read_start {k} what=slice name=w-1"),
        (0.0060, f"read_end {k} what=slice name=w-1"),
        (0.0070, f"read_end {k} what=owner name=job-1"),
        (0.0080, f"decided {k} releases=2"),
        (0.0081, f"release_all {k} pods=2"),
        (0.0090, f"patch_sent {k} pod=p-1"),
        (0.0095, f"patch_sent {k} pod=p-2"),
        (0.0120, f"patch_answered {k} pod=p-1 outcome=released"),
        (0.0130, f"pod_event {k} pod=p-1 gone=false"),
        (0.0150, f"patch_answered {k} pod=p-2 outcome=released"),
        (0.0151, f"reconcile_end {k} outcome=decided"),
    ]
    return [line(t0 + dt, rest) for dt, rest in at]


def a_log() -> list[str]:
    earlier = [  # a wave of A long before: outside the window
        text(T0 - 1.0, f"reconcile_start key={NS}/{A}"),
        text(T0 - 0.999, f"decided key={NS}/{A} releases=1"),
        text(T0 - 0.998, f"patch_sent key={NS}/{A} pod=p-0"),
        text(T0 - 0.997, f"patch_answered key={NS}/{A} pod=p-0 outcome=released"),
    ]
    other = [
        "   0.001 2025-01-01 10:00:00,000 INFO    ungater.controller: caches synced",
        "   0.002 TRACE of something else, not a trace point",
        "   0.003 2025-01-01 10:00:00,000 INFO    ungater.controller: released 2 pod(s)",
        "",
    ]
    # B's wave in the JSON format, interleaved with A's (lines in a log need not be in the
    # controller's time order: a line's order breaks ties only)
    lines = [*other[:2], *earlier, *wave_log(T0, A), *other[2:], *wave_log(T0 + 10, B, as_json)]
    return lines[:9] + lines[-5:] + lines[9:-5]


def test_the_log_is_read_back_per_owner_in_time_order_other_lines_ignored(
    tmp_path: Path,
) -> None:
    path = tmp_path / "controller.log"
    path.write_text("\n".join(a_log()) + "\n")
    points = read_trace(path)
    assert sorted(points) == [f"{NS}/{A}", f"{NS}/{B}"]
    a, b = points[f"{NS}/{A}"], points[f"{NS}/{B}"]
    assert len(a) == 4 + 18 and len(b) == 18
    assert [p.t for p in b] == sorted(p.t for p in b)
    assert b[0].point == "reconcile_start" and b[-1].point == "reconcile_end"
    wl = next(p for p in b if p.point == "workload_event")
    assert dict(wl.fields) == {
        "workload": "w-1",
        "rv": "41",
        "admitted": "true",
        "deleted": "false",
    }
    assert wl.t == pytest.approx(T0 + 10.002) and wl.owner_uid == B
    # the two reads started at the same moment keep the log's order
    reads = [p.fields["what"] for p in a if p.point == "read_start"]
    assert reads == ["owner", "slice"]


def test_a_wave_is_cut_into_spans_from_the_harness_t0() -> None:
    points = parse_log(a_log())
    spans = wave_spans(points, A, T0, T0 + 0.014)
    assert spans is not None
    ms = pytest.approx
    assert spans.event == ms(2.0)
    assert spans.reconcile_start == ms(3.0)  # the reconcile that released, not the one before
    assert spans.decided == ms(8.0)
    assert spans.reads == (
        Read("owner", "job-1", ms(4.0), ms(3.0)),
        Read("slice", "w-1", ms(4.0), ms(2.0)),
    )
    assert spans.first_patch_sent == ms(9.0)
    assert spans.last_patch_answered == ms(15.0)  # answered after the harness saw it
    assert spans.end == ms(14.0)
    assert (spans.reconciles, spans.patches) == (2, 2)
    # the answer is looked for past the window too
    tight = wave_spans(points, A, T0, T0 + 0.014, epsilon=0.0)
    assert tight is not None and tight.last_patch_answered == ms(15.0)
    # by namespace/uid as well, and B's in JSON lines alike
    assert wave_spans(points, f"{NS}/{A}", T0, T0 + 0.014) == spans
    b = wave_spans(points, B, T0 + 10, T0 + 10.014)
    assert b is not None and b.as_dict() == {**spans.as_dict()}
    assert spans.as_dict()["reads"][0] == {
        "what": "owner",
        "name": "job-1",
        "start": 4.0,
        "ms": 3.0,
    }


def test_a_wave_without_its_trace_is_none() -> None:
    points = parse_log(a_log())
    assert wave_spans(points, C, T0, T0 + 0.014) is None  # no trace of that owner at all
    # A traced, but nothing released in this window (its earlier wave is long before)
    assert wave_spans(points, A, T0 - 0.5, T0 - 0.4) is None
    assert wave_spans(parse_log([]), A, T0, T0 + 1) is None
    # traced in the window, but only a reconcile that released nothing
    assert wave_spans(points, A, T0, T0 + 0.0015, epsilon=0.0) is None


def test_a_read_that_never_ended_has_a_start_and_no_time() -> None:
    lines = wave_log(T0, A)
    lines = [ln for ln in lines if "read_end" not in ln or "owner" not in ln]  # cut short
    spans = wave_spans(parse_log(lines), A, T0, T0 + 0.014)
    assert spans is not None
    assert [(r.what, r.ms) for r in spans.reads] == [("owner", None), ("slice", pytest.approx(2))]


def test_a_case_is_summarized_by_medians_and_its_missing_waves_counted() -> None:
    points = parse_log(a_log() + wave_log(T0 + 20, C))
    waves = [
        wave_spans(points, A, T0, T0 + 0.014),
        wave_spans(points, B, T0 + 10, T0 + 10.020),  # ended later: end 20 ms
        wave_spans(points, C, T0 + 19.999, T0 + 20.016),  # t0 1 ms earlier: every span +1
        wave_spans(points, "uid-nowhere", T0, T0 + 1),  # not traced
    ]
    out = summarize_waves(waves)
    assert (out["waves"], out["missing"]) == (4, 1)
    assert out["event"] == {"median_ms": pytest.approx(2.0), "n": 3}
    assert out["reconcile_start"]["median_ms"] == pytest.approx(3.0)
    assert out["decided"]["median_ms"] == pytest.approx(8.0)
    assert out["first_patch_sent"]["median_ms"] == pytest.approx(9.0)
    assert out["last_patch_answered"]["median_ms"] == pytest.approx(15.0)
    assert out["end"] == {"median_ms": pytest.approx(17.0), "n": 3}
    assert out["read_owner"] == {
        "start_median_ms": pytest.approx(4.0),
        "median_ms": pytest.approx(3.0),
        "n": 3,
    }
    assert out["read_slice"]["median_ms"] == pytest.approx(2.0)
    assert out["reconciles"] == {"median": 2, "n": 3}
    nothing = summarize_waves([None, None])
    assert (nothing["waves"], nothing["missing"]) == (2, 2)
    assert nothing["decided"]["n"] == 0 and math.isnan(nothing["decided"]["median_ms"])


# -- the floor ---------------------------------------------------------------------------------


class MemoryKube:
    """The calls measure_floor makes, on objects in memory (JSON patches as the API server
    applies them: a failed ``test`` is a 422)."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.calls: list[str] = []

    async def create(self, res: Resource, ns: str, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append("create")
        obj = copy.deepcopy(body)
        self.objects[(res.plural, ns, obj["metadata"]["name"])] = obj
        return obj

    async def get(self, res: Resource, ns: str, name: str) -> dict[str, Any] | None:
        self.calls.append("get")
        return copy.deepcopy(self.objects.get((res.plural, ns, name)))

    async def json_patch(
        self, res: Resource, ns: str, name: str, ops: list[dict[str, Any]]
    ) -> dict[str, Any]:
        self.calls.append("patch")
        key = (res.plural, ns, name)
        if key not in self.objects:
            raise ApiError(404, "Not Found")
        self.objects[key] = apply_json_patch(self.objects[key], ops)
        return self.objects[key]

    async def delete(self, res: Resource, ns: str, name: str) -> bool:
        self.calls.append("delete")
        return self.objects.pop((res.plural, ns, name), None) is not None


class Api:
    def __init__(self) -> None:
        self.kube = MemoryKube()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_the_floor_on_a_configmap_of_its_own_deletes_it() -> None:
    api = Api()
    out = await measure_floor(api, NS, rounds=5)  # type: ignore[arg-type]
    assert api.kube.objects == {}
    # created, 5 gets, the label put on, 5 guarded patches, deleted
    assert api.kube.calls == ["create", *["get"] * 5, *["patch"] * 6, "delete"]
    assert out["rounds"] == 5 and len(out["get_samples_ms"]) == len(out["patch_samples_ms"]) == 5
    assert out["object"].startswith(f"ConfigMap {NS}/ungater-bench-floor-")
    assert out["get_ms"] >= 0 and out["patch_ms"] >= 0


@pytest.mark.anyio
@pytest.mark.parametrize("labels", [None, {"app": "x"}])
async def test_the_floor_on_a_given_object_leaves_it_as_found(
    labels: dict[str, str] | None,
) -> None:
    api = Api()
    meta: dict[str, Any] = {"name": "job-1", "namespace": NS}
    if labels is not None:
        meta["labels"] = dict(labels)
    found = {"metadata": meta, "spec": {"parallelism": 2}}
    jobs = Resource("batch", "v1", "jobs", "Job")
    api.kube.objects[("jobs", NS, "job-1")] = copy.deepcopy(found)
    out = await measure_floor(api, NS, "job-1", resource=jobs, rounds=3)  # type: ignore[arg-type]
    assert api.kube.objects == {("jobs", NS, "job-1"): found}
    assert api.kube.calls == [*["get"] * 3, *["patch"] * 5]
    assert out["object"] == f"Job {NS}/job-1" and out["rounds"] == 3


@pytest.mark.anyio
async def test_the_floor_cleans_up_when_a_patch_fails() -> None:
    api = Api()
    broken = api.kube.json_patch
    patched = 0

    async def fails_third(*args: Any) -> dict[str, Any]:
        nonlocal patched
        patched += 1
        if patched == 3:
            raise ApiError(500, "Internal Server Error")
        return await broken(*args)

    api.kube.json_patch = fails_third  # type: ignore[method-assign]
    with pytest.raises(ApiError):
        await measure_floor(api, NS, rounds=5)  # type: ignore[arg-type]
    assert api.kube.objects == {} and api.kube.calls[-1] == "delete"
    assert CONFIGMAPS.plural == "configmaps"


def test_the_wave_of_a_pod_is_the_reconcile_that_sent_its_patch_not_an_earlier_one() -> None:
    """A freed slot refilled just before the trigger releases in the window too: named by the
    pod the harness saw last, the wave is the decision that patched that pod."""
    k = f"key={NS}/{A}"
    early = [
        (-0.020, f"reconcile_start {k}"),
        (-0.019, f"decided {k} releases=1"),
        (-0.018, f"patch_sent {k} pod=early"),
        (-0.010, f"patch_answered {k} pod=early outcome=released"),
        (-0.009, f"reconcile_end {k} outcome=decided"),
    ]
    lines = [text(T0 + dt, rest) for dt, rest in early] + wave_log(T0, A)
    points = parse_log(lines)
    first = wave_spans(points, A, T0, T0 + 0.014)
    assert first is not None and first.decided == pytest.approx(-19.0)  # without the pod
    named = wave_spans(points, A, T0, T0 + 0.014, pod="p-2")
    assert named is not None
    assert named.decided == pytest.approx(8.0) and named.patches == 2
    assert wave_spans(points, A, T0, T0 + 0.014, pod="never-patched") is None
