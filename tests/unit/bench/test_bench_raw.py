"""The raw baseline (bench/raw.py) and the harness's side of it (bench/release.py), on a fake
API: one long-lived process serves every sample, its pool warmed before it says ready, and only
the window from "go" to the last release is metered."""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from bench.objects import CONTROLLER_UID, GATE
from bench.raw import serve
from bench.release import RawProcess, baseline_release

pytestmark = pytest.mark.anyio
CONCURRENCY = 4


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def pod(name: str, gated: bool = True) -> dict[str, Any]:
    gates = [{"name": "other/gate"}, {"name": GATE}] if gated else []
    return {"metadata": {"namespace": "ns", "name": name}, "spec": {"schedulingGates": gates}}


class FakeKube:
    """Answers after a moment; logs every call in order with the lines said and read."""

    def __init__(self, pods: dict[str, list[dict[str, Any]]], list_cpu_s: float = 0.0) -> None:
        self.pods = pods
        self.list_cpu_s = list_cpu_s  # CPU burnt listing: it must fall outside the window
        self.log: list[tuple[str, ...]] = []
        self.in_flight = 0
        self.most_in_flight: list[int] = []  # per warm-up
        self.patched: set[str] = set()
        self.all_patched = anyio.Event()

    async def list_objects(
        self, resource: Any, namespace: str, selector: str
    ) -> tuple[list[dict[str, Any]], str]:
        self.log.append(("list", selector))
        self.most_in_flight.append(0)
        end = time.process_time() + self.list_cpu_s
        while time.process_time() < end:
            pass
        return [dict(p) for p in self.pods[selector]], "7"

    async def get(self, resource: Any, namespace: str, name: str) -> dict[str, Any]:
        self.in_flight += 1
        self.most_in_flight[-1] = max(self.most_in_flight[-1], self.in_flight)
        await anyio.sleep(0.01)
        self.in_flight -= 1
        self.log.append(("get", name))
        return {}

    async def json_patch(
        self, resource: Any, namespace: str, name: str, ops: list[dict[str, Any]]
    ) -> dict[str, Any]:
        assert ops[0] == {"op": "test", "path": "/spec/schedulingGates/1/name", "value": GATE}
        self.log.append(("patch", name))
        self.patched.add(name)
        if len(self.patched) == sum(len(v) for v in self.pods.values()):
            self.all_patched.set()
        return {}

    async def watch(
        self, resource: Any, namespace: str, rv: str, selector: str, *timeouts: int
    ) -> AsyncIterator[dict[str, Any]]:
        self.log.append(("watch", selector, rv))
        try:
            yield {"type": "MODIFIED"}
            await anyio.sleep_forever()
        finally:
            self.log.append(("unwatch", selector))


def args(watch: bool = False) -> argparse.Namespace:
    return argparse.Namespace(namespace="ns", concurrency=CONCURRENCY, watch=watch)


async def run(kube: FakeKube, lines: list[str], watch: bool = False) -> list[tuple[str, ...]]:
    feed = iter(lines)

    async def read_line() -> str:
        line = next(feed, "")
        kube.log.append(("read", line))
        return line

    def say(line: str) -> None:
        kube.log.append(("say", line.split()[0]))

    await serve(kube, args(watch), read_line, say)
    return kube.log


async def test_one_process_serves_every_sample_on_a_pool_warmed_before_ready() -> None:
    kube = FakeKube({"a": [pod("a1"), pod("a2"), pod("a3", gated=False)], "b": [pod("b1")]})
    log = await run(kube, ["a\n", "go\n", "b\n", "go\n"])
    said = [e[1] for e in log if e[0] == "say"]
    assert said == ["ready", "done", "ready", "done"]  # both samples, then the input ended
    for selector in ("a", "b"):
        start = log.index(("list", selector))
        ready = log.index(("say", "ready"), start)
        go = log.index(("read", "go\n"), ready)
        # as many GETs as patches will be in flight, all at once, before "ready"
        assert [e[0] for e in log[start + 1 : ready]] == ["get"] * CONCURRENCY
        # nothing is patched before "go"
        assert all(e[0] != "patch" for e in log[start:go])
    assert kube.most_in_flight == [CONCURRENCY, CONCURRENCY]
    assert {e[1] for e in log if e[0] == "patch"} == {"a1", "a2", "b1"}  # the gated ones


async def test_the_watch_variant_watches_each_sample_from_its_listing_to_done() -> None:
    kube = FakeKube({"a": [pod("a1")], "b": [pod("b1")]})
    log = await run(kube, ["a\n", "go\n", "b\n", "go\n"], watch=True)
    for selector in ("a", "b"):
        watched = log.index(("watch", selector, "7"))
        assert log.index(("list", selector)) < watched < log.index(("say", "ready"), watched)
    # the first sample's watch is closed once it is done, before the second is listed
    assert log.index(("unwatch", "a")) < log.index(("list", "b"))
    assert ("unwatch", "b") in log


@asynccontextmanager
async def linked(kube: FakeKube, watch: bool = False) -> AsyncIterator[RawProcess]:
    """``serve`` on ``kube``, spoken to through the harness's ``RawProcess`` over pipes."""
    to_send, to_receive = anyio.create_memory_object_stream[bytes](16)
    from_send, from_receive = anyio.create_memory_object_stream[bytes](16)
    stdin = BufferedByteReceiveStream(to_receive)

    async def read_line() -> str:
        try:
            return (await stdin.receive_until(b"\n", 1024)).decode() + "\n"
        except (anyio.EndOfStream, anyio.IncompleteRead):
            return ""

    def say(line: str) -> None:
        from_send.send_nowait(f"{line}\n".encode())

    async with anyio.create_task_group() as tg:
        tg.start_soon(serve, kube, args(watch), read_line, say)
        yield RawProcess(to_send, from_receive, os.getpid())
        await to_send.aclose()  # the end of its input ends it


async def test_the_harness_runs_samples_one_after_the_other_in_one_process() -> None:
    kube = FakeKube({"a": [pod("a1"), pod("a2")], "b": [pod("b1")]})
    async with linked(kube) as raw:
        assert await raw.ready("a") == 2
        await raw.go()
        assert await raw.finished() >= 0
        assert await raw.ready("b") == 1
        await raw.go()
        await raw.finished()
    assert kube.patched == {"a1", "a2", "b1"}


class FakeObserver:
    def __init__(self, kube: FakeKube) -> None:
        self.kube = kube
        self.released_at: dict[str, float] = {}

    async def seen(self, uids: list[str], timeout: float) -> None:
        pass

    async def released(self, uids: list[str], timeout: float) -> float:
        await self.kube.all_patched.wait()
        now = time.monotonic()
        self.released_at.update(dict.fromkeys(uids, now))
        return now


class FakeApi:
    async def create_job(self, namespace: str, name: str, pods: int, run: str) -> dict[str, Any]:
        return {"metadata": {"uid": "job-uid"}}

    async def create_pods(
        self, job: dict[str, Any], indexes: range, run: str
    ) -> list[tuple[float, dict[str, Any]]]:
        return [(0.0, {"metadata": {"uid": f"u{i}"}}) for i in indexes]


class FakeBed:
    namespace = "ns"
    run = "r"

    def __init__(self, kube: FakeKube) -> None:
        self.api = FakeApi()
        self.observer = FakeObserver(kube)

    def name(self, stem: str) -> str:
        return stem

    async def clean(self, pods: int) -> None:
        pass


async def test_the_baseline_is_metered_from_go_not_while_it_lists_and_warms() -> None:
    selector = f"{CONTROLLER_UID}=job-uid"
    pods = [pod(f"p{i}") for i in range(8)]
    kube = FakeKube({selector: pods}, list_cpu_s=0.4)  # the listing burns 0.4 CPU-s
    async with linked(kube) as raw:
        got = await baseline_release(FakeBed(kube), raw, len(pods))  # type: ignore[arg-type]
    assert kube.patched == {p["metadata"]["name"] for p in pods}
    cpu_s = got.cpu["bench.raw"] * got.cpu["wall_seconds"]
    assert cpu_s < 0.2  # the window saw the patches, not the listing before "ready"
    assert got.pods == 8 and got.seconds >= 0
