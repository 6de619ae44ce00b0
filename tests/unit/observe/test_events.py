"""Kubernetes Events against the in-memory API server: the first Event, repeats aggregated into
one with a count, the spam filter and global limit on a fake clock, a bounded queue, and an API
that fails or hangs without ever raising into the caller."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest

from tests.fakekube import FakeKube
from tests.polling import eventually
from ungater._kube.client import EVENTS, ApiError, Resource
from ungater._model.views import parse_workload
from ungater._observe.events import (
    FOREIGN_RELEASE,
    NORMAL,
    PLUGIN_ERROR,
    RELEASED,
    WARNING,
    EventRecorder,
    InvolvedObject,
    released_message,
)
from ungater._observe.metrics import Metrics

NS = "team-a"
WL = InvolvedObject("kueue.x-k8s.io/v1beta2", "Workload", NS, "job-train-1a2b3", "uid-wl-1")
OTHER = InvolvedObject("kueue.x-k8s.io/v1beta2", "Workload", NS, "job-eval-9f8e7", "uid-wl-2")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Clocks:
    """A monotonic clock and a wall clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0
        self.wall_start = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)

    def __call__(self) -> float:
        return self.now

    def wall(self) -> datetime:
        return self.wall_start + timedelta(seconds=self.now - 100.0)


def recorder(client: Any, clocks: Clocks | None = None, **kw: Any) -> EventRecorder:
    clocks = clocks or Clocks()
    return EventRecorder(client, host="ungater-0", clock=clocks, wall_clock=clocks.wall, **kw)


async def sent(rec: EventRecorder, *records: tuple[InvolvedObject, str, str, str]) -> None:
    """Run the recorder, record, and close it (close drains the queue)."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(rec.run)
        for r in records:
            rec.record(*r)
        await rec.close(timeout=5)


def events(fake: FakeKube) -> list[dict[str, Any]]:
    return sorted(fake.items(EVENTS, NS), key=lambda e: e["metadata"]["name"])


def test_released_message() -> None:
    assert released_message(3, "main") == "released 3 pods of pod set main"
    assert released_message(1, "workers") == "released 1 pod of pod set workers"


def test_involved_object_of_a_workload() -> None:
    wl = parse_workload(
        {
            "metadata": {"namespace": NS, "name": "w", "uid": "u1", "creationTimestamp": "x"},
            "spec": {"podSets": [{"name": "main", "count": 2}]},
        }
    )
    assert InvolvedObject.workload(wl, "v1beta2") == InvolvedObject(
        "kueue.x-k8s.io/v1beta2", "Workload", NS, "w", "u1"
    )
    assert InvolvedObject.workload(wl, "kueue.x-k8s.io/v1beta1").api_version.endswith("v1beta1")


@pytest.mark.anyio
async def test_first_event_is_created_with_every_field() -> None:
    fake = FakeKube()
    rec = recorder(fake)
    await sent(rec, (WL, NORMAL, RELEASED, released_message(3, "main")))
    [ev] = events(fake)
    assert ev["metadata"]["name"].startswith("job-train-1a2b3.")
    assert ev["involvedObject"] == {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "namespace": NS,
        "name": "job-train-1a2b3",
        "uid": "uid-wl-1",
    }
    assert ev["type"] == "Normal" and ev["reason"] == "Released"
    assert ev["message"] == "released 3 pods of pod set main"
    assert ev["source"] == {"component": "ungater", "host": "ungater-0"}
    assert ev["reportingComponent"] == "ungater" and ev["reportingInstance"] == "ungater-0"
    assert ev["firstTimestamp"] == ev["lastTimestamp"] == "2026-01-02T03:04:05Z"
    assert ev["count"] == 1
    assert rec.stats == {"created": 1}


@pytest.mark.anyio
async def test_repeats_are_aggregated_into_one_event_with_a_count() -> None:
    fake, clocks = FakeKube(), Clocks()
    rec = recorder(fake, clocks)
    async with anyio.create_task_group() as tg:
        tg.start_soon(rec.run)
        rec.record(WL, WARNING, FOREIGN_RELEASE, "gate removed from pod p-0 by someone else")
        clocks.now += 30
        rec.record(WL, WARNING, FOREIGN_RELEASE, "gate removed from pod p-0 by someone else")
        clocks.now += 30
        rec.record(WL, WARNING, FOREIGN_RELEASE, "gate removed from pod p-0 by someone else")
        rec.record(WL, WARNING, FOREIGN_RELEASE, "gate removed from pod p-1 by someone else")
        rec.record(OTHER, WARNING, FOREIGN_RELEASE, "gate removed from pod p-0 by someone else")
        await rec.close()
    evs = events(fake)
    assert len(evs) == 3
    [agg] = [e for e in evs if e["count"] > 1]
    assert agg["count"] == 3 and agg["involvedObject"]["uid"] == "uid-wl-1"
    assert agg["firstTimestamp"] == "2026-01-02T03:04:05Z"
    assert agg["lastTimestamp"] == "2026-01-02T03:05:05Z"
    assert rec.stats == {"created": 3, "aggregated": 2}


@pytest.mark.anyio
async def test_an_expired_event_is_created_again() -> None:
    fake = FakeKube()
    rec = recorder(fake)
    async with anyio.create_task_group() as tg:
        tg.start_soon(rec.run)
        rec.record(WL, WARNING, PLUGIN_ERROR, "plugin job failed: boom")
        await eventually(lambda: len(events(fake)) == 1, timeout=5, interval=0.005)
        fake.delete(EVENTS, NS, events(fake)[0]["metadata"]["name"])  # the server's event TTL
        rec.record(WL, WARNING, PLUGIN_ERROR, "plugin job failed: boom")
        await rec.close()
    [ev] = events(fake)
    assert ev["count"] == 1 and rec.stats == {"created": 2}


@pytest.mark.anyio
async def test_spam_filter_per_key_on_a_fake_clock() -> None:
    fake, clocks = FakeKube(), Clocks()
    rec = recorder(fake, clocks, burst=3, per_key_interval=60.0)
    accepted = [rec.record(WL, WARNING, PLUGIN_ERROR, f"failure {i}") for i in range(5)]
    assert accepted == [True, True, True, False, False]
    assert rec.record(WL, NORMAL, RELEASED, "released 1 pod of pod set main")  # another key
    assert rec.record(OTHER, WARNING, PLUGIN_ERROR, "failure 0")  # another object
    clocks.now += 59.0
    assert not rec.record(WL, WARNING, PLUGIN_ERROR, "failure 5")
    clocks.now += 1.0  # one token per minute
    assert rec.record(WL, WARNING, PLUGIN_ERROR, "failure 6")
    assert not rec.record(WL, WARNING, PLUGIN_ERROR, "failure 7")
    clocks.now += 3600.0  # refills to the burst, not beyond
    assert [rec.record(WL, WARNING, PLUGIN_ERROR, "again") for _ in range(4)] == [
        True,
        True,
        True,
        False,
    ]
    assert rec.stats == {"dropped_rate_limited": 5}
    await sent(rec)
    assert len(events(fake)) == 7  # 5 distinct failures, 1 release; the 3 "again" merge


@pytest.mark.anyio
async def test_global_limit_across_keys() -> None:
    fake, clocks = FakeKube(), Clocks()
    rec = recorder(fake, clocks, qps=2.0, global_burst=4)
    objs = [InvolvedObject("v1", "Workload", NS, f"w{i}", f"u{i}") for i in range(10)]
    accepted = [rec.record(o, NORMAL, RELEASED, "released 1 pod of pod set main") for o in objs]
    assert accepted == [True] * 4 + [False] * 6
    clocks.now += 1.0
    accepted = [rec.record(o, NORMAL, RELEASED, "released 1 pod of pod set main") for o in objs]
    assert accepted == [True] * 2 + [False] * 8
    await sent(rec)
    assert rec.stats["created"] == 4 and rec.stats["aggregated"] == 2


@pytest.mark.anyio
async def test_a_full_queue_drops_instead_of_blocking() -> None:
    fake = FakeKube()
    m = Metrics()
    rec = recorder(fake, queue_size=2, observer=m.observe_event)
    objs = [InvolvedObject("v1", "Workload", NS, f"w{i}", f"u{i}") for i in range(3)]
    assert [rec.record(o, NORMAL, RELEASED, "released 1 pod of pod set main") for o in objs] == [
        True,
        True,
        False,
    ]
    await sent(rec)  # the queued two are still sent once run() starts
    assert len(events(fake)) == 2
    assert rec.stats == {"dropped_queue_full": 1, "created": 2}
    text = m.render().decode()
    assert (
        'ungater_events_total{outcome="dropped_queue_full",reason="Released",type="Normal"} 1.0'
        in text
    )
    assert 'ungater_events_total{outcome="created",reason="Released",type="Normal"} 2.0' in text


class FailingKube(FakeKube):
    def __init__(self, exc: BaseException | None = None, hang: bool = False) -> None:
        super().__init__()
        self.exc = exc
        self.hang = hang
        self.calls = 0

    async def create(
        self, resource: Resource, namespace: str | None, body: dict[str, Any]
    ) -> dict[str, Any]:
        self.calls += 1
        if self.hang:
            await anyio.sleep_forever()
        if self.exc is not None:
            raise self.exc
        return await super().create(resource, namespace, body)


@pytest.mark.anyio
@pytest.mark.parametrize(
    "client",
    [
        FailingKube(ApiError(500, "Internal Server Error")),
        FailingKube(ApiError(403, "Forbidden: events is forbidden")),
        FailingKube(ConnectionResetError("reset")),
        FailingKube(RuntimeError("a bug in the client")),
        FailingKube(hang=True),
    ],
    ids=["500", "403", "reset", "bug", "hang"],
)
async def test_a_failing_api_never_raises_into_the_caller(client: FailingKube) -> None:
    rec = recorder(client, request_timeout=0.05)
    async with anyio.create_task_group() as tg:
        tg.start_soon(rec.run)
        for i in range(3):
            assert rec.record(WL, WARNING, PLUGIN_ERROR, f"failure {i}") is True
        with anyio.fail_after(5):
            await rec.close(timeout=5)
    assert client.calls == 3 and rec.stats == {"error": 3}
    assert rec.record(WL, WARNING, PLUGIN_ERROR, "after close") is False
    assert rec.stats["dropped_closed"] == 1


@pytest.mark.anyio
async def test_close_gives_up_on_a_backlog_after_its_timeout() -> None:
    client = FailingKube(hang=True)
    rec = recorder(client, request_timeout=60)
    async with anyio.create_task_group() as tg:
        tg.start_soon(rec.run)
        for i in range(3):
            rec.record(WL, WARNING, PLUGIN_ERROR, f"failure {i}")
        with anyio.fail_after(5):
            await rec.close(timeout=0.05)
    assert client.calls == 1  # the rest was dropped with the cancelled sender
    assert rec.stats == {"dropped_closed": 2}


@pytest.mark.injects(AttributeError, reason="record() is given None for the object on purpose")
def test_bad_input_is_dropped_not_raised() -> None:
    rec = recorder(FakeKube())
    assert rec.record(WL, "Info", RELEASED, "x") is False
    assert rec.record(InvolvedObject("v1", "Workload", NS, "w", ""), NORMAL, RELEASED, "x") is False
    assert rec.record(None, NORMAL, RELEASED, "x") is False  # type: ignore[arg-type]
    assert rec.stats == {"invalid": 2}
    with pytest.raises(ValueError):
        recorder(FakeKube(), burst=0)


@pytest.mark.anyio
async def test_long_messages_are_truncated() -> None:
    fake = FakeKube()
    rec = recorder(fake)
    await sent(rec, (WL, WARNING, PLUGIN_ERROR, "x" * 5000))
    [ev] = events(fake)
    assert len(ev["message"]) == 1024 and ev["message"].endswith("...")
