"""The in-memory API server behaves as the real one does where the controller can tell: each
watch late but in order, selector transitions, 410 mid-stream, silent streams, bookmarks, 409 on
create, pod update validation and finalizers; and it produces on demand what a real one does
only sometimes: one client's watch lagging alone, patches refused, failed, timed out and landing
after the client gave up, another writer removing our gate, all on a virtual clock. A fake that
lies makes every test above it lie."""

from __future__ import annotations

import time
from contextlib import aclosing
from typing import Any

import anyio
import pytest

from tests.fakekube import Committed, FakeKube, PatchFault, VirtualTimeLoop
from tests.objects import GATE, JOBS, PODS, job_pod
from ungater._kube.client import ApiError, GoneError

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


VIRTUAL = pytest.mark.parametrize(
    "anyio_backend", [pytest.param(("asyncio", {"loop_factory": VirtualTimeLoop}), id="virtual")]
)
RELEASE = [
    {"op": "test", "path": "/spec/schedulingGates/0/name", "value": GATE},
    {"op": "remove", "path": "/spec/schedulingGates/0"},
]


def gates(fake: FakeKube, name: str) -> list[str]:
    pod = fake.read(PODS, NS, name)
    assert pod is not None
    return [g["name"] for g in pod["spec"].get("schedulingGates") or []]


@VIRTUAL
@pytest.mark.anyio
async def test_the_virtual_clock_jumps_over_sleeps() -> None:
    wall = time.monotonic()
    start = anyio.current_time()
    await anyio.sleep(500)
    with anyio.move_on_after(30):
        await anyio.sleep_forever()
    assert anyio.current_time() - start == pytest.approx(530)
    assert time.monotonic() - wall < 5


@VIRTUAL
@pytest.mark.anyio
async def test_one_clients_watch_is_held_while_another_of_the_same_pod_flows() -> None:
    fake = FakeKube(bookmark_interval=0.05)
    got: dict[str, list[tuple[str, float]]] = {"a": [], "b": []}

    async def watcher(name: str) -> None:
        stream = fake.client(name).watch(PODS, NS, "0", silence_seconds=100)
        async with aclosing(stream):  # type: ignore[type-var]
            async for ev in stream:
                got[name].append((ev["type"], anyio.current_time()))
                if ev["type"] == "MODIFIED":
                    return

    held = fake.lag_watches("pods", client="a")
    async with anyio.create_task_group() as tg:
        tg.start_soon(watcher, "a")
        tg.start_soon(watcher, "b")
        await anyio.sleep(0.01)
        assert sorted(fake.open_watches("pods")) == ["", ""]
        pod = fake.put(PODS, job_pod(OWNER, 0, gates=[GATE]))
        await fake.json_patch(PODS, NS, pod["metadata"]["name"], RELEASE)
        await anyio.sleep(5)
        # b saw the pod created and released; a saw nothing, not even a bookmark (one would
        # move its resourceVersion past the events it has not had)
        assert [t for t, _ in got["b"] if t != "BOOKMARK"] == ["ADDED", "MODIFIED"]
        assert got["a"] == []
        held.release()
    assert [t for t, _ in got["a"]] == ["ADDED", "MODIFIED"]
    assert got["a"][0][1] >= 5


@VIRTUAL
@pytest.mark.anyio
async def test_a_lag_picks_one_stream_by_client_and_selector_and_can_delay_it() -> None:
    fake = FakeKube()
    arrived: dict[str, float] = {}

    async def watcher(label: str, client: str, selector: str) -> None:
        stream = fake.client(client).watch(PODS, NS, "0", selector, silence_seconds=100)
        async with aclosing(stream):  # type: ignore[type-var]
            async for _ in stream:
                arrived[label] = anyio.current_time()
                return

    fake.lag_watches("pods", client="a", selector="job-name", delay=2.0)
    async with anyio.create_task_group() as tg:
        tg.start_soon(watcher, "a-job", "a", "batch.kubernetes.io/job-name=t")
        tg.start_soon(watcher, "a-all", "a", "")
        tg.start_soon(watcher, "b-job", "b", "batch.kubernetes.io/job-name=t")
        await anyio.sleep(0.01)
        fake.put(PODS, job_pod(OWNER, 0))
    assert arrived["a-job"] == pytest.approx(2.01)
    assert arrived["a-all"] == arrived["b-job"] == pytest.approx(0.01)


@VIRTUAL
@pytest.mark.anyio
async def test_a_lag_on_the_open_streams_only_is_escaped_by_a_reconnect() -> None:
    fake = FakeKube()
    result: list[list[Any]] = []

    async def first() -> None:
        with anyio.move_on_after(1):
            result.append(await collect(fake, 1, silence_seconds=100))
            return
        result.append([])

    async with anyio.create_task_group() as tg:
        tg.start_soon(first)
        await anyio.sleep(0.01)
        fake.lag_watches("pods", open_only=True)
        fake.put(PODS, job_pod(OWNER, 0))
    assert result == [[]]  # the open stream held it for the whole second
    await first()  # a new stream is not held
    assert len(result[1]) == 1


@VIRTUAL
@pytest.mark.anyio
async def test_refused_and_errored_patches_are_never_committed() -> None:
    fake = FakeKube()
    seen: list[Committed] = []
    name = fake.put(PODS, job_pod(OWNER, 0, gates=[GATE]))["metadata"]["name"]
    fake.observers.append(seen.append)
    for fault, status in (
        (PatchFault.refused(), 403),
        (PatchFault.refused(422, 'admission webhook "x" denied the request'), 422),
        (PatchFault.errored(), 500),
    ):
        fake.fail_patch(fault, name=name)
        with pytest.raises(ApiError) as exc:
            await fake.json_patch(PODS, NS, name, RELEASE)
        assert exc.value.status == status
    await anyio.sleep(60)
    assert gates(fake, name) == [GATE] and not seen and not fake.patches
    await fake.json_patch(PODS, NS, name, RELEASE)  # a fault is used once
    assert gates(fake, name) == []
    assert [(c.by, c.sent_at, c.sent_rv) for c in seen] == [("patch:", 60.0, 1)]


@VIRTUAL
@pytest.mark.anyio
async def test_a_timed_out_patch_lands_after_the_client_gave_up() -> None:
    fake = FakeKube()
    seen: list[Committed] = []
    fake.observers.append(seen.append)
    name = fake.put(PODS, job_pod(OWNER, 0, gates=[GATE]))["metadata"]["name"]
    fake.fail_patch(PatchFault.timed_out(answer_after=1.0, lands_after=3.0), client="ctl")
    with pytest.raises(TimeoutError):
        await fake.client("ctl").json_patch(PODS, NS, name, RELEASE)
    assert anyio.current_time() == pytest.approx(1.0)
    await anyio.sleep(1.5)
    assert gates(fake, name) == [GATE]  # the client gave up; the server has not written yet
    await anyio.sleep(1.0)
    assert gates(fake, name) == []
    assert [(c.by, c.sent_at, c.sent_rv) for c in seen[1:]] == [("late:ctl", 0.0, 1)]
    assert [p.state for p in fake.late_patches] == ["landed"]


@VIRTUAL
@pytest.mark.anyio
async def test_a_504_may_hide_a_committed_write() -> None:
    fake = FakeKube()
    name = fake.put(PODS, job_pod(OWNER, 0, gates=[GATE]))["metadata"]["name"]
    fake.fail_patch(PatchFault.timed_out(answer_after=2.0, lands_after=0.0, status=504))
    with pytest.raises(ApiError) as exc:
        await fake.json_patch(PODS, NS, name, RELEASE)
    assert exc.value.status == 504
    assert gates(fake, name) == []


@VIRTUAL
@pytest.mark.anyio
async def test_held_late_patches_land_when_the_test_says_or_never() -> None:
    fake = FakeKube()
    names = [fake.put(PODS, job_pod(OWNER, i, gates=[GATE]))["metadata"]["name"] for i in range(3)]
    fake.patch_policy = lambda ns, name, client: PatchFault.timed_out(held=True)
    for n in names:
        with pytest.raises(TimeoutError):
            await fake.json_patch(PODS, NS, n, RELEASE)
    await anyio.sleep(100)
    assert all(gates(fake, n) == [GATE] for n in names)
    landing, dropped, stale = fake.late_patches
    dropped.drop()
    assert fake.foreign_release(NS, names[2], GATE) is not None  # the gate went meanwhile
    assert landing.land() is not None and gates(fake, names[0]) == []
    assert dropped.land() is None and gates(fake, names[1]) == [GATE]
    assert stale.land() is None  # its guard no longer holds: nothing written
    assert [p.state for p in fake.late_patches] == ["landed", "dropped", "failed"]


@VIRTUAL
@pytest.mark.anyio
async def test_a_patch_with_a_server_timeout_never_lands_after_it() -> None:
    fake = FakeKube()
    names = [fake.put(PODS, job_pod(OWNER, i, gates=[GATE]))["metadata"]["name"] for i in range(2)]
    fake.patch_policy = lambda ns, name, client: PatchFault.timed_out(1.0, lands_after=5.0)
    for n, deadline in zip(names, (4.0, 10.0), strict=True):
        with pytest.raises(TimeoutError):
            await fake._json_patch(PODS, NS, n, RELEASE, server_timeout=deadline)
    await anyio.sleep(10)
    assert gates(fake, names[0]) == [GATE]  # its deadline passed before it could land
    assert gates(fake, names[1]) == []
    assert [p.state for p in fake.late_patches] == ["expired", "landed"]


@pytest.mark.anyio
async def test_a_foreign_writer_removes_our_gate_and_observers_see_every_write() -> None:
    fake = FakeKube()
    seen: list[Committed] = []
    fake.observers.append(seen.append)
    raw = job_pod(OWNER, 0, gates=[GATE, "example.com/other"])
    raw["metadata"]["finalizers"] = ["batch.kubernetes.io/job-tracking"]
    name = fake.put(PODS, raw)["metadata"]["name"]
    released = fake.foreign_release(NS, name, GATE)
    assert released is not None
    assert gates(fake, name) == ["example.com/other"]
    assert fake.foreign_release(NS, name, GATE) is None
    fake.delete(PODS, NS, name)
    fake.finalize(PODS, NS, name)
    assert [(c.by, c.etype, c.rv) for c in seen] == [
        ("put", "ADDED", 1),
        ("foreign", "MODIFIED", 2),
        ("delete", "MODIFIED", 3),
        ("finalize", "DELETED", 4),
    ]
    assert seen[1].old is not None and seen[1].old["metadata"]["resourceVersion"] == "1"
