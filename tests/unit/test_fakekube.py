"""The in-memory API server behaves as the real one does where the controller can tell: each
watch late but in order, selector transitions, 410 mid-stream, silent streams, bookmarks, 409 on
create, pod update validation and finalizers. A fake that lies makes every test above it lie."""

from __future__ import annotations

from contextlib import aclosing
from typing import Any

import anyio
import pytest

from tests.fakekube import FakeKube
from tests.objects import GATE, JOBS, PODS, job_pod
from ungater._kube import ApiError, GoneError

NS = "team-a"
OWNER = {
    "apiVersion": "batch/v1",
    "kind": "Job",
    "metadata": {"name": "t", "namespace": NS, "uid": "u"},
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def collect(
    fake: FakeKube, n: int, selector: str = "", rv: str = "0", **kw: Any
) -> list[Any]:
    out: list[Any] = []
    stream = fake.watch(PODS, NS, rv, selector, **kw)
    async with aclosing(stream):  # type: ignore[type-var]
        async for event in stream:
            out.append(event)
            if len(out) == n:
                break
    return out


@pytest.mark.anyio
async def test_each_watch_keeps_its_order_but_watches_disagree_for_a_while() -> None:
    fake = FakeKube(seed=7, max_delay=0.05)
    got: dict[int, list[tuple[str, float]]] = {0: [], 1: []}

    async def watcher(i: int) -> None:
        stream = fake.watch(PODS, NS, "0")
        async with aclosing(stream):  # type: ignore[type-var]
            async for ev in stream:
                got[i].append((ev["object"]["metadata"]["resourceVersion"], anyio.current_time()))
                if len(got[i]) == 20:
                    return

    async with anyio.create_task_group() as tg:
        tg.start_soon(watcher, 0)
        tg.start_soon(watcher, 1)
        await anyio.sleep(0.01)
        for i in range(20):
            fake.put(PODS, job_pod(OWNER, i))
    for i in (0, 1):
        assert [int(rv) for rv, _ in got[i]] == sorted(int(rv) for rv, _ in got[i])
    # the same event reaches the two watches at different moments
    lags = [abs(a[1] - b[1]) for a, b in zip(got[0], got[1], strict=True)]
    assert max(lags) > 0.005


@pytest.mark.anyio
async def test_leaving_and_entering_a_selector_is_deleted_and_added() -> None:
    fake = FakeKube()
    pod = fake.put(PODS, job_pod(OWNER, 0))
    moved = {**pod, "metadata": {**pod["metadata"], "labels": {"other": "x"}}}
    fake.put(PODS, moved)
    fake.put(PODS, pod)
    events = await collect(fake, 3, "batch.kubernetes.io/job-name=t")
    assert [e["type"] for e in events] == ["ADDED", "DELETED", "ADDED"]
    assert events[1]["object"]["metadata"]["labels"]["batch.kubernetes.io/job-name"] == "t"
    assert events[1]["object"]["metadata"]["resourceVersion"] == "2"


@pytest.mark.anyio
async def test_gone_mid_stream_and_on_reconnect() -> None:
    fake = FakeKube()
    fake.put(PODS, job_pod(OWNER, 0))
    fake.put(PODS, job_pod(OWNER, 1))

    async def expire_soon() -> None:
        await anyio.sleep(0.05)
        assert fake.expire_watches() == 1

    async with anyio.create_task_group() as tg:
        tg.start_soon(expire_soon)
        with pytest.raises(GoneError):
            await collect(fake, 5, silence_seconds=2)
    with pytest.raises(GoneError):
        await collect(fake, 1, rv="1", silence_seconds=2)  # from before the compaction


@pytest.mark.anyio
async def test_a_stalled_watch_ends_only_by_the_silence_timeout() -> None:
    fake = FakeKube()

    async def stall_then_write() -> None:
        await anyio.sleep(0.02)
        fake.stall_watches()
        fake.put(PODS, job_pod(OWNER, 0))

    started = anyio.current_time()
    async with anyio.create_task_group() as tg:
        tg.start_soon(stall_then_write)
        with pytest.raises(TimeoutError):
            await collect(fake, 1, silence_seconds=0.3)
    assert anyio.current_time() - started >= 0.3


@pytest.mark.anyio
async def test_quiet_watch_sends_bookmarks_at_the_latest_version() -> None:
    fake = FakeKube(bookmark_interval=0.05)
    fake.put(PODS, job_pod(OWNER, 0))
    fake.put(JOBS, OWNER)
    events = await collect(fake, 2)
    assert events[0]["type"] == "ADDED"
    assert events[1] == {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "2"}}}


@pytest.mark.anyio
async def test_create_of_an_existing_name_is_a_conflict() -> None:
    fake = FakeKube()
    await fake.create(PODS, NS, job_pod(OWNER, 0))
    with pytest.raises(ApiError) as exc:
        await fake.create(PODS, NS, job_pod(OWNER, 0))
    assert exc.value.status == 409


@pytest.mark.anyio
async def test_pod_updates_are_validated_as_the_api_server_does() -> None:
    fake = FakeKube(strict=True)
    pod = fake.put(PODS, job_pod(OWNER, 0, gates=[GATE]))

    def refused(change: Any) -> str:
        new = fake.read(PODS, NS, pod["metadata"]["name"])
        assert new is not None
        change(new)
        with pytest.raises(ApiError) as exc:
            fake.put(PODS, new)
        assert exc.value.status == 422
        return exc.value.reason

    assert "only deletion" in refused(
        lambda p: p["spec"]["schedulingGates"].append({"name": "example.com/other"})
    )
    assert "spec" in refused(lambda p: p["spec"]["containers"].append({"name": "side"}))
    # while gated, nodeSelector may gain keys but not change them
    pod = fake.put(PODS, {**pod, "spec": {**pod["spec"], "nodeSelector": {"zone": "a"}}})
    assert "nodeSelector" in refused(lambda p: p["spec"]["nodeSelector"].update(zone="b"))
    released = fake.put(PODS, {**pod, "spec": {**pod["spec"], "schedulingGates": []}})
    assert not released["spec"]["schedulingGates"]
    assert refused(lambda p: p["spec"]["nodeSelector"].update(rack="1"))
    # and a patch is validated even when the test's own writes are not
    loose = FakeKube()
    pod = loose.put(PODS, job_pod(OWNER, 1, gates=[]))
    with pytest.raises(ApiError) as exc:
        await loose.json_patch(
            PODS,
            NS,
            pod["metadata"]["name"],
            [{"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GATE}]}],
        )
    assert exc.value.status == 422
    assert not loose.patches


@pytest.mark.anyio
async def test_a_pod_with_finalizers_terminates_until_they_are_removed() -> None:
    fake = FakeKube()
    raw = job_pod(OWNER, 0)
    raw["metadata"]["finalizers"] = ["batch.kubernetes.io/job-tracking"]
    name = fake.put(PODS, raw)["metadata"]["name"]
    fake.delete(PODS, NS, name)
    pod = fake.read(PODS, NS, name)
    assert pod is not None and pod["metadata"]["deletionTimestamp"]
    fake.finalize(PODS, NS, name)
    assert fake.read(PODS, NS, name) is None
    events = await collect(fake, 3)
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED", "DELETED"]
