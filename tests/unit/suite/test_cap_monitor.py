"""The integration tests' cap monitor (``tests/integration/monitor.py``) on the fake API server.

The story of issue 41: a Job of 2 whose one slice admits 1. Pod 0 is released and seen; the pod
watch is held while pod 1 is released (2 live released for a cap of 1) and deleted; then the
watch expires (410). The old monitor relisted with no record of the gap and ended with no
violation; now the record has a gap and ``monitoring`` refuses to judge it. The controls: the
same release seen, or hidden behind a cut the watch resumes from, is the violation it is.

The cap now comes from the server's own objects, not from a number the test sets: a release
before the admission that justifies it, and a release past the owner's own size, are violations;
the same releases after the admission, or within the size, are not. A monitor that judged no
release fails; so does one whose own bookkeeping breaks, at once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import pytest

from bench.gapwatch import IncompleteHistory, WatchSettings
from tests.fakekube import FakeKube
from tests.fakekube import _labels as fake_labels
from tests.fakekube import _match as fake_match
from tests.integration.k8s import Kube
from tests.integration.monitor import CapMonitor, MonitorBroken, monitoring
from tests.objects import GATE, JOBS, PODS, WORKLOADS, gates_of, job_pod, workload
from tests.polling import eventually
from tests.unit.podfactory import NAMESPACE, job
from ungater._kube.client import Resource

SELECTOR = "job-name=train"
OVER = r"2 live released in main > min\(cap 1 of train-1, owner size 2\)"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def story(admitted: int | None = 1, parallelism: int = 2) -> tuple[FakeKube, dict[str, Any]]:
    """A Job of ``parallelism``, its slice admitting ``admitted``, its pods gated."""
    fake = FakeKube()
    owner = job("train", parallelism=parallelism)
    fake.put(JOBS, owner)
    fake.put(WORKLOADS, workload(owner, "train-1", parallelism, admitted=admitted))
    for i in range(parallelism):
        fake.put(PODS, job_pod(owner, i))
    return fake, owner


def release(fake: FakeKube, owner: dict[str, Any], i: int) -> int:
    pod = fake.put(PODS, job_pod(owner, i, gates=[]))
    return int(pod["metadata"]["resourceVersion"])


def name(owner: dict[str, Any], i: int) -> str:
    return str(job_pod(owner, i)["metadata"]["name"])


def seen(mon: CapMonitor, pod: str, released: bool | None = None, kind: str = "") -> bool:
    return any(
        e.resource == "pod"
        and e.obj["metadata"]["name"] == pod
        and (released is None or (GATE not in gates_of(e.obj)) == released)
        and (not kind or e.kind == kind)
        for e in mon.events
    )


def watching(fake: Any, **kw: Any) -> Any:
    return monitoring(Kube(fake), NAMESPACE, SELECTOR, **kw)


@pytest.mark.anyio
async def test_a_release_hidden_in_an_expired_watch_fails_the_monitor() -> None:
    """Issue 41's example; the old monitor ended this with no violation."""
    fake, owner = story()
    with pytest.raises(IncompleteHistory, match="pod events after rv") as caught:
        async with watching(fake) as mon:
            first = release(fake, owner, 0)
            await eventually(lambda: seen(mon, name(owner, 0), True), what="pod 0 released")
            fake.lag_watches("pods", open_only=True)  # the monitor's pod watch: held
            hidden = release(fake, owner, 1)  # 2 live released for a cap of 1
            fake.delete(PODS, NAMESPACE, name(owner, 1))
            assert fake.expire_watches("pods") == 1
            await eventually(lambda: mon.relists.get("pod"), what="the relist")
    assert not seen(mon, name(owner, 1), True), "the release was hidden, as the story says"
    (gap,) = mon.gaps
    assert gap.resource == "pod" and gap.after_rv == first < hidden <= (gap.until_rv or 0), gap
    assert "410" in str(caught.value)


@pytest.mark.anyio
async def test_the_same_release_seen_is_a_violation() -> None:
    fake, owner = story()
    with pytest.raises(AssertionError, match=OVER):
        async with watching(fake) as mon:
            release(fake, owner, 0)
            release(fake, owner, 1)
            fake.delete(PODS, NAMESPACE, name(owner, 1))
            await eventually(lambda: seen(mon, name(owner, 1), kind="DELETED"), what="pod 1 gone")


@pytest.mark.anyio
async def test_a_cut_watch_resumes_and_the_hidden_release_is_judged() -> None:
    fake, owner = story()
    with pytest.raises(AssertionError, match=OVER) as caught:
        async with watching(fake) as mon:
            release(fake, owner, 0)
            await eventually(lambda: seen(mon, name(owner, 0), True), what="pod 0 released")
            fake.lag_watches("pods", open_only=True)
            release(fake, owner, 1)
            fake.delete(PODS, NAMESPACE, name(owner, 1))
            assert fake.cut_watches("pods") == 1
    assert type(caught.value) is AssertionError, caught.value  # the violation, not a gap
    assert not mon.gaps


@pytest.mark.anyio
async def test_the_record_is_judged_only_once_it_caught_up() -> None:
    """A pod watch 1 s behind: the release over the cap, made just before the body ends, is
    judged (the monitor waits until its record reached the server's present)."""
    fake, owner = story()
    fake.lag = {"pods": 1.0}
    with pytest.raises(AssertionError, match=OVER):
        async with watching(fake):
            release(fake, owner, 0)
            release(fake, owner, 1)


@pytest.mark.anyio
async def test_a_release_before_its_admission_is_a_violation() -> None:
    """The cap is the server's: pod 1 released while the slice still admits 1 fails, even
    though the slice admits 2 a moment later (the old monitor took the cap the test set)."""
    fake, owner = story()
    with pytest.raises(AssertionError, match=OVER):
        async with watching(fake):
            release(fake, owner, 0)
            release(fake, owner, 1)  # premature
            fake.put(WORKLOADS, workload(owner, "train-1", 2, admitted=2))


@pytest.mark.anyio
async def test_the_same_releases_after_the_admission_pass() -> None:
    fake, owner = story()
    async with watching(fake) as mon:
        release(fake, owner, 0)
        fake.put(WORKLOADS, workload(owner, "train-1", 2, admitted=2))
        release(fake, owner, 1)
    assert mon.judged == 2 and not mon.violations and mon.max_seen == 2


@pytest.mark.anyio
async def test_a_release_past_the_owners_size_is_a_violation() -> None:
    """The slice admits 2, but the Job shrank to 1 first."""
    fake, owner = story(admitted=2)
    with pytest.raises(AssertionError, match=r"2 live released in main > min\(cap 2 .*size 1\)"):
        async with watching(fake):
            release(fake, owner, 0)
            shrunk = dict(owner, spec={**owner["spec"], "parallelism": 1})
            fake.put(JOBS, shrunk)
            release(fake, owner, 1)


@pytest.mark.anyio
async def test_a_release_of_a_pod_with_no_slice_is_a_violation() -> None:
    fake, owner = story(admitted=None)  # the slice is not admitted at all
    with pytest.raises(AssertionError, match=r"1 live released in main > min\(cap 0 of no slice"):
        async with watching(fake):
            release(fake, owner, 0)


@pytest.mark.anyio
async def test_a_monitor_that_judged_no_release_fails() -> None:
    fake, _ = story()
    with pytest.raises(AssertionError, match="judged 0 releases"):
        async with watching(fake):
            pass
    async with watching(fake, min_judged=0) as mon:  # a test that releases nothing says so
        pass
    assert mon.judged == 0


class Stub:
    """Lists from the fake; every watch is ``stream(resource)`` (counted in ``watches``)."""

    def __init__(self, fake: FakeKube, stream: Callable[[Resource], AsyncIterator[Any]]) -> None:
        self.fake, self.stream, self.watches = fake, stream, 0

    async def list_objects(self, *a: Any) -> Any:
        return await self.fake.list_objects(*a)

    def watch(self, resource: Resource, *a: Any) -> AsyncIterator[Any]:
        self.watches += 1
        return self.stream(resource)


@pytest.mark.anyio
async def test_a_failure_of_the_monitor_itself_fails_the_test_at_once() -> None:
    """An event without metadata: ``MonitorBroken`` comes out of the record's task and the
    test body is cancelled (the old monitor had its checks inside the relist loop)."""
    fake, _ = story()
    sent: list[str] = []

    async def malformed(resource: Resource) -> AsyncIterator[Any]:
        if resource.plural == "pods" and not sent:
            sent.append("bad")
            yield {"type": "MODIFIED", "object": {"kind": "Pod"}}
        await anyio.sleep_forever()

    waited = anyio.Event()
    with pytest.raises(ExceptionGroup) as caught:
        async with watching(Stub(fake, malformed)):
            with anyio.move_on_after(3):
                await anyio.sleep_forever()
            waited.set()
    broken = caught.value.subgroup(MonitorBroken)
    assert broken is not None, caught.value
    assert not waited.is_set(), "the test body was let run on without checks"


@pytest.mark.anyio
async def test_running_out_of_watch_rounds_is_a_gap() -> None:
    """Every watch ends at once: the record spends its rounds and stops; the old monitor
    raised only once the test ended, with no record of what it missed."""
    fake, _ = story()

    async def ends(resource: Resource) -> AsyncIterator[Any]:
        return
        yield

    client = Stub(fake, ends)
    rounds = WatchSettings(rounds=5, retry_seconds=0.0)
    mon = CapMonitor(Kube(client), NAMESPACE, SELECTOR, settings=rounds)  # type: ignore[arg-type]
    async with anyio.create_task_group() as tg:
        await mon.start(tg, dict(mon.sources))
        await eventually(lambda: client.watches >= 3 * 5, what="every round spent")
        tg.cancel_scope.cancel()
    assert {g.resource for g in mon.gaps} == {"pod", "workload", "jobs"}, mon.gaps
    assert all("ran out of its 5 watch rounds" in g.why for g in mon.gaps)
    with pytest.raises(IncompleteHistory):
        mon.judge()


class RestartedCache:
    """The fake's client as a restarted API server serves it: its watches answer 410 (a fresh
    watch cache) while etcd's history is intact, which ``list_at`` reads revision by revision
    (``resourceVersionMatch=Exact``), as the real one does; after a compaction it cannot."""

    def __init__(self, fake: FakeKube) -> None:
        self.fake = fake

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fake, name)

    async def list_at(
        self, res: Resource, ns: str, selector: str, rv: int
    ) -> list[dict[str, Any]] | None:
        if rv <= self.fake.compacted_rv:
            return None
        state: dict[str, dict[str, Any]] = {}
        for at, key, where, etype, obj, _old in self.fake.history:
            if at <= rv and key == (res.group, res.plural) and where == ns:
                if etype == "DELETED":
                    state.pop(obj["metadata"]["uid"], None)
                else:
                    state[obj["metadata"]["uid"]] = obj
        return [o for o in state.values() if fake_match(fake_labels(o), selector)]

    def restart(self) -> int:
        """Every open pod watch ends with 410 Gone; the history stays."""
        return self.fake._fault("gone", "pods")


@pytest.mark.anyio
async def test_a_gap_read_back_from_the_history_is_no_gap_and_the_release_in_it_is_judged() -> None:
    """An API server restarted under a test answers 410 from its fresh watch cache, though
    etcd still holds every revision: the record reads the revisions it missed back, one by
    one, and the release hidden there is judged (the integration fault test restarts the API
    server; without this every such run was a gap)."""
    fake, owner = story()
    client = RestartedCache(fake)
    with pytest.raises(AssertionError, match=OVER) as caught:
        async with watching(client) as mon:
            release(fake, owner, 0)
            await eventually(lambda: seen(mon, name(owner, 0), True), what="pod 0 released")
            fake.lag_watches("pods", open_only=True)
            release(fake, owner, 1)
            fake.delete(PODS, NAMESPACE, name(owner, 1))
            assert client.restart() == 1
            await eventually(lambda: mon.relists.get("pod"), what="the relist")
    assert type(caught.value) is AssertionError, caught.value  # judged, not refused
    assert not mon.gaps and mon.recovered >= 2
    assert seen(mon, name(owner, 1), True), "the hidden release was read back"
