"""The release fence (docs/safety.md, "Our own writes"): a release whose answer never came
may land at any time, so it stays uncertain and counts in flight until the next reconcile of
its owner settles it (``Settler.fence``): the pod read at another version can no longer be
landed on, a pod still at the tested version is changed first (``fence_patch``), a pod gone
settles it and is remembered as gone.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests.clock import ManualClock
from tests.fakekube import FakeKube, PatchFault
from tests.objects import JOBS, WORKLOADS
from tests.polling import eventually, holds_for
from tests.unit.capcheck import (
    config,
    live_released,
    peak_live_released,
)
from tests.unit.controller.viewkit import (
    cached,
    gated,
    gone,
    name,
    released_by_someone,
    rt_of,
    script,
    setup,
    standby,
    uid,
)
from tests.unit.harness import running
from tests.unit.podfactory import (
    NAMESPACE,
    job,
    job_pod,
    workload,
)
from ungater._controller.reconciler import Retry
from ungater._decide.indexes import OwnerKey
from ungater._decide.patches import FENCE_ANNOTATION
from ungater._kube.client import PODS, ApiError

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def rv_of(fake: FakeKube, p: dict[str, Any]) -> str:
    now = fake.read(PODS, NAMESPACE, name(p))
    assert now is not None
    return str(now["metadata"]["resourceVersion"])


class LatePatches:
    """A client whose patches of the named pods time out on the client's side and land later
    (``delay`` s after they were sent), as an API server can commit a write after it answered
    504 or after the client stopped waiting."""

    def __init__(self, inner: FakeKube, names: set[str], delay: float) -> None:
        self.inner = inner
        self.names = names
        self.delay = delay
        self.landed: list[str] = []
        self.refused_late: list[str] = []
        self.landing = ""  # the pod whose late patch is being applied now
        self._tg: Any = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def json_patch(self, resource: Any, namespace: Any, name: str, ops: Any) -> Any:
        if name not in self.names:
            return await self.inner.json_patch(resource, namespace, name, ops)
        self.names.discard(name)
        assert self._tg is not None

        async def land() -> None:
            await anyio.sleep(self.delay)
            self.landing = name
            try:
                await self.inner.json_patch(resource, namespace, name, ops)
                self.landed.append(name)
            except ApiError:
                self.refused_late.append(name)

        self._tg.start_soon(land)
        raise TimeoutError("the client gave up waiting (fake)")


@pytest.mark.anyio
async def test_a_patch_that_lands_after_a_timeout_is_counted_until_it_can_no_longer_land() -> None:
    """Issue 26, path 2: a patch whose client gave up (a timeout) landed later, after the pod
    had been counted as gated again and another pod released in its place. Checked over the
    fake's whole history, in resourceVersion order.
    """
    fake = FakeKube()
    j = fake.put(JOBS, job("train", parallelism=2, completions=2))
    idx1 = fake.put(PODS, job_pod(j, index=1, created=2))
    client = LatePatches(fake, {idx1["metadata"]["name"]}, delay=1.0)
    async with anyio.create_task_group() as landings:
        client._tg = landings
        async with running(client, config()) as ctl:
            fake.put(WORKLOADS, workload(j, {"main": 2}, admitted={"main": 1}))
            await eventually(lambda: ctl.stats.patch_errors == 1, what="the timed-out patch")
            # a pod that comes first in order appears; the expectation of the timed-out patch
            # expires (expectationsTimeoutSeconds) while the pod still looks gated
            fake.put(PODS, job_pod(j, index=0, created=1))
            await anyio.sleep(1.2)  # the first patch's late landing has come and gone
            await eventually(lambda: live_released(fake) == 1, what="one pod released")
            await holds_for(lambda: live_released(fake) == 1, 0.3, what="cap 1")
    assert peak_live_released(fake) == 1
    # the late write either landed before anything else was released, or was made unable to
    assert len(client.landed) + len(client.refused_late) == 1


@pytest.mark.anyio
async def test_an_unanswered_release_whose_fence_is_refused_stays_in_flight() -> None:
    """As above, but a policy refuses the fence (our annotation) for good: the timed-out
    release can still land at any time, so it keeps its slot, and the pod that comes first in
    order waits instead of being released beside it.

    "As above" is issue 26's path 2
    (test_a_patch_that_lands_after_a_timeout_is_counted_until_it_can_no_longer_land).
    """
    fake = FakeKube()
    j = fake.put(JOBS, job("train", parallelism=2, completions=2))
    idx1 = fake.put(PODS, job_pod(j, index=1, created=2))
    client = LatePatches(fake, {idx1["metadata"]["name"]}, delay=1.5)
    fences: list[str] = []

    def policy(namespace: str, name: str) -> None:
        if name == idx1["metadata"]["name"] and client.landing != name:
            fences.append(name)
            raise ApiError(403, "pods is forbidden: annotations are managed by the platform")

    async with anyio.create_task_group() as landings:
        client._tg = landings
        async with running(client, config()) as ctl:
            fake.put(WORKLOADS, workload(j, {"main": 2}, admitted={"main": 1}))
            await eventually(lambda: ctl.stats.patch_errors == 1, what="the timed-out patch")
            fake.before_patch = policy
            fake.put(PODS, job_pod(j, index=0, created=1))
            await eventually(lambda: len(fences) >= 1, what="a fence refused")
            key = OwnerKey(NAMESPACE, j["metadata"]["uid"])
            await eventually(
                lambda: (
                    key in ctl.state.decisions
                    and ctl.state.decisions[key].pod_sets[0].in_flight == 1
                ),
                what="a decision counting the unanswered release",
            )
            assert live_released(fake) == 0
            await eventually(lambda: client.landed, timeout=5, what="the late landing")
            fake.before_patch = None
            await holds_for(lambda: live_released(fake) == 1, 0.5, what="cap 1")
    assert peak_live_released(fake) == 1


async def test_a_reconcile_settles_an_unknown_outcome_and_counts_a_released_pod_in_flight() -> None:
    """Our patch failed (unknown outcome) while another writer released the pod; the watch
    never showed it. The next reconcile settles it from the server, with no clock: the pod is
    at another version (our patch can no longer land) and released and live, so it is in
    flight (expected in the deciding view, counted so by the decision) and nothing more is
    patched (not even a fence)."""
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
        assert decision is not None and not decision.releases  # pod 1 stays gated: cap 1
        assert [r.in_flight for r in decision.pod_sets] == [1]
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
