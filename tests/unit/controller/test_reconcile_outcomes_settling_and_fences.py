"""The reconciler, one ``reconcile(key)`` at a time, on a controller whose caches run on the
in-memory API server but whose workers never start: each call's outcome is exactly that call's.

These kill the mutants of ``ungater/_controller/reconciler.py`` the whole-controller tests left alive:
what each patch outcome does to expectations, ``ours``, the notices and the retry signal; how
expired expectations are settled from the API server; the ``Released`` Event and release
metrics; the wait on pending expectations; the scale-down fence's fresh reads of the owner and
of its slice (what each answer lets through); owners without slices, of kinds not configured,
or of a kind in audit mode; pod set updates carried into the release patch; a RayJob's inputs
taken through its RayCluster (docs/testing.md).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
import ungater_plugins.job as job_plugin
import ungater_plugins.raycluster as raycluster_plugin
import ungater_plugins.rayjob as rayjob_plugin
from prometheus_client.parser import text_string_to_metric_families

from tests.clock import ManualClock
from tests.fakekube import FakeKube, PatchFault
from tests.objects import JOBS, RAYCLUSTERS, WORKLOADS
from tests.polling import eventually
from tests.unit.harness import running
from tests.unit.podfactory import (
    GATE,
    NAMESPACE,
    cluster_of,
    job,
    job_pod,
    jobset,
    ray_head_pod,
    ray_owner,
    ray_replica_name,
    ray_worker_pod,
    release,
    workload,
)
from ungater._controller.controller import Controller
from ungater._controller.reconciler import Outcome, Retry
from ungater._controller.state import KindRuntime
from ungater._controller.view import SNAPSHOT_ROUNDS
from ungater._decide.indexes import OwnerKey
from ungater._decide.patches import FENCE_ANNOTATION
from ungater._decide.refusals import PatchOutcome
from ungater._kube.client import EVENTS, PODS, ApiError, Resource
from ungater._kube.kueue import workload_resource
from ungater._model.config import Config
from ungater._model.views import Kind, parse_workload
from ungater._observe.events import released_message
from ungater._observe.metrics import Metrics
from ungater.plugin_api import KindSpec, hookimpl

pytestmark = pytest.mark.anyio

JOB = Kind("batch", "Job")
OTHER_VIEW = Kind("jobset.x-k8s.io", "JobSet")  # another pod index that may see the same pod


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Standby:
    """An elector under which this replica leads (patches go out) but never starts its
    workers: the caches run, and only the test calls ``reconcile``."""

    def __init__(self) -> None:
        self.is_leader = True
        self.term = None  # no term's start to compare releases with

    async def run_while_leading(self, fn: Any) -> None:
        await anyio.sleep_forever()


def config(**extra: Any) -> Config:
    return Config.model_validate(
        {
            "mode": "release",  # the test plays Kueue: no other releaser
            "kinds": [{"group": "batch", "kind": "Job"}],
            "expectationsTimeoutSeconds": 30.0,
            "watch": {"backoffInitialSeconds": 0.01, "backoffMaxSeconds": 0.05},
            **extra,
        }
    )


@asynccontextmanager
async def standby(
    fake: FakeKube,
    cfg: Config | None = None,
    clock: ManualClock | None = None,
    client: Any = None,
    plugins: dict[str, Any] | None = None,
) -> AsyncIterator[tuple[Controller, Standby]]:
    """The controller with metrics and real Events, caches synced, no workers; ``client``
    (a wrapper of ``fake``) is what the controller talks to, if given; ``plugins`` replace
    the built-in ones."""
    elector = Standby()
    async with running(
        fake,
        cfg or config(),
        plugins=plugins
        or {"job": job_plugin, "raycluster": raycluster_plugin, "rayjob": rayjob_plugin},
        observed=True,
        client=client,
        elector=elector,
        clock=clock or ManualClock(1000.0),
    ) as ctl:
        with anyio.fail_after(20):
            yield ctl, elector


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
    return ctl.state.kinds[JOB]


async def cached(ctl: Controller, key: OwnerKey, fake: FakeKube, pods: int) -> None:
    """Wait until the caches hold the owner's slice and its pods as the fake has them."""

    def synced() -> bool:
        rt = rt_of(ctl)
        want = {p["metadata"]["uid"]: p["metadata"]["resourceVersion"] for p in fake.items(PODS)}
        have = {u: v.resource_version for u, v in rt.pods.by_uid.items()}
        return bool(ctl.state.workloads.for_owner(key.uid)) and have == want and len(have) == pods

    await eventually(synced, timeout=5, what="caches synced with the fake")


def uid(p: dict[str, Any]) -> str:
    return str(p["metadata"]["uid"])


def name(p: dict[str, Any]) -> str:
    return str(p["metadata"]["name"])


def gated(fake: FakeKube, p: dict[str, Any]) -> bool:
    now = fake.read(PODS, NAMESPACE, name(p))
    assert now is not None
    return GATE in [g["name"] for g in now["spec"].get("schedulingGates") or []]


def rv_of(fake: FakeKube, p: dict[str, Any]) -> str:
    now = fake.read(PODS, NAMESPACE, name(p))
    assert now is not None
    return str(now["metadata"]["resourceVersion"])


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
    no longer in flight nor ours, the unknown stay ours and uncertain (they may have landed,
    or may still: settled by the next reconcile, not by the watch), and the reconcile fails
    naming how many patches failed for which owner."""
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
        outcome = await ctl.reconciler.reconcile(key)
        assert outcome.retry == Retry.FAILED and outcome.decision is not None
        assert sorted(attempted) == sorted(name(p) for p in pods)
        assert ctl.stats.released == 2
        assert ctl.state.ledger.expectations.pending(key) == {uid(pods[i]) for i in (0, 1)}
        unknown = {uid(pods[i]) for i in (5, 6)}
        assert ctl.state.ledger.uncertain_pods() == unknown
        assert {u.key for _, u in ctl.state.ledger.uncertain_of(key)} == {key}
        assert ctl.state.ledger.ours() == {uid(pods[i]) for i in (0, 1, 5, 6)}
        # expected in the deciding view: another pod index showing the pod clears nothing
        assert ctl.state.ledger.expectations.observe(uid(pods[0]), OTHER_VIEW) is None
        assert ctl.state.ledger.expectations.observe(uid(pods[0]), JOB) == key
        assert [gated(fake, p) for p in pods] == [False, False] + [True] * 5


async def test_a_refused_release_is_announced_and_the_pod_backs_off() -> None:
    """A release refused for good: no retry signal (the pod backs off), a ReleaseBlocked
    Event on the Workload, the blocked metric for the kind, and the owner re-decided."""
    fake = FakeKube()
    _, key, pods = setup(fake, pods=2, admitted=2)
    async with standby(fake) as (ctl, _):
        await cached(ctl, key, fake, 2)
        script(fake, {name(pods[1]): refused_for_good()})
        while len(ctl.state.queue):  # drain what the caches queued; only the notice may add it
            ctl.state.queue.done(await ctl.state.queue.get())
        outcome = await ctl.reconciler.reconcile(key)
        assert outcome.retry is None  # the pod backs off; the owner does not
        assert outcome.after == 0.0  # re-decided at once: the next pod may take the slot
        assert ctl.stats.released == 1
        assert ctl.state.blocked.get(uid(pods[1])) is not None
        assert uid(pods[1]) not in ctl.state.ledger.expectations.pending(key)
        assert not ctl.state.ledger.is_ours(uid(pods[1]))
        assert samples(ctl.metrics, "ungater_release_blocked_total") == {
            (("kind", "Job.batch"),): 1.0
        }
        blocked = await eventually(lambda: events_of(fake, "ReleaseBlocked"), timeout=3)
        assert blocked[0]["involvedObject"]["kind"] == "Workload"
        assert name(pods[1]) in blocked[0]["message"]


async def test_a_releasable_pod_kept_gated_by_a_refusal_shows_as_stalled_once_past_the_threshold() -> (
    None
):
    """Issue 40: whoever releases, a pod the cap allows that stays gated shows. A refused
    release keeps pod 1 gated; once that has lasted audit.stallSeconds the kind's
    ``ungater_stalled_pods`` counts it, and a decision with nothing held clears it."""
    fake = FakeKube()
    clock = ManualClock(1000.0)
    _, key, pods = setup(fake, pods=2, admitted=2)
    async with standby(fake, clock=clock) as (ctl, _):
        await cached(ctl, key, fake, 2)
        script(fake, {name(pods[1]): refused_for_good()})
        await ctl.reconciler.reconcile(key)
        assert ctl.state.blocked.get(uid(pods[1])) is not None
        stalled = {(("kind", "Job.batch"),): 1.0}
        assert samples(ctl.metrics, "ungater_stalled_pods") == {(("kind", "Job.batch"),): 0.0}
        clock.now += 31.0  # past audit.stallSeconds (30)
        await ctl.reconciler.reconcile(key)
        assert samples(ctl.metrics, "ungater_stalled_pods") == stalled
        released_by_someone(fake, pods[1])
        await cached(ctl, key, fake, 2)
        await ctl.reconciler.reconcile(key)
        assert samples(ctl.metrics, "ungater_stalled_pods") == {(("kind", "Job.batch"),): 0.0}


async def test_a_pod_in_backoff_is_not_patched_again_and_a_later_release_clears_it() -> None:
    """The decision gets the pods still in backoff: the refused pod is left alone (the next
    pod takes its slot); once its backoff ran out and a patch lands, it is blocked no more."""
    fake = FakeKube()
    clock = ManualClock(1000.0)
    _, key, pods = setup(fake, pods=3, admitted=2)
    async with standby(fake, clock=clock) as (ctl, _):
        await cached(ctl, key, fake, 3)
        attempted = script(fake, {name(pods[0]): refused_for_good()})
        await ctl.reconciler.reconcile(key)
        assert sorted(attempted) == sorted([name(pods[0]), name(pods[1])])
        await cached(ctl, key, fake, 3)
        await eventually(lambda: not ctl.state.ledger.expectations.pending(key), timeout=3)
        attempted.clear()
        await ctl.reconciler.reconcile(key)
        assert attempted == [name(pods[2])]  # not the pod in backoff
        await cached(ctl, key, fake, 3)
        await eventually(lambda: not ctl.state.ledger.expectations.pending(key), timeout=3)
        # the backoff ran out; pod 2 ends, freeing a slot; the refused pod goes now
        clock.now += 600
        fake.put(PODS, release(pods[2], phase="Succeeded"))
        fake.before_patch = None
        await cached(ctl, key, fake, 3)
        fake.drop_events = {"pods"}  # the release's own outcome clears it, not its watch event
        await ctl.reconciler.reconcile(key)
        assert not gated(fake, pods[0])
        assert ctl.state.blocked.get(uid(pods[0])) is None


@pytest.mark.parametrize(
    "error", [ApiError(404, "Not Found"), ApiError(409, "Conflict")], ids=["gone", "conflict"]
)
async def test_a_pod_gone_or_changed_under_the_patch_retries_the_owner(error: ApiError) -> None:
    """The cache was behind the server: re-decide (the outcome asks the worker to back off
    that key); the pod is no longer in flight nor ours."""
    fake = FakeKube()
    _, key, pods = setup(fake, pods=1, admitted=1)
    async with standby(fake) as (ctl, _):
        await cached(ctl, key, fake, 1)
        script(fake, {name(pods[0]): error})
        assert (await ctl.reconciler.reconcile(key)).retry == Retry.CHANGED
        assert not ctl.state.ledger.expectations.pending(key) and not ctl.state.ledger.ours()


async def test_patches_skipped_after_leadership_was_lost_ask_for_no_retry() -> None:
    """Leadership went between deciding and patching: nothing is in flight or ours, and the
    reconcile ends quietly (the next leader decides)."""
    fake = FakeKube()
    _, key, pods = setup(fake, pods=2, admitted=2)
    async with standby(fake) as (ctl, elector):
        await cached(ctl, key, fake, 2)
        elector.is_leader = False
        decision = (await ctl.reconciler.reconcile(key)).decision
        assert decision is not None and len(decision.releases) == 2
        assert not ctl.state.ledger.expectations.pending(key) and not ctl.state.ledger.ours()
        assert all(gated(fake, p) for p in pods) and ctl.stats.released == 0


async def test_a_pod_that_started_terminating_under_the_patch_keeps_its_gate_and_re_decides() -> (
    None
):
    """The pod started terminating after the view the decision read: the patch tests that
    view's version, so it is refused: no release, no gate removed from a pod that runs
    nothing, the owner re-decided (``Retry.CHANGED``), nothing left in flight or ours."""
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
        assert (await ctl.reconciler.reconcile(key)).retry == Retry.CHANGED
        assert ctl.stats.released == 0 and ctl.stats.patch_conflicts == 1
        assert gated(fake, p)
        assert not ctl.state.ledger.expectations.pending(key) and not ctl.state.ledger.ours()
        assert not ctl.state.ledger.uncertain_pods()


async def test_a_release_landing_on_a_terminating_pod_re_decides_and_keeps_it_expected() -> None:
    """The patch landed on a pod being deleted (outcome ``deleting``): no release, but the
    owner is re-decided (``Retry.CHANGED``) and the pod stays expected and ours, no longer
    uncertain (the answer came)."""
    fake = FakeKube()
    j = fake.put(JOBS, job("train", parallelism=1))
    p = fake.put(PODS, job_pod(j, index=0))
    fake.put(WORKLOADS, workload(j, {"main": 1}, admitted={"main": 1}))
    key = OwnerKey(NAMESPACE, j["metadata"]["uid"])
    async with standby(fake) as (ctl, _):
        await cached(ctl, key, fake, 1)

        async def landed_on_a_terminating_pod(
            releases: Any, rt: Any, **_: Any
        ) -> dict[str, PatchOutcome]:
            return {r.pod.uid: PatchOutcome.DELETING for r in releases}

        ctl.reconciler.patcher.release_all = landed_on_a_terminating_pod  # type: ignore[method-assign]
        assert (await ctl.reconciler.reconcile(key)).retry == Retry.CHANGED
        assert ctl.stats.released == 0
        assert ctl.state.ledger.expectations.pending(key) == {
            uid(p)
        } and ctl.state.ledger.ours() == {uid(p)}
        assert not ctl.state.ledger.uncertain_pods()


async def test_released_pods_feed_the_wait_histogram_from_when_room_was_made() -> None:
    """Each released pod's wait counts from the later of its arrival and the last room made
    for its owner (here the slice's admission, after the pods arrived)."""
    fake = FakeKube()
    clock = ManualClock(1000.0)
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
        slice_ = ctl.state.workloads.for_owner(key.uid)[0]
        assert [
            (e["involvedObject"]["kind"], e["involvedObject"]["uid"], e["message"])
            for e in released
        ] == [("Workload", slice_.uid, released_message(3, "main"))]


# -- settle_expired ------------------------------------------------------------------------------


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
    clock = ManualClock(1000.0)
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
        ctl.state.ledger.expectations.expect(key, uids, JOB)
        clock.now += TIMEOUT + 1
        rt = rt_of(ctl)
        await ctl.reconciler.settler.settle_expired(
            key, rt, ctl.state.ledger.expectations.expired(key)
        )
        assert ctl.state.ledger.expectations.pending(key) == {uid(pods[0])}
        assert (
            ctl.state.ledger.expectations.next_deadline(key) == TIMEOUT
        )  # re-armed now, not left expired
        assert ctl.state.ledger.expectations.expired_total == 8
        assert (
            ctl.state.ledger.expectations.observe(uid(pods[0]), OTHER_VIEW) is None
        )  # the deciding view's
        clock.now += TIMEOUT + 1
        await ctl.reconciler.settler.settle_expired(
            key, rt, ctl.state.ledger.expectations.expired(key)
        )
        assert ctl.state.ledger.expectations.expired_total == 9  # counts add up
        assert ctl.state.ledger.expectations.pending(key) == {uid(pods[0])}


@pytest.mark.parametrize("skipped", ["not cached", "replaced", "unreadable"])
async def test_one_pod_skipped_while_settling_does_not_stop_settling_the_next(skipped: str) -> None:
    """Settling moves on past a pod it cannot settle (not in the cache, another UID under its
    name, an unreadable answer): the next pod, released and live, is still re-armed."""
    fake = FakeKube()
    clock = ManualClock(1000.0)
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
        ctl.state.ledger.expectations.expect(key, [first, uid(pods[1])], JOB)
        clock.now += TIMEOUT + 1
        await ctl.reconciler.settler.settle_expired(key, rt_of(ctl), Ordered([first, uid(pods[1])]))
        assert ctl.state.ledger.expectations.pending(key) == {uid(pods[1])}
        assert ctl.state.ledger.expectations.next_deadline(key) == TIMEOUT


async def test_an_expired_expectation_whose_read_fails_still_counts_and_is_settled_later() -> None:
    """Issue 40's sixth path: our release of pod 0 landed, its watch event never came, and the
    read that settles the expired expectation times out. The expectation stays (counted in
    flight), so pod 1 is not released into the slot pod 0 holds; the next read settles it."""
    fake = FakeKube()
    clock = ManualClock(1000.0)
    client = Recording(fake)
    _, key, pods = setup(fake, pods=2, admitted=1)
    async with standby(fake, clock=clock, client=client) as (ctl, _):
        await cached(ctl, key, fake, 2)
        fake.drop_events = {"pods"}
        released_by_someone(fake, pods[0])  # as our patch would have
        ctl.state.ledger.expectations.expect(key, [uid(pods[0])], JOB)
        clock.now += TIMEOUT + 1

        def timing_out(obj: Any) -> Any:
            raise TimeoutError("the read timed out")

        client.rewrite["pods"] = timing_out
        decision = (await ctl.reconciler.reconcile(key)).decision
        assert decision is not None and not decision.releases
        assert uid(pods[0]) in ctl.state.ledger.expectations.pending(key)
        assert gated(fake, pods[1]) and not fake.patches
        del client.rewrite["pods"]
        await ctl.reconciler.reconcile(key)
        assert ctl.state.ledger.expectations.pending(key) == {
            uid(pods[0])
        }  # read: released, re-armed
        assert gated(fake, pods[1]) and not fake.patches


async def test_a_reconcile_settles_an_unknown_outcome_and_counts_a_released_pod_in_flight() -> None:
    """Our patch failed (unknown outcome) while another writer released the pod; the watch
    never showed it. The next reconcile settles it from the server, with no clock: the pod is
    at another version (our patch can no longer land) and released and live, so it is in
    flight (expected in the deciding view) and nothing more is patched (not even a fence)."""
    fake = FakeKube()
    clock = ManualClock(1000.0)
    _, key, pods = setup(fake, pods=2, admitted=1)
    async with standby(fake, clock=clock) as (ctl, _):
        await cached(ctl, key, fake, 2)
        fake.drop_events = {"pods"}
        attempted = script(fake, {name(pods[0]): ApiError(500, "Internal Server Error")})
        assert (await ctl.reconciler.reconcile(key)).retry == Retry.FAILED
        assert attempted == [name(pods[0])]
        assert ctl.state.ledger.uncertain_pods() == {uid(pods[0])}
        released_by_someone(fake, pods[0])
        attempted.clear()
        decision = (await ctl.reconciler.reconcile(key)).decision
        assert decision is None  # it waits for the deciding view to show that release
        assert attempted == []
        assert ctl.state.ledger.expectations.pending(key) == {uid(pods[0])}
        assert not ctl.state.ledger.uncertain_pods() and ctl.state.ledger.is_ours(uid(pods[0]))
        assert ctl.state.ledger.written(uid(pods[0])) == int(rv_of(fake, pods[0]))
        assert ctl.state.ledger.expectations.expired_total == 0 and ctl.stats.fences == 0


@pytest.mark.parametrize(
    "failing",
    [
        "the read, with an API error",
        "the read, with a dropped connection",
        "the fence patch",
        "the fence patch, a conflict every time on an unchanged pod",
    ],
)
async def test_an_unknown_outcome_stays_in_flight_while_it_cannot_be_settled(
    failing: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Our patch of pod 0 failed (unknown outcome): it may still land. The next reconcile
    tries to settle it, and the read of the pod (or the fence that would make it unable to
    land) fails too: the release stays uncertain, counts as in flight, and pod 1 is not
    released beside it (cap 1); once the settle goes through, the owner moves on."""
    fake = FakeKube()
    _, key, pods = setup(fake, pods=2, admitted=1)
    async with standby(fake) as (ctl, _):
        await cached(ctl, key, fake, 2)
        script(fake, {name(pods[0]): ApiError(500, "Internal Server Error")})
        assert (await ctl.reconciler.reconcile(key)).retry == Retry.FAILED
        get = fake.get
        if failing == "the fence patch":
            attempted = script(fake, {name(pods[0]): OSError("connection reset (fake)")})
        elif failing.startswith("the fence patch, a conflict"):  # three rounds, then give up
            attempted = script(fake, {name(pods[0]): ApiError(409, "Conflict")})
        else:
            attempted = script(fake, {})
            error: Exception = (
                ApiError(500, "Internal Server Error")
                if "API" in failing
                else OSError("connection reset (fake)")
            )

            async def failing_get(*a: Any, **kw: Any) -> Any:
                raise error

            monkeypatch.setattr(fake, "get", failing_get)
        decision = (await ctl.reconciler.reconcile(key)).decision
        assert ctl.state.ledger.uncertain_pods() == {uid(pods[0])}
        assert decision is not None and decision.pod_sets[0].in_flight == 1
        assert not decision.releases and name(pods[1]) not in attempted
        assert gated(fake, pods[1])
        assert ctl.stats.fences == 0
        monkeypatch.setattr(fake, "get", get)
        fake.before_patch = None
        await ctl.reconciler.reconcile(key)  # settled now: fenced (maybe re-decided: CHANGED)
        assert not ctl.state.ledger.uncertain_pods() and ctl.stats.fences == 1


async def test_an_unknown_outcome_on_an_unchanged_pod_is_fenced_then_released_once() -> None:
    """Our patch failed (unknown outcome) and the pod is still at the version it tested: it
    may still land. The next reconcile changes the pod (the fence: a new annotation), so that
    it can never land, and only then decides again: the pod is released once, by a patch
    that tests the fenced version."""
    fake = FakeKube()
    _, key, pods = setup(fake, pods=2, admitted=1)
    async with standby(fake) as (ctl, _):
        await cached(ctl, key, fake, 2)
        script(fake, {name(pods[0]): ApiError(500, "Internal Server Error")})
        assert (await ctl.reconciler.reconcile(key)).retry == Retry.FAILED
        tested = rv_of(fake, pods[0])
        fake.before_patch = None
        await eventually(lambda: rt_of(ctl).pods.by_uid.get(uid(pods[0])) is not None)
        for _ in range(3):  # until the cache shows the fenced version and the release lands
            if (await ctl.reconciler.reconcile(key)).retry == Retry.CHANGED:
                await anyio.sleep(0.05)
                continue
            if not gated(fake, pods[0]):
                break
        assert ctl.stats.fences == 1
        fenced = fake.read(PODS, NAMESPACE, name(pods[0])) or {}
        assert fenced["metadata"]["annotations"][FENCE_ANNOTATION] == tested
        before = pods[0]["metadata"].get("annotations") or {}
        assert before and all(  # the fence adds its annotation and removes none
            fenced["metadata"]["annotations"].get(k) == v for k, v in before.items()
        )
        assert not gated(fake, pods[0]) and gated(fake, pods[1])
        assert not ctl.state.ledger.uncertain_pods()


async def test_an_unknown_outcome_on_a_pod_gone_since_is_not_reported_as_someone_elses() -> None:
    """Our patch landed but was answered 504, and the pod went before the next reconcile;
    the pod watch lags all along. The fence's read finds the pod gone (settled), the cache
    still shows it gated, so it is patched again: 404. When the watch catches up, its gate
    removal is our own late release, not another writer's: a pod the server showed gone is
    remembered as gone, whatever a later outcome of ours says."""
    fake = FakeKube()
    _, key, pods = setup(fake, pods=2, admitted=1)
    async with standby(fake) as (ctl, _):
        await cached(ctl, key, fake, 2)
        reported: list[str] = []
        ctl.notices.foreign_release = lambda pod, rt, first: reported.append(pod.name)  # type: ignore[method-assign]
        held = fake.lag_watches("pods")
        fake.fail_patch(PatchFault.timed_out(0.0, 0.0, status=504), name=name(pods[0]))
        assert (await ctl.reconciler.reconcile(key)).retry == Retry.FAILED
        assert ctl.state.ledger.uncertain_pods() == {uid(pods[0])}
        assert fake.late_patches[0].state == "landed"
        gone(fake, pods[0])
        attempted = script(fake, {})
        # settled as gone, then patched again on the cached view
        assert (await ctl.reconciler.reconcile(key)).retry == Retry.CHANGED
        assert attempted == [name(pods[0])] and not ctl.state.ledger.uncertain_pods()
        held.release()
        await eventually(lambda: uid(pods[0]) not in rt_of(ctl).pods.by_uid, what="the delete")
        assert reported == []


# -- reconcile -----------------------------------------------------------------------------------


async def test_pending_expectations_re_queue_the_owner_when_the_first_one_expires() -> None:
    """Expectations still pending: no decision now, and the owner comes back when the first
    one expires (not at once, not later)."""
    fake = FakeKube()
    clock = ManualClock(1000.0)
    _, key, pods = setup(fake, pods=1, admitted=1)
    async with standby(fake, clock=clock) as (ctl, _):
        await cached(ctl, key, fake, 1)
        ctl.state.ledger.expectations.expect(key, [uid(pods[0])], JOB)
        clock.now += TIMEOUT - 0.5  # half a second left
        while len(ctl.state.queue):
            ctl.state.queue.done(await ctl.state.queue.get())
        before = ctl.stats.reconciles
        outcome = await ctl.reconciler.reconcile(key)
        assert outcome.decision is None and outcome.retry is None
        assert ctl.stats.reconciles == before + 1
        assert gated(fake, pods[0]) and key not in ctl.state.decisions
        assert outcome.after == pytest.approx(0.5)  # not at once, but at the first expiry


# -- the fence: fresh reads of the owner and of its slice -----------------------------------------


class Recording:
    """The fake behind a client that records each ``get``'s Resource and may rewrite what a
    ``get`` of some plural answers (the rest is the fake's)."""

    def __init__(self, inner: FakeKube) -> None:
        self.inner = inner
        self.gets: list[Resource] = []
        self.calls: list[tuple[Resource, str | None, str]] = []
        self.rewrite: dict[str, Any] = {}  # plural -> fn(obj) -> obj

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)

    async def get(self, resource: Resource, namespace: str | None, name: str) -> Any:
        self.gets.append(resource)
        self.calls.append((resource, namespace, name))
        obj = await self.inner.get(resource, namespace, name)
        fn = self.rewrite.get(resource.plural)
        return fn(obj) if fn is not None and obj is not None else obj


JOB_RESOURCE = Resource("batch", "v1", "jobs", "Job")


def fenced_job(fake: FakeKube) -> tuple[dict[str, Any], OwnerKey, list[dict[str, Any]]]:
    """A Job of 3 pods with 2 admitted: pods 0 and 1 released and running, pod 2 gated."""
    return setup(fake, pods=3, admitted=2, released=2)


async def free_a_slot(ctl: Controller, fake: FakeKube, key: OwnerKey, pod: dict[str, Any]) -> None:
    """The released ``pod`` fails, after the cached owner and slice were last seen: its slot
    is free, and the reconcile must read both fresh before refilling it."""
    released_by_someone(fake, pod, phase="Failed")
    await cached(ctl, key, fake, 3)


async def synced_owner(ctl: Controller, key: OwnerKey) -> None:
    await eventually(lambda: key.uid in ctl.state.owners, timeout=3, what="the cached Job")


async def synced_then_blind(ctl: Controller, fake: FakeKube, key: OwnerKey, plural: str) -> None:
    """The caches hold the fenced Job, its slice and its 3 pods; from now on the ``plural``
    watch shows nothing, so what the fake changes there only a fresh read sees."""
    await cached(ctl, key, fake, 3)
    await synced_owner(ctl, key)
    fake.drop_events = {plural}


async def test_a_freed_slot_is_refilled_after_reading_the_job_and_its_slice_fresh() -> None:
    """The fence reads the owner as the plugin names it (batch/v1 jobs, kind Job) and the
    slice at the served Workload version; both agree with the caches, so the freed slot is
    refilled. The reads are the decision's own: the caches keep what their watches showed."""
    fake = FakeKube()
    client = Recording(fake)
    j, key, pods = fenced_job(fake)
    async with standby(fake, client=client) as (ctl, _):
        await synced_then_blind(ctl, fake, key, "jobs")
        fake.put(JOBS, j)  # the Job moves on; the cache does not see it
        await free_a_slot(ctl, fake, key, pods[0])
        client.gets.clear()
        decision = (await ctl.reconciler.reconcile(key)).decision
        assert decision is not None and decision.released_names == [name(pods[2])]
        assert not gated(fake, pods[2])
        reads = [r for r in client.gets if r.plural != "pods"]
        assert sorted(reads, key=lambda r: r.plural) == [
            JOB_RESOURCE,
            JOB_RESOURCE,
            workload_resource(ctl.state.workload_version),
            workload_resource(ctl.state.workload_version),
        ]  # two rounds, equal: the moment the decision rests on
        assert ctl.state.workload_version == "v1beta2"
        now = fake.read(JOBS, NAMESPACE, name(j))
        assert now is not None
        assert int(ctl.state.owners.get(key.uid).resource_version) < int(
            now["metadata"]["resourceVersion"]
        )


async def test_the_bounds_are_read_until_two_rounds_agree_and_nothing_goes_when_they_never_do() -> (
    None
):
    """Bounds read at different moments can combine into a cap that was never true (the
    explorer's resize-no-delete, RayJob, depth 6: a slice read before Kueue lowered it beside
    a RayCluster read after it grew back). The view reads every bound again until two rounds
    show the same versions; an owner whose version moves at every read never gets a release,
    and the reconcile gives up (the worker backs off)."""
    fake = FakeKube()
    client = Recording(fake)
    _, key, pods = fenced_job(fake)
    async with standby(fake, client=client) as (ctl, _):
        await synced_then_blind(ctl, fake, key, "jobs")
        await free_a_slot(ctl, fake, key, pods[0])
        reads = [0]

        def moving(obj: dict[str, Any]) -> dict[str, Any]:
            reads[0] += 1
            obj["metadata"]["resourceVersion"] = str(1000 + reads[0])
            return obj

        client.rewrite["jobs"] = moving
        assert (await ctl.reconciler.reconcile(key)).retry == Retry.MOVING
        assert reads[0] == 1 + SNAPSHOT_ROUNDS
        assert gated(fake, pods[2]) and not fake.patches
        del client.rewrite["jobs"]
        decision = (await ctl.reconciler.reconcile(key)).decision
        assert decision is not None and decision.released_names == [name(pods[2])]


@pytest.mark.parametrize("failing", ["jobs", "workloads"])
async def test_a_view_read_that_fails_refills_nothing_and_fails_the_reconcile(
    failing: str,
) -> None:
    """One of the two reads the fence sends at once fails (a 500): the decision may not fall
    back on the stale view, so the freed slot stays empty and the reconcile fails with that
    error itself (not an exception group), for the worker's backoff."""
    fake = FakeKube()
    client = Recording(fake)
    j, key, pods = fenced_job(fake)
    async with standby(fake, client=client) as (ctl, _):
        await synced_then_blind(ctl, fake, key, "jobs")
        fake.put(JOBS, j)
        await free_a_slot(ctl, fake, key, pods[0])

        def fail(obj: Any) -> Any:
            raise ApiError(500, "Internal Server Error", "")

        client.rewrite[failing] = fail
        with pytest.raises(ApiError) as raised:
            await ctl.reconciler.reconcile(key)
        assert raised.value.status == 500
        assert gated(fake, pods[2])


@pytest.mark.parametrize("how", ["replaced", "gone"])
async def test_a_freed_slot_is_not_refilled_when_the_fresh_job_is_not_ours(how: str) -> None:
    """The owner read fresh is another object of the same name (another UID), or is gone:
    nothing may be released for it."""
    fake = FakeKube()
    client = Recording(fake)
    j, key, pods = fenced_job(fake)
    async with standby(fake, client=client) as (ctl, _):
        await synced_then_blind(ctl, fake, key, "jobs")
        if how in ("replaced", "gone"):
            fake.delete(JOBS, NAMESPACE, name(j))
        if how == "replaced":
            other = job("train", parallelism=3)
            other["metadata"]["uid"] = key.uid + "-other"
            fake.put(JOBS, other)
        await free_a_slot(ctl, fake, key, pods[0])
        client.gets.clear()
        assert (await ctl.reconciler.reconcile(key)).decision is None
        assert JOB_RESOURCE in client.gets  # it was read
        assert gated(fake, pods[2]) and not fake.patches
        assert key not in ctl.state.decisions and not ctl.state.ledger.expectations.pending(key)


@pytest.mark.parametrize("how", ["replaced", "gone"])
async def test_a_freed_slot_is_not_refilled_when_the_fresh_slice_is_not_ours(how: str) -> None:
    """The slice read fresh is gone, or another Workload of the same name (another UID, even
    one admitting more): no slice is active in the view, and nothing is released."""
    fake = FakeKube()
    j, key, pods = fenced_job(fake)
    async with standby(fake) as (ctl, _):
        await synced_then_blind(ctl, fake, key, "workloads")
        old = ctl.state.workloads.for_owner(key.uid)[0]
        fake.delete(WORKLOADS, NAMESPACE, old.name)
        if how == "replaced":
            other = workload(j, {"main": 3}, admitted={"main": 3})
            other["metadata"]["uid"] = old.uid + "-other"
            fake.put(WORKLOADS, other)
        await free_a_slot(ctl, fake, key, pods[0])
        decision = (await ctl.reconciler.reconcile(key)).decision
        assert decision is not None and not decision.releases and decision.active_slice is None
        assert gated(fake, pods[2]) and not fake.patches


async def test_a_slice_lowered_in_place_is_honoured_from_the_fresh_read() -> None:
    """Kueue lowered the slice to 1 after pod 0 failed; the Workload watch has not shown it.
    The fresh read shows the lowered slice and the freed slot stays free."""
    fake = FakeKube()
    j, key, pods = fenced_job(fake)
    async with standby(fake) as (ctl, _):
        await synced_then_blind(ctl, fake, key, "workloads")
        await free_a_slot(ctl, fake, key, pods[0])
        lowered = fake.put(WORKLOADS, workload(j, {"main": 3}, admitted={"main": 1}))
        decision = (await ctl.reconciler.reconcile(key)).decision
        assert decision is not None and not decision.releases
        assert gated(fake, pods[2]) and not fake.patches
        assert decision.pod_sets[0].cap == 1, lowered


# -- reconcile: owners without slices, kinds not configured, audit mode ------------------------


async def test_an_owner_without_slices_is_forgotten_and_the_others_are_kept() -> None:
    """Its Workload went: the owner's expectations, last decision, audit state and slice
    hand-over notice go with it (even a second time, when nothing is left); another owner's
    stay."""
    fake = FakeKube()
    _, gone_key, _ = setup(fake, pods=1, admitted=1, name="a")
    _, kept_key, _ = setup(fake, pods=1, admitted=1, name="b")
    async with standby(fake) as (ctl, _):
        await eventually(
            lambda: len(rt_of(ctl).pods) == 2 and len(ctl.state.workloads) == 2, timeout=5
        )
        fake.drop_events = {"pods"}  # the releases stay expected
        tracker = ctl.state.auditor.tracker
        for key in (gone_key, kept_key):
            await ctl.reconciler.reconcile(key)
            assert ctl.state.ledger.expectations.pending(key) and key in ctl.state.decisions
            tracker.releasable_since(key, ["u"], 1.0)
            ctl.notices._inactive_since[key] = 1.0
        (wl,) = ctl.state.workloads.for_owner(gone_key.uid)
        fake.delete(WORKLOADS, NAMESPACE, wl.name)
        await eventually(lambda: not ctl.state.workloads.for_owner(gone_key.uid), timeout=3)
        for _ in range(2):
            assert (await ctl.reconciler.reconcile(gone_key)) == Outcome()
        assert (
            not ctl.state.ledger.expectations.pending(gone_key)
            and gone_key not in ctl.state.decisions
        )
        assert tracker.releasable_since(gone_key, ["u"], 2.0) == {"u": 2.0}  # seen anew
        assert gone_key not in ctl.notices._inactive_since
        assert ctl.state.ledger.expectations.pending(kept_key) and kept_key in ctl.state.decisions
        assert tracker.releasable_since(kept_key, ["u"], 2.0) == {"u": 1.0}  # remembered
        assert ctl.notices._inactive_since[kept_key] == 1.0


async def test_an_owner_of_a_kind_not_configured_is_left_alone() -> None:
    """A cached Workload whose owner is a JobSet, with only Jobs configured (the watch would
    not show it; the cache is handed it): no decision, no error."""
    fake = FakeKube()
    js = jobset("llm", {"workers": 1})
    key = OwnerKey(NAMESPACE, js["metadata"]["uid"])
    async with standby(fake) as (ctl, _):
        wl = workload(js, {"workers": 1}, admitted={"workers": 1})
        ctl.state.workloads.on_change(None, parse_workload(wl))
        assert (await ctl.reconciler.reconcile(key)).decision is None
        assert key not in ctl.state.decisions and not fake.patches


async def test_a_kind_in_audit_mode_is_decided_and_recorded_but_never_patched() -> None:
    """``mode: audit`` on the kind: the reconcile makes the same decision (two pods
    releasable), records it, and patches nothing."""
    fake = FakeKube()
    _, key, pods = setup(fake, pods=3, admitted=2)
    cfg = config(kinds=[{"group": "batch", "kind": "Job", "mode": "audit"}])
    async with standby(fake, cfg) as (ctl, _):
        await cached(ctl, key, fake, 3)
        decision = (await ctl.reconciler.reconcile(key)).decision
        assert decision is not None
        assert decision.released_names == [name(pods[0]), name(pods[1])]
        assert ctl.state.decisions[key] is decision
        assert all(gated(fake, p) for p in pods) and not fake.patches
        assert not ctl.state.ledger.expectations.pending(key) and ctl.stats.released == 0


# -- pod set updates -----------------------------------------------------------------------------


def with_updates(wl: dict[str, Any], *checks: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    """The Workload with admission checks, each Ready with one pod set update for main."""
    wl["status"]["admissionChecks"] = [
        {
            "name": check,
            "state": "Ready",
            "message": "",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
            "podSetUpdates": [{"name": "main", **update}],
        }
        for check, update in checks
    ]
    return wl


POOL = {"cloud.google.com/gke-nodepool": "pool-a"}


@pytest.mark.parametrize("apply", [True, False], ids=["default", "applyPodSetUpdates-false"])
async def test_pod_set_updates_go_into_the_release_patch_unless_turned_off(apply: bool) -> None:
    """An admission check's pod set update (a label and a node selector) is applied in the
    release patch by default, and not with ``applyPodSetUpdates: false``."""
    fake = FakeKube()
    j = fake.put(JOBS, job("train", parallelism=1))
    p = fake.put(PODS, job_pod(j, index=0))
    update = {"labels": {"team": "vision"}, "nodeSelector": POOL}
    fake.put(
        WORKLOADS,
        with_updates(workload(j, {"main": 1}, admitted={"main": 1}), ("prov", update)),
    )
    key = OwnerKey(NAMESPACE, j["metadata"]["uid"])
    cfg = config() if apply else config(applyPodSetUpdates=False)
    async with standby(fake, cfg) as (ctl, _):
        await cached(ctl, key, fake, 1)
        await ctl.reconciler.reconcile(key)
        now = fake.read(PODS, NAMESPACE, name(p))
        assert now is not None and not gated(fake, p)
        labels = now["metadata"]["labels"]
        selector = now["spec"].get("nodeSelector") or {}
        if apply:
            assert labels["team"] == "vision" and selector == POOL
        else:
            assert "team" not in labels and selector == {}


async def test_pods_kept_gated_by_conflicting_updates_are_announced_for_their_owner() -> None:
    """Two admission checks disagree on a label: the pod stays gated, and the warning names
    the owner (a ``PodSetUpdateConflict`` Event on its slice)."""
    fake = FakeKube()
    j = fake.put(JOBS, job("train", parallelism=1))
    p = fake.put(PODS, job_pod(j, index=0))
    fake.put(
        WORKLOADS,
        with_updates(
            workload(j, {"main": 1}, admitted={"main": 1}),
            ("a", {"labels": {"team": "vision"}}),
            ("b", {"labels": {"team": "speech"}}),
        ),
    )
    key = OwnerKey(NAMESPACE, j["metadata"]["uid"])
    async with standby(fake) as (ctl, _):
        await cached(ctl, key, fake, 1)
        decision = (await ctl.reconciler.reconcile(key)).decision
        assert decision is not None and not decision.releases
        assert gated(fake, p) and not fake.patches
        (event,) = await eventually(lambda: events_of(fake, "PodSetUpdateConflict"), timeout=3)
        slice_ = ctl.state.workloads.for_owner(key.uid)[0]
        assert event["involvedObject"]["uid"] == slice_.uid
        assert event["type"] == "Warning"


async def test_a_slice_read_back_under_another_owner_is_no_longer_this_owners() -> None:
    """The slice read fresh names another controller (its ownerReference was changed): it is
    not this owner's slice any more, and nothing is released for this one on its count."""
    fake = FakeKube()
    _, key, pods = fenced_job(fake)
    other = fake.put(JOBS, job("other", parallelism=1))
    async with standby(fake) as (ctl, _):
        await synced_then_blind(ctl, fake, key, "workloads")
        (old,) = ctl.state.workloads.for_owner(key.uid)
        reowned = fake.read(WORKLOADS, NAMESPACE, old.name)
        assert reowned is not None
        reowned["metadata"]["ownerReferences"] = workload(other, {"main": 1})["metadata"][
            "ownerReferences"
        ]
        fake.put(WORKLOADS, reowned)
        await free_a_slot(ctl, fake, key, pods[0])
        decision = (await ctl.reconciler.reconcile(key)).decision
        assert decision is not None and not decision.releases and decision.active_slice is None
        assert gated(fake, pods[2]) and not fake.patches


# -- _inputs: a kind whose pods are selected through another object ------------------------------


async def test_a_rayjobs_pods_are_decided_through_its_rayclusters_size_and_hosts() -> None:
    """A RayJob's pods are found through the RayCluster it controls, whose size caps each
    group (2 workers of 3 admitted) and whose hosts per replica keep a replica missing a host
    gated (a TPU replica of 2 hosts, one created)."""
    fake = FakeKube()
    owner = ray_owner("RayJob", "train")
    rc = fake.put(
        RAYCLUSTERS, cluster_of(owner, "train-raycluster-abcde", {"workers": (2, 1), "tpu": (1, 2)})
    )
    head = fake.put(PODS, ray_head_pod(rc))
    workers = [
        fake.put(PODS, ray_worker_pod(rc, "workers", replica_index=i, created=2 + i, seed=str(i)))
        for i in range(3)
    ]
    tpu_name = ray_replica_name("tpu", "r0")
    tpu = fake.put(
        PODS,
        ray_worker_pod(rc, "tpu", replica_index=0, replica_name=tpu_name, host_index=0, seed="t"),
    )
    fake.put(
        WORKLOADS,
        workload(
            owner,
            {"head": 1, "workers": 3, "tpu": 2},
            admitted={"head": 1, "workers": 3, "tpu": 2},
        ),
    )
    key = OwnerKey(NAMESPACE, owner["metadata"]["uid"])
    cfg = config(kinds=[{"group": "ray.io", "kind": "RayJob"}])
    async with standby(fake, cfg) as (ctl, _):
        rt = ctl.state.kinds[Kind("ray.io", "RayJob")]
        await eventually(
            lambda: (
                len(rt.pods) == 5
                and ctl.state.workloads.has_owner(key.uid)
                and ctl.state.objects.controlled_by(key.uid)
            ),
            timeout=5,
            what="the RayJob's slice, RayCluster and pods cached",
        )
        decision = (await ctl.reconciler.reconcile(key)).decision
        assert decision is not None
        want = [name(head), name(workers[0]), name(workers[1])]
        assert sorted(decision.released_names) == sorted(want)
        assert [gated(fake, p) for p in (head, *workers, tpu)] == [False] * 3 + [True] * 2


@pytest.mark.parametrize("fresh", ["unchanged", "shrunk", "replaced"])
async def test_a_freed_rayjob_slot_is_refilled_only_from_its_raycluster_read_fresh(
    fresh: str,
) -> None:
    """A RayJob's released worker fails after the cached RayCluster was last seen: the fence
    reads that RayCluster (ray.io/v1 rayclusters, by namespace and name) before refilling.
    Unchanged: the slot is refilled. Shrunk to 1 worker meanwhile: the one live worker
    already fills it. Another object under the name: the size is unknown, nothing is
    released."""
    fake = FakeKube()
    client = Recording(fake)
    owner = ray_owner("RayJob", "train")
    rc_name = "train-raycluster-abcde"
    rc = fake.put(RAYCLUSTERS, cluster_of(owner, rc_name, {"workers": (2, 1)}))
    head = fake.put(PODS, release(ray_head_pod(rc)))
    workers = [
        fake.put(PODS, ray_worker_pod(rc, "workers", replica_index=i, created=2 + i, seed=str(i)))
        for i in range(3)
    ]
    for w in workers[:2]:
        released_by_someone(fake, w)
    fake.put(
        WORKLOADS,
        workload(owner, {"head": 1, "workers": 3}, admitted={"head": 1, "workers": 3}),
    )
    key = OwnerKey(NAMESPACE, owner["metadata"]["uid"])
    cfg = config(kinds=[{"group": "ray.io", "kind": "RayJob"}])
    async with standby(fake, cfg, client=client) as (ctl, _):
        rt = ctl.state.kinds[Kind("ray.io", "RayJob")]

        def synced() -> bool:
            want = {
                p["metadata"]["uid"]: p["metadata"]["resourceVersion"] for p in fake.items(PODS)
            }
            have = {u: v.resource_version for u, v in rt.pods.by_uid.items()}
            return have == want and bool(ctl.state.objects.controlled_by(key.uid))

        await eventually(synced, timeout=5, what="the RayJob's RayCluster and pods cached")
        fake.drop_events = {"rayclusters"}
        if fresh == "shrunk":
            fake.put(RAYCLUSTERS, cluster_of(owner, rc_name, {"workers": (1, 1)}))
        elif fresh == "replaced":
            fake.delete(RAYCLUSTERS, NAMESPACE, rc_name)
            other = cluster_of(owner, rc_name, {"workers": (2, 1)})
            other["metadata"]["uid"] = "uid-another-raycluster"
            fake.put(RAYCLUSTERS, other)
        else:
            fake.put(RAYCLUSTERS, fake.read(RAYCLUSTERS, NAMESPACE, rc_name))  # a newer rv
        released_by_someone(fake, workers[0], phase="Failed")
        await eventually(synced, timeout=5, what="the failed worker cached")
        client.calls.clear()
        await ctl.reconciler.reconcile(key)
        reads = [c for c in client.calls if c[0].plural == "rayclusters"]
        assert reads == [(RAYCLUSTERS, NAMESPACE, rc_name)] * 2
        assert gated(fake, workers[2]) == (fresh != "unchanged")
        assert not gated(fake, head)
        assert [v.uid for v in ctl.state.objects.controlled_by(key.uid)] == [rc["metadata"]["uid"]]


async def test_our_own_release_seen_and_then_ended_frees_its_slot() -> None:
    """Our release of pod 0 lands and the watch shows it; then pod 0 fails. Once the view has
    caught up with our write the pod is no longer in flight, so its slot goes to pod 1."""
    fake = FakeKube()
    _, key, pods = setup(fake, pods=2, admitted=1)
    async with standby(fake) as (ctl, _):
        await cached(ctl, key, fake, 2)
        first = (await ctl.reconciler.reconcile(key)).decision
        assert first is not None and first.released_names == [name(pods[0])]
        await cached(ctl, key, fake, 2)
        assert ctl.state.ledger.written(uid(pods[0])) is not None
        released_by_someone(fake, pods[0], phase="Failed")
        await cached(ctl, key, fake, 2)
        assert not ctl.state.ledger.expectations.pending(key)  # the watch showed our release
        second = (await ctl.reconciler.reconcile(key)).decision
        assert second is not None and second.released_names == [name(pods[1])]
        assert not gated(fake, pods[1])


async def test_releases_into_new_capacity_read_the_owner_and_slice_after_the_pods() -> None:
    """Admission fills a slice's capacity: the decision still rests on the view (the pods
    from the cache, then the Job and its slice read fresh, together: one round, which finds
    them as the caches held them at the pods' snapshot)."""
    fake = FakeKube()
    client = Recording(fake)
    _, key, _ = setup(fake, pods=2, admitted=2)
    async with standby(fake, client=client) as (ctl, _):
        await cached(ctl, key, fake, 2)
        await synced_owner(ctl, key)
        client.gets.clear()
        decision = (await ctl.reconciler.reconcile(key)).decision
        assert decision is not None and len(decision.released_names) == 2
        reads = sorted(r.plural for r in client.gets if r.plural != "pods")
        assert reads == ["jobs", "workloads"]


async def test_a_job_shrunk_and_grown_back_unseen_by_the_caches_is_capped_by_its_fresh_slice() -> (
    None
):
    """Issue 40's first path: the Job shrank, its released pod went, Kueue lowered the slice
    to 1 and the Job grew back, all unseen by the Job and Workload watches. The pod watch shows
    the failed pod; the view reads the lowered slice, so the one released pod left fills it."""
    fake = FakeKube()
    j, key, pods = setup(fake, pods=3, admitted=3, released=2)
    async with standby(fake) as (ctl, _):
        await cached(ctl, key, fake, 3)
        await synced_owner(ctl, key)
        fake.drop_events = {"jobs", "workloads"}
        fake.put(WORKLOADS, workload(j, {"main": 1}, admitted={"main": 3}))
        released_by_someone(fake, pods[0], phase="Failed")
        await cached(ctl, key, fake, 3)
        decision = (await ctl.reconciler.reconcile(key)).decision
        assert decision is not None and not decision.releases
        assert gated(fake, pods[2]) and not fake.patches


class LabelOnlyJobs:
    """The Job kind as a third-party plugin might declare it: pods found by their label and
    proven by their ownerReference, but no ``owner_resource`` (the owner is never read, so
    its size is unknown and the old rule applies)."""

    @staticmethod
    @hookimpl
    def ungater_kinds() -> list[KindSpec]:
        return [KindSpec(group="batch", kind="Job", pod_label=job_plugin.CONTROLLER_UID_LABEL)]

    ungater_pod_selector = staticmethod(job_plugin.ungater_pod_selector)
    ungater_owns_pod = staticmethod(job_plugin.ungater_owns_pod)
    ungater_pod_set = staticmethod(job_plugin.ungater_pod_set)
    ungater_sort_key = staticmethod(job_plugin.ungater_sort_key)


async def test_a_freed_slot_of_a_kind_whose_owner_is_never_read_is_refilled_without_one() -> None:
    """No owner resource and no objects between: there is no owner to read, so the fence
    view reads only the slice, and the freed slot is refilled under it."""
    fake = FakeKube()
    client = Recording(fake)
    _, key, pods = fenced_job(fake)
    async with standby(fake, client=client, plugins={"label-only": LabelOnlyJobs}) as (ctl, _):
        await cached(ctl, key, fake, 3)
        assert ctl.state.kinds[JOB].handler.spec.owner_resource is None
        released_by_someone(fake, pods[0], phase="Failed")
        await cached(ctl, key, fake, 3)
        client.gets.clear()
        decision = (await ctl.reconciler.reconcile(key)).decision
        assert decision is not None and decision.released_names == [name(pods[2])]
        assert [r.plural for r in client.gets if r.plural != "pods"] == ["workloads"]
        assert key.uid not in ctl.state.owners


async def test_a_freed_slot_whose_job_was_never_cached_is_refilled_after_reading_it() -> None:
    """The Job watch has not shown the Job at all when a released pod fails: an owner never
    the caches do not stop the view from being read, and the view reads the Job."""
    fake = FakeKube()
    client = Recording(fake)
    async with standby(fake, client=client) as (ctl, _):
        fake.drop_events = {"jobs"}
        j, key, pods = fenced_job(fake)
        await cached(ctl, key, fake, 3)
        released_by_someone(fake, pods[0], phase="Failed")
        await cached(ctl, key, fake, 3)
        assert key.uid not in ctl.state.owners
        client.gets.clear()
        decision = (await ctl.reconciler.reconcile(key)).decision
        assert decision is not None and decision.released_names == [name(pods[2])]
        assert JOB_RESOURCE in client.gets
        assert fake.read(JOBS, NAMESPACE, name(j)) is not None


async def test_audit_mode_bounds_what_would_be_released_by_the_owners_size() -> None:
    """The Job shrank to 1 while its slice still admits 2: release mode would refill nothing,
    and audit mode's decision (what release mode would do) says the same."""
    fake = FakeKube()
    j, key, pods = setup(fake, pods=2, admitted=2, released=1)
    j["spec"]["parallelism"] = 1
    fake.put(JOBS, j)
    cfg = config(kinds=[{"group": "batch", "kind": "Job", "mode": "audit"}])
    async with standby(fake, cfg) as (ctl, _):
        await cached(ctl, key, fake, 2)
        await synced_owner(ctl, key)
        decision = (await ctl.reconciler.reconcile(key)).decision
        assert decision is not None and decision.released_names == []
        assert gated(fake, pods[1]) and not fake.patches


async def test_audit_mode_keeps_each_owners_findings_apart() -> None:
    """Two over-released Jobs in audit mode, audited in turn: each finding is dated from its
    own owner's first audit, so both are reported once the grace has passed."""
    fake = FakeKube()
    keys = [setup(fake, pods=2, admitted=1, released=2, name=n)[1] for n in ("a", "b")]
    cfg = config(
        kinds=[{"group": "batch", "kind": "Job", "mode": "audit"}],
        audit={"reportAfterSeconds": 5.0},
    )
    async with standby(fake, cfg) as (ctl, _):
        clock = ManualClock(1000.0)
        ctl.state.auditor.wall_clock = clock
        await eventually(
            lambda: (
                all(len(ctl.state.workloads.for_owner(k.uid)) == 1 for k in keys)
                and len(rt_of(ctl).pods) == 4
            ),
            timeout=5,
            what="both Jobs cached",
        )
        for key in keys:
            await ctl.reconciler.reconcile(key)
        assert ctl.state.auditor.reported == 0
        clock.now += 6.0
        for key in keys:
            await ctl.reconciler.reconcile(key)
        reported = sorted(f.owner for f in ctl.state.auditor.tracker.findings())
        assert ctl.state.auditor.reported == 2
        assert reported == [f"Job {NAMESPACE}/a", f"Job {NAMESPACE}/b"]
