"""The real-peer event recorder (``tests/integration/realpeers.py``, ``SliceWatch``) on the fake
API server: a history with a hole is never judged.

The story: a Job of 2 whose one admitted slice allows 1. Pod 0 is released and the recorder
sees it; then the pod watch is held while pod 1 is released (2 live released for a cap of 1)
and deleted, and the server can no longer serve the watch from where it stopped (410 Gone
mid-stream, an expired resourceVersion on resuming after a cut, or an ``ERROR`` event). The
release is in neither the watch nor a relist. The old recorder retried from its expired
resourceVersion until the test ended, and ``replay()`` judged the history without pod 1 and
passed; now the recorder relists, records the gap, and ``replay()`` and ``excess()`` refuse.
So do a recorder stopped before its relist got through and one that ran out of its watch rounds
(the old one stopped silently), and an event it cannot record fails the test at once (the old
one took it for a dropped connection). The controls: the same release seen (no fault, or a cut
it resumes from without a gap) is reported as the violation it is."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import pytest

from tests.fakekube import FakeKube
from tests.integration import realpeers
from tests.integration.k8s import Kube
from tests.integration.realpeers import UNGATER_GATE, SliceWatch, slice_watch
from tests.objects import JOBS, PODS, WORKLOADS, controller_uid, gates_of, job_pod, workload
from tests.polling import eventually
from tests.unit.podfactory import NAMESPACE, job
from ungater._kube.client import Resource

ROUNDS = 1000  # the recorder's watch rounds per resource (realpeers.WATCH_ROUNDS)
OVER = r"2 live released in main > min\(cap 1 of train-1, owner size 2\)"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class RawErrors:
    """The fake's client, but a watch from a compacted resourceVersion is answered as the
    real API server answers it: 200, then one ``ERROR`` event (a 410 Status), then the end."""

    def __init__(self, fake: FakeKube) -> None:
        self.fake = fake

    async def list_objects(
        self, resource: Resource, namespace: str | None, label_selector: str = ""
    ) -> tuple[list[dict[str, Any]], str]:
        return await self.fake.list_objects(resource, namespace, label_selector)

    def watch(self, resource: Resource, namespace: str | None, rv: str, *a: Any) -> Any:
        if int(rv or 0) >= self.fake.compacted_rv:
            return self.fake.watch(resource, namespace, rv, *a)
        return self._error()

    async def _error(self) -> AsyncIterator[dict[str, Any]]:
        self.fake.requests += 1
        status = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}
        yield {"type": "ERROR", "object": status}


class ListsFail:
    """The fake's client, but its lists fail (the API server away) once ``failing`` is set."""

    def __init__(self, fake: FakeKube) -> None:
        self.fake, self.failing, self.refused = fake, False, 0

    async def list_objects(
        self, resource: Resource, namespace: str | None, label_selector: str = ""
    ) -> tuple[list[dict[str, Any]], str]:
        if self.failing:
            self.refused += 1
            raise ConnectionRefusedError("the API server is away (test)")
        return await self.fake.list_objects(resource, namespace, label_selector)

    def watch(self, *a: Any) -> Any:
        return self.fake.watch(*a)


class Stub:
    """Lists from the fake; every watch is ``stream()`` (counted in ``watches``)."""

    def __init__(self, fake: FakeKube, stream: Callable[[Resource], AsyncIterator[Any]]) -> None:
        self.fake, self.stream, self.watches = fake, stream, 0

    async def list_objects(
        self, resource: Resource, namespace: str | None, label_selector: str = ""
    ) -> tuple[list[dict[str, Any]], str]:
        return await self.fake.list_objects(resource, namespace, label_selector)

    def watch(self, resource: Resource, *a: Any) -> AsyncIterator[Any]:
        self.watches += 1
        return self.stream(resource)


def story() -> tuple[FakeKube, dict[str, Any]]:
    """A Job of 2, its slice admitted for 1, its two pods gated."""
    fake = FakeKube()
    owner = job("train", parallelism=2)
    fake.put(JOBS, owner)
    fake.put(WORKLOADS, workload(owner, "train-1", 2, admitted=1))
    for i in (0, 1):
        fake.put(PODS, job_pod(owner, i, gates=[UNGATER_GATE]))
    return fake, owner


def recording(client: Any, owner: dict[str, Any]) -> Any:
    return slice_watch(
        Kube(client),
        NAMESPACE,
        JOBS,
        owner,
        size_of=lambda j: {"main": int(j["spec"]["parallelism"])},
        pod_set_of=lambda p: "main",
        owner_of_pod=controller_uid,
    )


def seen(watch: SliceWatch, name: str, released: bool | None = None, kind: str = "") -> bool:
    return any(
        e.resource == "pod"
        and e.obj["metadata"]["name"] == name
        and (released is None or (UNGATER_GATE not in gates_of(e.obj)) == released)
        and (not kind or e.kind == kind)
        for e in watch.events
    )


def release(fake: FakeKube, owner: dict[str, Any], i: int) -> int:
    """Pod ``i`` loses ungater's gate; its resourceVersion then."""
    pod = fake.put(PODS, job_pod(owner, i, gates=[]))
    return int(pod["metadata"]["resourceVersion"])


def name(owner: dict[str, Any], i: int) -> str:
    return str(job_pod(owner, i)["metadata"]["name"])


def expire_mid_stream(fake: FakeKube) -> None:
    assert fake.expire_watches("pods") == 1


def expire_then_cut(fake: FakeKube) -> None:
    fake.compact()
    assert fake.cut_watches("pods") == 1


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("fault", "raw_errors"),
    [(expire_mid_stream, False), (expire_then_cut, False), (expire_then_cut, True)],
    ids=["410-mid-stream", "expired-on-resume", "error-event"],
)
async def test_a_release_hidden_in_a_gap_fails_the_replay(
    fault: Callable[[FakeKube], None], raw_errors: bool
) -> None:
    fake, owner = story()
    client: Any = RawErrors(fake) if raw_errors else fake
    with pytest.raises(AssertionError) as caught:
        async with recording(client, owner) as watch:
            first = release(fake, owner, 0)
            await eventually(lambda: seen(watch, name(owner, 0), True), what="pod 0 released")
            fake.lag_watches("pods", open_only=True)  # the recorder's pod watch: held
            hidden = release(fake, owner, 1)  # 2 live released for a cap of 1
            fake.delete(PODS, NAMESPACE, name(owner, 1))
            gone = fake.rv
            requests = fake.requests
            fault(fake)
            # until the recorder recorded its relist (or, as the old one did, retried from its
            # expired resourceVersion ten times); the fake counts a LIST when it is asked, so
            # its count alone let the test stop the recorder before the answer was recorded
            await eventually(
                lambda: watch.relists.get("pod", 0) > 0 or fake.requests > requests + 10,
                what="a relist",
            )
            fake.put(PODS, job_pod(owner, 2, gates=[UNGATER_GATE]))  # after the gap
    assert isinstance(caught.value, realpeers.IncompleteHistory), caught.value
    assert not seen(watch, name(owner, 1), True), "the release was hidden, as the story says"
    (gap,) = watch.gaps
    assert gap.resource == "pod"
    assert gap.after_rv == first < hidden < gone <= (gap.until_rv or 0), gap
    assert "relisted after" in gap.why and "410" in gap.why, gap
    assert f"pod events after rv {first} up to rv {gap.until_rv}" in str(caught.value)
    assert watch.relists == {"pod": 1}
    # the relist recorded pod 1 gone, and the recorder went on watching
    assert any(e.relisted and e.kind == "DELETED" for e in watch.events), watch.events
    assert seen(watch, name(owner, 2))
    with pytest.raises(realpeers.IncompleteHistory, match="pod events after rv"):
        watch.excess()
    with pytest.raises(realpeers.IncompleteHistory):
        watch.replay(UNGATER_GATE)


@pytest.mark.anyio
async def test_stopped_before_its_relist_is_a_gap() -> None:
    """The 410 came, but no relist got through before the test ended: the gap runs to the end
    of the record."""
    fake, owner = story()
    client = ListsFail(fake)
    with pytest.raises(AssertionError, match="stopped with its watch down") as caught:
        async with recording(client, owner) as watch:
            first = release(fake, owner, 0)
            await eventually(lambda: seen(watch, name(owner, 0), True), what="pod 0 released")
            fake.lag_watches("pods", open_only=True)
            release(fake, owner, 1)
            fake.delete(PODS, NAMESPACE, name(owner, 1))
            client.failing = True
            requests = fake.requests
            assert fake.expire_watches("pods") == 1
            await eventually(
                lambda: client.refused >= 3 or fake.requests > requests + 10,
                what="relists refused (or, as the old recorder did, ten retries)",
            )
    assert isinstance(caught.value, realpeers.IncompleteHistory), caught.value
    (gap,) = watch.gaps
    assert (gap.resource, gap.after_rv, gap.until_rv) == ("pod", first, None), gap
    assert "410 Gone" in gap.why, gap


@pytest.mark.anyio
async def test_the_same_release_seen_is_a_violation() -> None:
    """Control: with no fault the recorder sees pod 1's release and the replay reports it."""
    fake, owner = story()
    with pytest.raises(AssertionError, match=OVER):
        async with recording(fake, owner) as watch:
            release(fake, owner, 0)
            release(fake, owner, 1)
            fake.delete(PODS, NAMESPACE, name(owner, 1))
            await eventually(lambda: seen(watch, name(owner, 1), kind="DELETED"), what="pod 1")


@pytest.mark.anyio
async def test_a_cut_watch_resumes_without_a_gap() -> None:
    """A cut is not a gap: the recorder resumes from its resourceVersion, the server sends what
    it missed (the history is not compacted), and the hidden release is reported."""
    fake, owner = story()
    with pytest.raises(AssertionError, match=OVER) as caught:
        async with recording(fake, owner) as watch:
            release(fake, owner, 0)
            await eventually(lambda: seen(watch, name(owner, 0), True), what="pod 0 released")
            fake.lag_watches("pods", open_only=True)
            release(fake, owner, 1)
            fake.delete(PODS, NAMESPACE, name(owner, 1))
            assert fake.cut_watches("pods") == 1
            await eventually(lambda: seen(watch, name(owner, 1), kind="DELETED"), what="pod 1")
    assert type(caught.value) is AssertionError, caught.value  # the violation, not a gap


@pytest.mark.anyio
async def test_running_out_of_watch_rounds_is_a_gap() -> None:
    """Every watch ends at once: the recorder spends its rounds and stops. The old one stopped
    silently and its replay passed on the history it had."""
    fake, owner = story()

    async def ends(resource: Resource) -> AsyncIterator[Any]:
        return
        yield

    client = Stub(fake, ends)
    with pytest.raises(AssertionError, match="ran out of its 1000 watch rounds") as caught:
        async with recording(client, owner):
            await eventually(lambda: client.watches >= 3 * ROUNDS, what="every round spent")
    assert isinstance(caught.value, realpeers.IncompleteHistory)
    assert realpeers.WATCH_ROUNDS == ROUNDS
    assert client.watches == 3 * ROUNDS, "bounded: not one watch more"


@pytest.mark.anyio
async def test_an_event_it_cannot_record_fails_at_once() -> None:
    """An event without metadata: the recorder raises ``RecorderBroken`` out of its task (the
    test body is cancelled). The old one took it for a dropped connection and went on."""
    fake, owner = story()
    sent: list[str] = []

    async def malformed(resource: Resource) -> AsyncIterator[Any]:
        if resource.plural == "pods" and not sent:
            sent.append("bad")
            yield {"type": "MODIFIED", "object": {"kind": "Pod"}}

    client = Stub(fake, malformed)
    with pytest.raises(ExceptionGroup) as caught:
        async with recording(client, owner):
            await eventually(lambda: client.watches > 100, what="the recorder going on")
    broken = caught.value.subgroup(realpeers.RecorderBroken)
    assert broken is not None, caught.value
    (err,) = broken.exceptions
    assert isinstance(err.__cause__, KeyError), err


@pytest.mark.anyio
async def test_the_record_ends_at_caught_up_not_after_a_fixed_wait() -> None:
    """The pod watch 1 s behind: pod 1's release over the cap, made just before the body ends,
    is in the record (``slice_watch`` waits until it reached the server's present). The old one
    slept 0.5 s and judged a record without it."""
    fake, owner = story()
    fake.lag = {"pods": 1.0}
    with pytest.raises(AssertionError, match=OVER):
        async with recording(fake, owner):
            release(fake, owner, 0)
            release(fake, owner, 1)


class SlowLists:
    """The fake's client, its Workload list 0.3 s late."""

    def __init__(self, fake: FakeKube) -> None:
        self.fake = fake

    async def list_objects(self, resource: Resource, *a: Any) -> Any:
        if resource.plural == "workloads":
            await anyio.sleep(0.3)
        return await self.fake.list_objects(resource, *a)

    def watch(self, *a: Any) -> Any:
        return self.fake.watch(*a)


@pytest.mark.anyio
async def test_recording_starts_only_once_every_watch_listed() -> None:
    """``SliceWatch.record`` (which the sole-releaser, audit and RayJob tests now call instead of
    starting the watches themselves) returns once the three first lists are in: what the test
    does next is in the record. The sole-releaser test used to start without waiting."""
    fake, owner = story()
    watch = SliceWatch(
        Kube(SlowLists(fake)),  # type: ignore[arg-type]
        NAMESPACE,
        JOBS,
        owner["metadata"]["uid"],
        lambda j: {"main": 2},
        lambda p: "main",
        controller_uid,
    )
    async with anyio.create_task_group() as tg:
        await watch.record(tg)
        assert watch.synced.is_set()
        assert {e.resource for e in watch.events if e.initial} == {"pod", "workload", "owner"}
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_a_replay_that_judged_no_release_fails() -> None:
    fake, owner = story()
    with pytest.raises(AssertionError, match="judged no release"):
        async with recording(fake, owner):
            pass
