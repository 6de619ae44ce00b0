"""Our own writes (docs/safety.md, "Our own writes"): what each answered patch outcome does
to the write ledger (expectations, ``ours``, the per-pod backoff, the retry signal), the wait on
pending expectations, and how expired expectations are settled from the API server, including
for a pod the deciding cache never held.

Most run the reconciler one ``reconcile(key)`` at a time on a controller whose workers never
start (``viewkit.standby``); they were written to kill the mutants of
``ungater/_controller/reconciler.py`` the whole-controller tests left alive (docs/testing.md).
The cap-path tests run the whole controller and check the cap over the fake's whole history.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests.clock import ManualClock
from tests.fakekube import FakeKube
from tests.lagging import Lagging
from tests.objects import JOBS, WORKLOADS
from tests.polling import eventually, holds_for
from tests.unit.capcheck import (
    HandOver,
    config,
    live_released,
    peak_live_released,
)
from tests.unit.controller.viewkit import (
    JOB,
    Recording,
    cached,
    events_of,
    gated,
    gone,
    name,
    refused_for_good,
    released_by_someone,
    rt_of,
    samples,
    script,
    setup,
    standby,
    term_behind_every_cache,
    uid,
)
from tests.unit.harness import running
from tests.unit.podfactory import (
    NAMESPACE,
    job,
    job_pod,
    release,
    workload,
)
from ungater._controller.reconciler import Retry
from ungater._kube.client import PODS, ApiError, Resource
from ungater._model.views import Kind

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


OTHER_VIEW = Kind("jobset.x-k8s.io", "JobSet")  # another pod index that may see the same pod


class Ordered(frozenset[str]):
    """Expired UIDs settled in the order given (a frozenset's own order is the hash's)."""

    order: list[str]

    def __new__(cls, items: list[str]) -> Ordered:
        out = super().__new__(cls, items)
        out.order = list(items)
        return out

    def __iter__(self) -> Any:
        return iter(self.order)


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


async def test_pending_expectations_re_queue_the_owner_when_the_first_one_expires() -> None:
    """Expectations still pending: the owner is decided on all the same, the expected pod
    counting in flight (not released again), and comes back when the first expectation
    expires (not at once, not later)."""
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
        assert outcome.decision is not None and outcome.retry is None
        assert not outcome.decision.releases
        assert [r.in_flight for r in outcome.decision.pod_sets] == [1]
        assert ctl.stats.reconciles == before + 1
        assert gated(fake, pods[0]) and not fake.patches
        assert outcome.after == pytest.approx(0.5)  # not at once, but at the first expiry


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


@pytest.mark.anyio
async def test_an_expired_expectation_for_a_pod_the_cache_never_held_is_settled_by_a_read() -> None:
    """A new term; the pod watch sees one event after the term's start, then stays open but
    silent. Pod 0 is created gated and the slice admits 1. The Job cache is behind the term's
    start, so the release is decided on quorum reads and picks pod 0, which the pod cache never
    held. A bookmark then carries every cache past the term's start (no owner needs a proof any
    more), and pod 0's expectation expires: it must be settled from the API server, not dropped
    because the cache has no pod 0, or the next decision releases pod 1 beside it.

    Issue 33, review three, path 1: an expectation expired for a pod the deciding cache
    never held (released on a new term's quorum reads), and was dropped unread: the next
    decision released another pod.
    """
    fake = FakeKube()
    client = Lagging(fake)
    j = fake.put(JOBS, job("train", parallelism=2, completions=2))
    elector = HandOver(fake)
    async with running(client, config(), elector=elector) as ctl:
        rt = ctl.state.kinds[next(iter(ctl.state.kinds))]
        await term_behind_every_cache(fake, elector, ctl)
        fake.put(PODS, job_pod(j, index=1, created=2))  # the pod watch moves past the term
        await eventually(lambda: len(rt.pods) == 1, what="pod 1 in the cache")
        held = client.hold("pods")  # ... and then goes silent
        fake.put(PODS, job_pod(j, index=0, created=1))
        fake.put(WORKLOADS, workload(j, {"main": 2}, admitted={"main": 1}))
        await eventually(lambda: live_released(fake) == 1, what="pod 0 released")
        assert ctl.stats.proof_reads >= 1 and len(rt.pods) == 1
        fake.bookmark()  # the Job and Workload caches pass the term: every owner is proven
        await anyio.sleep(0.3)  # pod 0's expectation (0.2 s) expires, the pod still unseen
        fake.put(JOBS, {**j, "status": {"active": 1}})  # the Job's status wakes its owner key
        await holds_for(lambda: live_released(fake) == 1, 0.8, what="cap 1, pod 0 unseen")
        assert ctl.state.ledger.expectations.expired_total >= 1, (
            ctl.stats,
            len(ctl.state.ledger.expectations),
            ctl.state.freshness.confirmed,
        )
        held.set()
        await holds_for(lambda: live_released(fake) == 1, 0.3, what="cap 1 once caught up")
    assert peak_live_released(fake) == 1


@pytest.mark.anyio
async def test_an_expired_expectation_for_a_never_held_pod_that_is_gone_is_forgotten() -> None:
    """As in path 1, pod 0 is released on a new term's quorum reads and the pod cache never
    holds it; then it is deleted. When its expectation expires the read finds it gone: the
    ledger forgets it (nothing kept for a pod no view will ever show) and the owner is decided
    on again, releasing pod 1 into the freed slot.

    "Path 1" is issue 33's review three, path 1
    (test_an_expired_expectation_for_a_pod_the_cache_never_held_is_settled_by_a_read).
    """
    fake = FakeKube()
    client = Lagging(fake)
    j = fake.put(JOBS, job("train", parallelism=2, completions=2))
    elector = HandOver(fake)
    async with running(client, config(), elector=elector) as ctl:
        rt = ctl.state.kinds[next(iter(ctl.state.kinds))]
        await term_behind_every_cache(fake, elector, ctl)
        fake.put(PODS, job_pod(j, index=1, created=2))
        await eventually(lambda: len(rt.pods) == 1, what="pod 1 in the cache")
        client.hold("pods")  # from here the pod watch is silent
        zero = fake.put(PODS, job_pod(j, index=0, created=1))
        fake.put(WORKLOADS, workload(j, {"main": 2}, admitted={"main": 1}))
        await eventually(lambda: live_released(fake) == 1, what="pod 0 released")
        uid0 = zero["metadata"]["uid"]
        assert ctl.state.ledger.locate(uid0) is not None
        fake.delete(PODS, NAMESPACE, zero["metadata"]["name"])
        fake.finalize(PODS, NAMESPACE, zero["metadata"]["name"])
        await anyio.sleep(0.3)  # the expectation (0.2 s) expires
        fake.put(JOBS, {**j, "status": {"active": 0}})  # wakes the owner
        await eventually(
            lambda: live_released(fake) == 1 and not ctl.state.ledger.is_ours(uid0),
            what="pod 1 released, pod 0 forgotten",
        )
        assert ctl.state.ledger.locate(uid0) is None and ctl.state.ledger.is_gone(uid0)


class Overlapping:
    """The fake, holding each pod GET until ``hold`` are in flight at once (or a short
    deadline passes), and counting the most in flight."""

    def __init__(self, inner: FakeKube, hold: int) -> None:
        self.inner = inner
        self.hold = hold
        self.in_flight = self.most = 0
        self.full = anyio.Event()

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)

    async def get(self, resource: Resource, namespace: Any, name: str) -> Any:
        if resource.plural != "pods":
            return await self.inner.get(resource, namespace, name)
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        if self.in_flight >= self.hold:
            self.full.set()
        with anyio.move_on_after(1.0):
            await self.full.wait()
        try:
            return await self.inner.get(resource, namespace, name)
        finally:
            self.in_flight -= 1


async def test_expired_expectations_are_read_back_at_once_as_many_as_patches_may_be() -> None:
    """Issue 43's big wave: thousands of expectations expired together were read back one
    after the other, for minutes. They are read at once, at most ``client.patchConcurrency``
    in flight, and each is settled as before."""
    fake = FakeKube()
    client = Overlapping(fake, hold=3)
    clock = ManualClock(1000.0)
    _, key, pods = setup(fake, pods=7, admitted=7)
    cfg = config(client={"patchConcurrency": 3})
    async with standby(fake, cfg=cfg, clock=clock, client=client) as (ctl, _):
        await cached(ctl, key, fake, 7)
        fake.drop_events = {"pods"}
        for p in pods:
            released_by_someone(fake, p)
        ctl.state.ledger.expectations.expect(key, [uid(p) for p in pods], JOB)
        clock.now += TIMEOUT + 1
        settled = await ctl.reconciler.settler.settle_expired(
            key, rt_of(ctl), ctl.state.ledger.expectations.expired(key)
        )
        assert settled and client.most == 3  # at once, never past the patches' bound
        assert ctl.state.ledger.expectations.pending(key) == {uid(p) for p in pods}  # re-armed
