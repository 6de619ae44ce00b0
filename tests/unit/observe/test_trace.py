"""The opt-in trace (``logging.trace``, ungater/_observe/trace.py): off, no trace point is
reached at all; on, one line per step of an owner's path, written at any log level, in a form
``bench/trace.py`` parses back into the wave's spans."""

from __future__ import annotations

import io
import json
import logging
import re
import time
from collections.abc import Iterator

import pydantic
import pytest

from bench.trace import Point, parse_line, parse_log, wave_spans
from tests.fakekube import FakeKube
from tests.objects import WORKLOADS, workload
from tests.polling import eventually
from tests.unit.controller.fake_jobs import make_config, released_indexes, setup_job
from tests.unit.harness import running
from ungater._controller.queue import WorkQueue
from ungater._decide.indexes import OwnerKey
from ungater._model.config import Config
from ungater._observe.logs import setup_logging
from ungater._observe.trace import LOGGER, Tracer

KEY = OwnerKey("team-a", "uid-train")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def traced(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


# -- the config --------------------------------------------------------------------------------


def test_the_trace_is_off_unless_the_config_turns_it_on() -> None:
    assert Config().logging.trace is False
    assert Config.model_validate({"logging": {"trace": True}}).logging.trace is True
    for wrong in ("true", 1, "yes"):
        with pytest.raises(pydantic.ValidationError):
            Config.model_validate({"logging": {"trace": wrong}})


# -- the line --------------------------------------------------------------------------------


def test_a_point_is_one_line_of_monotonic_time_point_key_and_fields(
    caplog: pytest.LogCaptureFixture,
) -> None:
    before = time.monotonic()
    Tracer(True).point(
        "enqueue", KEY, delay=0.05, dup=False, name='a b"c\\d', none=None, empty="", n=3
    )
    after = time.monotonic()
    (line,) = traced(caplog)
    m = re.fullmatch(
        r"TRACE (\d+\.\d{6}) enqueue key=team-a/uid-train delay=0\.050000 dup=false "
        r"name=a_b_c_d none=- empty=- n=3",
        line,
    )
    assert m is not None, line
    assert before - 1e-6 <= float(m.group(1)) <= after + 1e-6
    p = parse_line(line)
    assert p == Point(
        float(m.group(1)),
        "enqueue",
        "team-a/uid-train",
        {
            "delay": "0.050000",
            "dup": "false",
            "name": "a_b_c_d",
            "none": "-",
            "empty": "-",
            "n": "3",
        },
    )


@pytest.fixture
def root_logging() -> Iterator[None]:
    """setup_logging replaces the root handlers: put them back afterwards."""
    root, aio = logging.getLogger(), logging.getLogger("aiohttp")
    handlers, level, aio_level = root.handlers[:], root.level, aio.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        aio.setLevel(aio_level)


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_trace_lines_are_written_at_log_level_info_and_parse_back(
    fmt: str, root_logging: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    setup_logging("INFO", fmt)  # as `ungater run` does, before the controller is built
    tracer = Tracer(True)
    logging.getLogger("ungater.controller").debug("not at INFO")
    tracer.point("decided", KEY, releases=2)
    lines = err.getvalue().splitlines()
    assert len(lines) == 1, lines  # the trace line, not the debug one
    if fmt == "json":
        assert json.loads(lines[0])["logger"] == LOGGER
    p = parse_line(lines[0])
    assert p is not None and (p.point, p.key, dict(p.fields)) == (
        "decided",
        "team-a/uid-train",
        {"releases": "2"},
    )


def test_the_queue_traces_each_add_and_each_delay(caplog: pytest.LogCaptureFixture) -> None:
    q: WorkQueue[OwnerKey] = WorkQueue(trace=Tracer(True))
    q.add(KEY)
    q.add(KEY)
    points = [parse_line(line) for line in traced(caplog)]
    assert [(p.point, dict(p.fields)) for p in points if p] == [
        ("enqueue", {"dup": "false"}),
        ("enqueue", {"dup": "true"}),
    ]


# -- a wave, traced and not ------------------------------------------------------------------


async def a_wave(trace: bool) -> tuple[OwnerKey, float, float]:
    """A Job of 3 gated pods whose slice is admitted for 2 once the controller runs, in a new
    term the caches are not past: the deciding reconcile reads its pods (a quorum LIST), then
    the Job and its slice. The key, and the moments before the admission and after
    the releases were seen (the harness's t0 and t_end)."""
    fake = FakeKube()
    owner = setup_job(fake, 3)
    key = OwnerKey("team-a", owner["metadata"]["uid"])
    fake.put(WORKLOADS, workload(owner, "train-a", count=3))
    async with running(fake, make_config(logging={"trace": trace})) as ctl:
        assert ctl.state.trace.on is trace
        await eventually(lambda: bool(ctl.state.workloads.for_owner(key.uid)), what="the slice")
        ctl.state.freshness.begin_term(10**9)
        t0 = time.monotonic()
        fake.put(WORKLOADS, workload(owner, "train-a", count=3, admitted=2))
        await eventually(lambda: released_indexes(fake) == [0, 1], what="2 released")
        t_end = time.monotonic()
        await eventually(lambda: ctl.stats.released == 2, what="the answers")
        await eventually(
            lambda: not ctl.state.ledger.expectations.has_pending(key), what="the pod events"
        )
    return key, t0, t_end


@pytest.mark.anyio
async def test_off_no_trace_point_is_reached(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def reached(*args: object, **kw: object) -> None:
        raise AssertionError(f"a trace point was reached with the trace off: {args}")

    monkeypatch.setattr(Tracer, "point", reached)
    await a_wave(trace=False)
    assert not traced(caplog)


@pytest.mark.anyio
async def test_on_every_step_of_a_wave_is_traced_in_order(
    caplog: pytest.LogCaptureFixture,
) -> None:
    key, t0, t_end = await a_wave(trace=True)
    points = parse_log(traced(caplog))
    mine = points[str(key)]
    assert all(t0 - 1 < p.t < time.monotonic() for p in mine)

    def first(name: str, **fields: str) -> Point:
        found = [p for p in mine if p.point == name and fields.items() <= p.fields.items()]
        assert found, f"no {name} {fields} in {[(p.point, dict(p.fields)) for p in mine]}"
        return found[0]

    event = first("workload_event", admitted="true", workload="train-a")
    decided = next(p for p in mine if p.point == "decided" and p.fields["releases"] == "2")
    start = [p for p in mine if p.point == "reconcile_start" and p.t <= decided.t][-1]
    end = first("reconcile_end", outcome="decided")
    sent = [p for p in mine if p.point == "patch_sent"]
    answered = [p for p in mine if p.point == "patch_answered"]
    assert len(sent) == len(answered) == 2
    assert {p.fields["outcome"] for p in answered} == {"released"}
    assert {p.fields["pod"] for p in sent} == {p.fields["pod"] for p in answered}
    reads = {
        (p.point, p.fields["what"])
        for p in mine
        if start.t <= p.t <= decided.t and "what" in p.fields
    }
    assert reads == {(f"read_{e}", w) for e in ("start", "end") for w in ("owner", "slice", "pods")}
    assert first("read_end", what="pods").fields["items"] == "3"
    released = first("release_all", pods="2")
    assert any(p.point == "enqueue" and event.t <= p.t <= start.t for p in mine)
    assert event.t <= start.t < decided.t <= released.t <= min(p.t for p in sent)
    assert max(p.t for p in answered) <= end.t
    pod_events = {p.fields["pod"] for p in mine if p.point == "pod_event" and p.t > decided.t}
    assert {p.fields["pod"] for p in sent} <= pod_events  # each release seen by the watch

    spans = wave_spans(points, key.uid, t0, t_end)
    assert spans is not None
    assert spans.patches == 2 and {r.what for r in spans.reads} == {"owner", "slice", "pods"}
    assert spans.event is not None and spans.first_patch_sent is not None
    assert spans.last_patch_answered is not None
    assert 0 <= spans.event <= spans.reconcile_start < spans.decided < spans.first_patch_sent
    assert spans.first_patch_sent < spans.last_patch_answered
    assert all(spans.reconcile_start <= r.start_ms <= spans.decided for r in spans.reads)
