"""Waves that overlap (docs/safety.md, "Waves that overlap"): while a wave's answers are out,
a change of the owner's objects is decided on at once, on a new view, and what that decision
chooses goes out beside the first wave; the first wave's pods count in flight in it.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests.fakekube import FakeKube
from tests.objects import JOBS, WORKLOADS
from tests.polling import eventually
from tests.unit.controller.viewkit import cached, gated, name, standby, synced_owner
from tests.unit.podfactory import NAMESPACE, job, job_pod, workload
from ungater._decide.indexes import OwnerKey
from ungater._kube.client import PODS, Resource

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class HeldPatches:
    """The fake behind a client that holds the patches of the pods named in ``held`` until
    ``go`` is set, and says when the first of them is held."""

    def __init__(self, inner: FakeKube, held: set[str]) -> None:
        self.inner = inner
        self.held = held
        self.holding = anyio.Event()
        self.go = anyio.Event()
        self.attempts: dict[str, int] = {}

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)

    async def json_patch(
        self, resource: Resource, namespace: str | None, name: str, ops: Any
    ) -> Any:
        self.attempts[name] = self.attempts.get(name, 0) + 1
        if name in self.held:
            self.holding.set()
            await self.go.wait()
        return await self.inner.json_patch(resource, namespace, name, ops)


async def _grows_while_held(admitted: int) -> tuple[FakeKube, list[dict[str, Any]], list[Any]]:
    """A Job of 4 whose slice admits ``admitted``; pods 0 and 1 exist and are released by a
    reconcile whose two patches hang; meanwhile pods 2 and 3 are created. Returns the fake,
    the 4 pods, and the reconcile's outcome (once the hung patches were let through)."""
    fake = FakeKube()
    j = fake.put(JOBS, job("train", parallelism=4))
    pods = [job_pod(j, index=i, created=1 + i) for i in range(4)]
    for p in pods[:2]:
        fake.put(PODS, p)
    fake.put(WORKLOADS, workload(j, {"main": 4}, admitted={"main": admitted}))
    key = OwnerKey(NAMESPACE, j["metadata"]["uid"])
    client = HeldPatches(fake, {name(p) for p in pods[:2]})
    outcomes: list[Any] = []
    async with standby(fake, client=client) as (ctl, _):
        await cached(ctl, key, fake, 2)
        await synced_owner(ctl, key)

        async def run() -> None:
            outcomes.append(await ctl.reconciler.reconcile(key))

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            with anyio.fail_after(3):
                await client.holding.wait()
            for p in pods[2:]:
                fake.put(PODS, p)
            want = min(2, admitted - 2)
            await eventually(  # the new pods' wave, beside the hung one
                lambda: sum(not gated(fake, p) for p in pods[2:]) >= want,
                timeout=3,
                what="the new pods released while the first wave hangs",
            )
            assert not outcomes, "the reconcile ended before its first wave was answered"
            assert all(gated(fake, p) for p in pods[:2])
            await anyio.sleep(0.1)  # nothing more goes while the first wave hangs
            assert sum(not gated(fake, p) for p in pods[2:]) == want
            # the hung wave counted in flight: its pods were not chosen again
            assert [client.attempts[name(p)] for p in pods[:2]] == [1, 1]
            client.go.set()
    return fake, pods, outcomes


async def test_pods_created_while_a_waves_answers_are_out_go_without_waiting_for_them() -> None:
    fake, pods, outcomes = await _grows_while_held(admitted=4)
    assert not any(gated(fake, p) for p in pods)
    (outcome,) = outcomes
    assert outcome.retry is None


async def test_a_second_wave_counts_the_first_waves_unanswered_pods_in_flight() -> None:
    """The slice admits 3: with pods 0 and 1 out (unanswered), the new decision releases
    one pod, not two."""
    fake, pods, _ = await _grows_while_held(admitted=3)
    assert sum(not gated(fake, p) for p in pods) == 3


class ReadsAnsweredWithTheLastPatch(HeldPatches):
    """Also holds each Workload read made while the patches hang, until a held patch has
    been answered: the watch's view completes as the first wave's last answer comes in."""

    def __init__(self, inner: FakeKube, held: set[str]) -> None:
        super().__init__(inner, held)
        self.answered = anyio.Event()

    async def json_patch(
        self, resource: Resource, namespace: str | None, name: str, ops: Any
    ) -> Any:
        out = await super().json_patch(resource, namespace, name, ops)
        if name in self.held:
            self.answered.set()
        return out

    async def get(self, resource: Resource, namespace: str | None, name: str) -> Any:
        if resource.plural == "workloads" and self.holding.is_set():
            await self.answered.wait()
        return await self.inner.get(resource, namespace, name)


async def test_a_decision_made_as_the_last_answer_comes_in_is_still_sent() -> None:
    """The first wave (pod 0) is answered while the watch reads its view for pod 1: the
    watch is not cut off by the last answer, and pod 1 goes in the same reconcile."""
    fake = FakeKube()
    j = fake.put(JOBS, job("train", parallelism=2))
    pods = [job_pod(j, index=i, created=1 + i) for i in range(2)]
    fake.put(PODS, pods[0])
    fake.put(WORKLOADS, workload(j, {"main": 2}, admitted={"main": 2}))
    key = OwnerKey(NAMESPACE, j["metadata"]["uid"])
    client = ReadsAnsweredWithTheLastPatch(fake, {name(pods[0])})
    async with standby(fake, client=client) as (ctl, _):
        await cached(ctl, key, fake, 1)
        await synced_owner(ctl, key)
        async with anyio.create_task_group() as tg:
            tg.start_soon(ctl.reconciler.reconcile, key)
            with anyio.fail_after(3):
                await client.holding.wait()
            fake.put(PODS, pods[1])
            await cached(ctl, key, fake, 2)
            client.go.set()
        assert client.attempts.get(name(pods[1])) == 1
        assert not any(gated(fake, p) for p in pods)
