"""The reconciler, one ``reconcile(key)`` at a time, on a controller whose caches run on the
in-memory API server but whose workers never start: each call's outcome is exactly that call's.

These kill the mutants of ``ungater/_reconciler.py`` the whole-controller tests left alive:
what each patch outcome does to expectations, ``ours``, the notices and the retry signal; how
expired expectations are settled from the API server; the ``Released`` Event and release
metrics; the wait on pending expectations (docs/testing.md).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
import ungater_plugins.job as job_plugin
from prometheus_client.parser import text_string_to_metric_families

from tests.fakekube import FakeKube
from tests.objects import JOBS, WORKLOADS
from tests.polling import eventually
from tests.unit.podfactory import GATE, NAMESPACE, job, job_pod, release, workload
from ungater._cache import OwnerKey
from ungater._config import Config
from ungater._controller import Controller
from ungater._events import EventRecorder, released_message
from ungater._kube import EVENTS, PODS, ApiError
from ungater._metrics import Metrics
from ungater._model import Kind
from ungater._reconciler import Changed
from ungater._registry import PluginRegistry
from ungater._state import KindRuntime

pytestmark = pytest.mark.anyio

JOB = Kind("batch", "Job")
OTHER_VIEW = Kind("jobset.x-k8s.io", "JobSet")  # another pod index that may see the same pod


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Clock:
    """The controller's clock (expectations, backoff, release waits), moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Standby:
    """An elector under which this replica leads (patches go out) but never starts its
    workers: the caches run, and only the test calls ``reconcile``."""

    def __init__(self) -> None:
        self.is_leader = True

    async def run_while_leading(self, fn: Any) -> None:
        await anyio.sleep_forever()


def config(**extra: Any) -> Config:
    return Config.model_validate(
        {
            "kinds": [{"group": "batch", "kind": "Job"}],
            "expectationsTimeoutSeconds": 30.0,
            "watch": {"backoffInitialSeconds": 0.01, "backoffMaxSeconds": 0.05},
            **extra,
        }
    )


@asynccontextmanager
async def standby(
    fake: FakeKube, cfg: Config | None = None, clock: Clock | None = None
) -> AsyncIterator[tuple[Controller, Standby]]:
    """The controller with metrics and real Events, caches synced, no workers."""
    metrics = Metrics()
    events = EventRecorder(fake, host="test")
    registry = PluginRegistry.from_modules({"job": job_plugin})
    ctl = Controller(
        cfg or config(), fake, registry, clock=clock or Clock(), metrics=metrics, events=events
    )
    metrics.bind(ctl)
    elector = Standby()
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(events.run)
        tg.start_soon(ctl.run, stop, elector)
        with anyio.fail_after(5):
            await ctl.ready.wait()
        try:
            with anyio.fail_after(20):
                yield ctl, elector
        finally:
            stop.set()
            await events.close(1.0)


def setup(
    fake: FakeKube, pods: int, admitted: int, released: int = 0, name: str = "train"
) -> tuple[dict[str, Any], OwnerKey, list[dict[str, Any]]]:
    """An Indexed Job of ``pods`` pods (the first ``released`` already running) whose slice
    admits ``admitted``; its key and its pods by index."""
    j = fake.put(JOBS, job(name, parallelism=pods))
    out = []
    for i in range(pods):
        p = job_pod(j, index=i, created=1 + i)
        out.append(fake.put(PODS, release(p) if i < released else p))
    fake.put(WORKLOADS, workload(j, {"main": pods}, admitted={"main": admitted}))
    return j, OwnerKey(NAMESPACE, j["metadata"]["uid"]), out


def rt_of(ctl: Controller) -> KindRuntime:
    return ctl.kinds[JOB]


async def cached(ctl: Controller, key: OwnerKey, fake: FakeKube, pods: int) -> None:
    """Wait until the caches hold the owner's slice and its pods as the fake has them."""

    def synced() -> bool:
        rt = rt_of(ctl)
        want = {p["metadata"]["uid"]: p["metadata"]["resourceVersion"] for p in fake.items(PODS)}
        have = {u: v.resource_version for u, v in rt.pods.by_uid.items()}
        return bool(ctl.workloads.for_owner(key.uid)) and have == want and len(have) == pods

    await eventually(synced, timeout=5, what="caches synced with the fake")


def uid(p: dict[str, Any]) -> str:
    return str(p["metadata"]["uid"])


def name(p: dict[str, Any]) -> str:
    return str(p["metadata"]["name"])


def gated(fake: FakeKube, p: dict[str, Any]) -> bool:
    now = fake.read(PODS, NAMESPACE, name(p))
    assert now is not None
    return GATE in [g["name"] for g in now["spec"].get("schedulingGates") or []]


def script(fake: FakeKube, outcomes: dict[str, ApiError]) -> list[str]:
    """Patches of the pods named in ``outcomes`` fail with that error; the rest go through.
    Returns the names of the pods a patch was attempted on, in order."""
    attempted: list[str] = []

    def before_patch(namespace: str, pod_name: str) -> None:
        attempted.append(pod_name)
        if pod_name in outcomes:
            raise outcomes[pod_name]

    fake.before_patch = before_patch
    return attempted


def refused_for_good() -> ApiError:
    body = {"kind": "Status", "message": "gates are managed by the platform team"}
    return ApiError(422, "Unprocessable Entity", json.dumps(body))


def samples(metrics: Metrics | None, metric: str) -> dict[tuple[tuple[str, str], ...], float]:
    assert metrics is not None
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            if s.name == metric:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def events_of(fake: FakeKube, reason: str) -> list[dict[str, Any]]:
    return [e for e in fake.items(EVENTS) if e.get("reason") == reason]


# -- _release: what each outcome does ------------------------------------------------------------


async def test_each_patch_outcome_is_acted_on_and_unknown_ones_fail_the_reconcile() -> None:
    """Two released, one gone, one conflict, one refused for good, two with an unknown
    outcome: the released are counted and stay expected and ours, gone/conflict/refused are
    no longer in flight nor ours, the unknown stay expected (they may have landed), and the
    reconcile fails naming how many patches failed for which owner."""
    fake = FakeKube()
    _, key, pods = setup(fake, pods=7, admitted=7)
    async with standby(fake) as (ctl, _):
        await cached(ctl, key, fake, 7)
        fake.drop_events = {"pods"}  # the deciding view stays as it was: nothing observed
        attempted = script(
            fake,
            {
                name(pods[2]): ApiError(404, "Not Found"),
                name(pods[3]): ApiError(409, "Conflict"),
                name(pods[4]): refused_for_good(),
                name(pods[5]): ApiError(500, "Internal Server Error"),
                name(pods[6]): ApiError(503, "Service Unavailable"),
            },
        )
        with pytest.raises(RuntimeError) as failed:
            await ctl.reconciler.reconcile(key)
        assert str(failed.value) == f"2 patch(es) failed for {key}"
        assert sorted(attempted) == sorted(name(p) for p in pods)
        assert ctl.stats.released == 2
        in_flight = {uid(pods[i]) for i in (0, 1, 5, 6)}
        assert ctl.expectations.pending(key) == in_flight
        assert ctl.state.ours == in_flight
        # expected in the deciding view: another pod index showing the pod clears nothing
        assert ctl.expectations.observe(uid(pods[0]), OTHER_VIEW) is None
        assert ctl.expectations.observe(uid(pods[0]), JOB) == key
        assert [gated(fake, p) for p in pods] == [False, False] + [True] * 5


async def test_a_refused_release_is_announced_and_the_pod_backs_off() -> None:
    """A release refused for good: no retry signal (the pod backs off), a ReleaseBlocked
    Event on the Workload, the blocked metric for the kind, and the owner re-decided."""
    fake = FakeKube()
    _, key, pods = setup(fake, pods=2, admitted=2)
    async with standby(fake) as (ctl, _):
        await cached(ctl, key, fake, 2)
        script(fake, {name(pods[1]): refused_for_good()})
        while len(ctl.queue):  # drain what the caches queued; only the notice may add it
            ctl.queue.done(await ctl.queue.get())
        await ctl.reconciler.reconcile(key)  # no Changed, no RuntimeError
        assert ctl.stats.released == 1
        assert ctl.blocked.get(uid(pods[1])) is not None
        assert uid(pods[1]) not in ctl.expectations.pending(key)
        assert uid(pods[1]) not in ctl.state.ours
        assert samples(ctl.metrics, "ungater_release_blocked_total") == {
            (("kind", "Job.batch"),): 1.0
        }
        assert len(ctl.queue) == 1  # re-decided at once: the next pod may take the slot
        blocked = await eventually(lambda: events_of(fake, "ReleaseBlocked"), timeout=3)
        assert blocked[0]["involvedObject"]["kind"] == "Workload"
        assert name(pods[1]) in blocked[0]["message"]


async def test_a_pod_in_backoff_is_not_patched_again_and_a_later_release_clears_it() -> None:
    """The decision gets the pods still in backoff: the refused pod is left alone (the next
    pod takes its slot); once its backoff ran out and a patch lands, it is blocked no more."""
    fake = FakeKube()
    clock = Clock()
    _, key, pods = setup(fake, pods=3, admitted=2)
    async with standby(fake, clock=clock) as (ctl, _):
        await cached(ctl, key, fake, 3)
        attempted = script(fake, {name(pods[0]): refused_for_good()})
        await ctl.reconciler.reconcile(key)
        assert sorted(attempted) == sorted([name(pods[0]), name(pods[1])])
        await cached(ctl, key, fake, 3)
        await eventually(lambda: not ctl.expectations.pending(key), timeout=3)
        attempted.clear()
        await ctl.reconciler.reconcile(key)
        assert attempted == [name(pods[2])]  # not the pod in backoff
        await cached(ctl, key, fake, 3)
        await eventually(lambda: not ctl.expectations.pending(key), timeout=3)
        # the backoff ran out; pod 2 ends, freeing a slot; the refused pod goes now
        clock.now += 600
        fake.put(PODS, release(pods[2], phase="Succeeded"))
        fake.before_patch = None
        await cached(ctl, key, fake, 3)
        fake.drop_events = {"pods"}  # the release's own outcome clears it, not its watch event
        await ctl.reconciler.reconcile(key)
        assert not gated(fake, pods[0])
        assert ctl.blocked.get(uid(pods[0])) is None


@pytest.mark.parametrize(
    "error", [ApiError(404, "Not Found"), ApiError(409, "Conflict")], ids=["gone", "conflict"]
)
async def test_a_pod_gone_or_changed_under_the_patch_retries_the_owner(error: ApiError) -> None:
    """The cache was behind the server: re-decide (``Changed`` names the owner, so the worker
    backs off that key); the pod is no longer in flight nor ours."""
    fake = FakeKube()
    _, key, pods = setup(fake, pods=1, admitted=1)
    async with standby(fake) as (ctl, _):
        await cached(ctl, key, fake, 1)
        script(fake, {name(pods[0]): error})
        with pytest.raises(Changed) as changed:
            await ctl.reconciler.reconcile(key)
        assert changed.value.args == (key,)
        assert not ctl.expectations.pending(key) and not ctl.state.ours


async def test_patches_skipped_after_leadership_was_lost_ask_for_no_retry() -> None:
    """Leadership went between deciding and patching: nothing is in flight or ours, and the
    reconcile ends quietly (the next leader decides)."""
    fake = FakeKube()
    _, key, pods = setup(fake, pods=2, admitted=2)
    async with standby(fake) as (ctl, elector):
        await cached(ctl, key, fake, 2)
        elector.is_leader = False
        decision = await ctl.reconciler.reconcile(key)
        assert decision is not None and len(decision.releases) == 2
        assert not ctl.expectations.pending(key) and not ctl.state.ours
        assert all(gated(fake, p) for p in pods) and ctl.stats.released == 0


async def test_a_release_landing_on_a_terminating_pod_re_decides_and_keeps_it_expected() -> None:
    """The patch landed on a pod being deleted (the cache had not seen the deletion): no
    release, but the owner is re-decided (``Changed``) and the pod stays expected and ours."""
    fake = FakeKube()
    j = fake.put(JOBS, job("train", parallelism=1))
    raw = job_pod(j, index=0)
    raw["metadata"]["finalizers"] = ["example.com/keep"]
    p = fake.put(PODS, raw)
    fake.put(WORKLOADS, workload(j, {"main": 1}, admitted={"main": 1}))
    key = OwnerKey(NAMESPACE, j["metadata"]["uid"])
    async with standby(fake) as (ctl, _):
        await cached(ctl, key, fake, 1)
        fake.drop_events = {"pods"}
        fake.delete(PODS, NAMESPACE, name(p))  # terminating, still gated
        with pytest.raises(Changed):
            await ctl.reconciler.reconcile(key)
        assert ctl.stats.released == 0 and ctl.stats.released_deleting == 1
        assert ctl.expectations.pending(key) == {uid(p)} and ctl.state.ours == {uid(p)}


async def test_released_pods_feed_the_wait_histogram_from_when_room_was_made() -> None:
    """Each released pod's wait counts from the later of its arrival and the last room made
    for its owner (here the slice's admission, after the pods arrived)."""
    fake = FakeKube()
    clock = Clock()
    j = fake.put(JOBS, job("train", parallelism=3))
    pods = [fake.put(PODS, job_pod(j, index=i)) for i in range(3)]
    key = OwnerKey(NAMESPACE, j["metadata"]["uid"])
    async with standby(fake, clock=clock) as (ctl, _):
        await eventually(lambda: len(rt_of(ctl).pods) == 3, timeout=5)
        clock.now += 100  # the pods waited 100 s for an admission
        fake.put(WORKLOADS, workload(j, {"main": 3}, admitted={"main": 2}))
        await cached(ctl, key, fake, 3)
        clock.now += 2  # then 2 s for us
        await ctl.reconciler.reconcile(key)
        wait = samples(ctl.metrics, "ungater_release_wait_seconds_count")
        total = samples(ctl.metrics, "ungater_release_wait_seconds_sum")
        assert wait == {(("kind", "Job.batch"),): 2.0}
        assert total == {(("kind", "Job.batch"),): 4.0}
        assert sum(not gated(fake, p) for p in pods) == 2


# -- _announce ------------------------------------------------------------------------------------


async def test_a_release_is_announced_per_pod_set_with_its_count_and_latency() -> None:
    """Three pods of pod set main released: one ``Released`` Event on the Workload saying so,
    the released counter labelled by kind and pod set, one latency per pod (from the
    slice's Admitted condition)."""
    fake = FakeKube()
    _, key, _ = setup(fake, pods=4, admitted=3)
    async with standby(fake) as (ctl, _):
        await cached(ctl, key, fake, 4)
        await ctl.reconciler.reconcile(key)
        assert samples(ctl.metrics, "ungater_pods_released_total") == {
            (("kind", "Job.batch"), ("pod_set", "main")): 3.0
        }
        assert samples(ctl.metrics, "ungater_release_latency_seconds_count") == {(): 3.0}
        released = await eventually(lambda: events_of(fake, "Released"), timeout=3)
        slice_ = ctl.workloads.for_owner(key.uid)[0]
        assert [
            (e["involvedObject"]["kind"], e["involvedObject"]["uid"], e["message"])
            for e in released
        ] == [("Workload", slice_.uid, released_message(3, "main"))]


# -- _settle_expired ------------------------------------------------------------------------------


class Ordered(frozenset[str]):
    """Expired UIDs settled in the order given (a frozenset's own order is the hash's)."""

    order: list[str]

    def __new__(cls, items: list[str]) -> Ordered:
        out = super().__new__(cls, items)
        out.order = list(items)
        return out

    def __iter__(self) -> Any:
        return iter(self.order)


def released_by_someone(fake: FakeKube, p: dict[str, Any], phase: str = "Running") -> None:
    fake.put(PODS, release(fake.read(PODS, NAMESPACE, name(p)) or p, phase=phase))


def gone(fake: FakeKube, p: dict[str, Any]) -> None:
    """Deleted, and its finalizers (the Job controller's tracking one) removed: gone."""
    fake.delete(PODS, NAMESPACE, name(p))
    fake.finalize(PODS, NAMESPACE, name(p))
    assert fake.read(PODS, NAMESPACE, name(p)) is None


def replace_pod(fake: FakeKube, p: dict[str, Any]) -> None:
    """The pod went and another took its name (stable names): another UID, released."""
    gone(fake, p)
    other = release(p)
    other["metadata"]["uid"] = uid(p) + "-new"
    fake.put(PODS, other)


def malform(fake: FakeKube, p: dict[str, Any]) -> None:
    bad = fake.read(PODS, NAMESPACE, name(p)) or p
    bad["spec"] = "not an object"
    fake.put(PODS, bad)


TIMEOUT = 30.0  # config()'s expectationsTimeoutSeconds


async def test_settling_re_arms_only_pods_the_server_shows_released_and_live() -> None:
    """Expired expectations are settled from fresh reads: only a pod the server shows live,
    not terminating and without our gate stays in flight (re-armed, in the deciding view, for
    a whole timeout); one gone, replaced, still gated, finished, terminating, unreadable or
    not even cached is in flight no more. Each settled UID counts as expired."""
    fake = FakeKube()
    clock = Clock()
    _, key, pods = setup(fake, pods=7, admitted=7)
    finalized = fake.read(PODS, NAMESPACE, name(pods[5])) or {}
    finalized["metadata"]["finalizers"] = [
        *finalized["metadata"].get("finalizers", ()),
        "example.com/keep",
    ]
    fake.put(PODS, finalized)
    async with standby(fake, clock=clock) as (ctl, _):
        await cached(ctl, key, fake, 7)
        fake.drop_events = {"pods"}  # the cache keeps its older views
        released_by_someone(fake, pods[0])
        gone(fake, pods[1])
        replace_pod(fake, pods[2])
        # pods[3] stays gated
        released_by_someone(fake, pods[4], phase="Succeeded")
        released_by_someone(fake, pods[5])
        fake.delete(PODS, NAMESPACE, name(pods[5]))  # terminating (finalizer), gate gone
        malform(fake, pods[6])
        uids = [uid(p) for p in pods] + ["uid-never-cached"]
        ctl.expectations.expect(key, uids, JOB)
        clock.now += TIMEOUT + 1
        rt = rt_of(ctl)
        await ctl.reconciler._settle_expired(key, rt, ctl.expectations.expired(key))
        assert ctl.expectations.pending(key) == {uid(pods[0])}
        assert ctl.expectations.next_deadline(key) == TIMEOUT  # re-armed now, not left expired
        assert ctl.expectations.expired_total == 8
        assert ctl.expectations.observe(uid(pods[0]), OTHER_VIEW) is None  # the deciding view's
        clock.now += TIMEOUT + 1
        await ctl.reconciler._settle_expired(key, rt, ctl.expectations.expired(key))
        assert ctl.expectations.expired_total == 9  # counts add up
        assert ctl.expectations.pending(key) == {uid(pods[0])}


@pytest.mark.parametrize("skipped", ["not cached", "replaced", "unreadable"])
async def test_one_pod_skipped_while_settling_does_not_stop_settling_the_next(skipped: str) -> None:
    """Settling moves on past a pod it cannot settle (not in the cache, another UID under its
    name, an unreadable answer): the next pod, released and live, is still re-armed."""
    fake = FakeKube()
    clock = Clock()
    _, key, pods = setup(fake, pods=2, admitted=2)
    async with standby(fake, clock=clock) as (ctl, _):
        await cached(ctl, key, fake, 2)
        fake.drop_events = {"pods"}
        first = uid(pods[0])
        if skipped == "not cached":
            first = "uid-never-cached"
        elif skipped == "replaced":
            replace_pod(fake, pods[0])
        else:
            malform(fake, pods[0])
        released_by_someone(fake, pods[1])
        ctl.expectations.expect(key, [first, uid(pods[1])], JOB)
        clock.now += TIMEOUT + 1
        await ctl.reconciler._settle_expired(key, rt_of(ctl), Ordered([first, uid(pods[1])]))
        assert ctl.expectations.pending(key) == {uid(pods[1])}
        assert ctl.expectations.next_deadline(key) == TIMEOUT


async def test_a_reconcile_settles_expired_expectations_and_counts_re_armed_pods_in_flight() -> (
    None
):
    """Our patch failed (unknown outcome) while another writer released the pod; the watch
    never showed it. Once the expectation expires the reconcile settles it from the server:
    the pod is released and live, so it stays in flight and fills the one admitted slot, and
    nothing more is patched."""
    fake = FakeKube()
    clock = Clock()
    _, key, pods = setup(fake, pods=2, admitted=1)
    async with standby(fake, clock=clock) as (ctl, _):
        await cached(ctl, key, fake, 2)
        fake.drop_events = {"pods"}
        attempted = script(fake, {name(pods[0]): ApiError(500, "Internal Server Error")})
        with pytest.raises(RuntimeError):
            await ctl.reconciler.reconcile(key)
        assert attempted == [name(pods[0])]
        released_by_someone(fake, pods[0])
        clock.now += TIMEOUT + 1
        attempted.clear()
        decision = await ctl.reconciler.reconcile(key)
        assert decision is not None and not decision.releases
        assert attempted == []
        assert ctl.expectations.pending(key) == {uid(pods[0])}
        assert ctl.expectations.expired_total == 1


# -- reconcile -----------------------------------------------------------------------------------


async def test_pending_expectations_re_queue_the_owner_when_the_first_one_expires() -> None:
    """Expectations still pending: no decision now, and the owner comes back when the first
    one expires (not at once, not later)."""
    fake = FakeKube()
    clock = Clock()
    _, key, pods = setup(fake, pods=1, admitted=1)
    async with standby(fake, clock=clock) as (ctl, _):
        await cached(ctl, key, fake, 1)
        ctl.expectations.expect(key, [uid(pods[0])], JOB)
        clock.now += TIMEOUT - 0.5  # half a second left
        while len(ctl.queue):
            ctl.queue.done(await ctl.queue.get())
        before = ctl.stats.reconciles
        started = asyncio.get_running_loop().time()
        assert await ctl.reconciler.reconcile(key) is None
        assert ctl.stats.reconciles == before + 1
        assert gated(fake, pods[0]) and key not in ctl.decisions
        assert len(ctl.queue) == 0  # not re-queued at once, but at the first expiry
        timer = ctl.queue._timers[key]
        assert 0.45 <= timer.when() - started <= 0.55  # 0.5 s from the call
