"""The shrink fence's slice reads (``FreshReads.refresh_slice``): every cached slice that may
turn out to be the active one is read in the same round trip, and the decision still rests
only on slices the fence read."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import anyio
import pytest

from tests.fakekube import FakeKube
from tests.objects import JOBS, WORKLOADS
from tests.unit.podfactory import NAMESPACE, job, workload
from ungater._controller.freshreads import FreshReads
from ungater._decide.decision import active_slice
from ungater._decide.indexes import OwnerKey, WorkloadIndex
from ungater._model.views import parse_workload
from ungater._observe.trace import Tracer

pytestmark = pytest.mark.anyio


class CountingGets:
    """The fake server's GET, held a moment, counting the reads in flight at once."""

    def __init__(self, fake: FakeKube) -> None:
        self.fake = fake
        self.in_flight = 0
        self.most = 0
        self.reads: list[str] = []

    async def get(self, resource: Any, namespace: str, name: str) -> Any:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        self.reads.append(name)
        try:
            await anyio.sleep(0.01)
            return self.fake.read(resource, namespace, name)
        finally:
            self.in_flight -= 1


def _finished(fake: FakeKube, wl: dict[str, Any]) -> dict[str, Any]:
    now = fake.read(WORKLOADS, NAMESPACE, wl["metadata"]["name"]) or {}
    now["status"]["conditions"].append(
        {"type": "Finished", "status": "True", "reason": "WorkloadSliceReplaced"}
    )
    return fake.put(WORKLOADS, now)


def _setup() -> tuple[FakeKube, CountingGets, FreshReads, OwnerKey, list[Any]]:
    """S1 (4) and its replacement S2 (6) both cached admitted; on the server S2 has finished
    since (replaced by a slice the cache has not seen), S1 too."""
    fake = FakeKube()
    j = fake.put(JOBS, job("train", parallelism=6, completions=8))
    s1 = fake.put(WORKLOADS, workload(j, {"main": 4}, admitted={"main": 4}, created=1))
    replaced = f"{NAMESPACE}/{s1['metadata']['name']}"
    s2 = fake.put(
        WORKLOADS,
        workload(
            j, {"main": 6}, admitted={"main": 6}, created=2, replacement_for=replaced, seed="s2"
        ),
    )
    index = WorkloadIndex()
    views = [parse_workload(w) for w in (s1, s2)]
    for v in views:
        assert v is not None
        index.on_change(None, v)
    _finished(fake, s2)
    _finished(fake, s1)
    client = CountingGets(fake)
    state = SimpleNamespace(
        workloads=index, client=client, trace=Tracer(), workload_version="v1beta2"
    )
    key = OwnerKey(NAMESPACE, j["metadata"]["uid"])
    return fake, client, FreshReads(state), key, index.for_owner(key.uid)  # type: ignore[arg-type]


async def test_every_slice_that_may_be_active_is_read_in_one_round_trip() -> None:
    _, client, reads, key, slices = _setup()
    assert active_slice(slices) is not None
    fresh = await reads.refresh_slice(key, slices)
    assert fresh == []  # both read finished: nothing to decide on
    assert sorted(client.reads) == sorted(w.name for w in slices)  # each read once
    assert client.most == 2  # at once, not one after the other


async def test_the_slice_left_active_is_one_the_fence_read() -> None:
    """S1 live again on the server (its replacement never took): after the reads it is the
    active slice, decided on as read."""
    fake, client, reads, key, slices = _setup()
    cached_active = active_slice(slices)
    s1 = next(w for w in slices if cached_active is not None and w.uid != cached_active.uid)
    obj = fake.read(WORKLOADS, NAMESPACE, s1.name) or {}
    obj["status"]["conditions"] = [
        c for c in obj["status"]["conditions"] if c["type"] != "Finished"
    ]
    fake.put(WORKLOADS, obj)
    fresh = await reads.refresh_slice(key, slices)
    active = active_slice(fresh)
    assert active is not None and active.uid == s1.uid and s1.name in client.reads
