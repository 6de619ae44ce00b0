"""Reads cut short (docs/safety.md, "Reads cut short"): an admission that changes while an
owner's view is being read drops those reads, and the reconcile the event queued decides on
the new admission at once; writes are never dropped, and other Workload changes drop nothing.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests.fakekube import FakeKube
from tests.objects import WORKLOADS
from tests.unit.controller.viewkit import cached, gated, setup, standby, synced_owner
from tests.unit.podfactory import workload
from ungater._kube.client import Resource

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Held:
    """The fake behind a client that holds each request of one verb (``get`` of Workloads,
    or ``json_patch``) until ``go`` is set, and says when one is held."""

    def __init__(self, inner: FakeKube, verb: str) -> None:
        self.inner = inner
        self.verb = verb
        self.held = anyio.Event()
        self.go = anyio.Event()
        self.patches = 0

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)

    async def _hold(self) -> None:
        self.held.set()
        await self.go.wait()

    async def get(self, resource: Resource, namespace: str | None, name: str) -> Any:
        if self.verb == "get" and resource.plural == "workloads":
            await self._hold()
        return await self.inner.get(resource, namespace, name)

    async def json_patch(
        self, resource: Resource, namespace: str | None, name: str, ops: Any
    ) -> Any:
        if self.verb == "patch":
            await self._hold()
        self.patches += 1
        return await self.inner.json_patch(resource, namespace, name, ops)


def _admit(fake: FakeKube, j: dict[str, Any], n: int, **labels: str) -> None:
    wl = workload(j, {"main": 4}, admitted={"main": n})
    wl["metadata"]["labels"].update(labels)
    fake.put(WORKLOADS, wl)


async def test_an_admission_that_grows_while_the_view_is_read_drops_the_reads_and_writes_nothing() -> (
    None
):
    """A Job of 4, 2 admitted, 1 running: a reconcile reads its view to release one. Kueue
    admits all 4 while the slice's read hangs: the reconcile ends at once, patching nothing,
    and asks to be run again at once; that run releases the 3 the new admission allows."""
    fake = FakeKube()
    client = Held(fake, "get")
    j, key, pods = setup(fake, pods=4, admitted=2, released=1)
    async with standby(fake, client=client) as (ctl, _):
        await cached(ctl, key, fake, 4)
        await synced_owner(ctl, key)
        outcomes: list[Any] = []
        ended = anyio.Event()

        async def run() -> None:
            outcomes.append(await ctl.reconciler.reconcile(key))
            ended.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            with anyio.fail_after(3):
                await client.held.wait()
            _admit(fake, j, 4)  # the watch delivers it while the read hangs
            with anyio.fail_after(3):  # without the cut, the reconcile waits for the read
                await ended.wait()
        (outcome,) = outcomes
        assert outcome.decision is None and outcome.after == 0.0
        assert client.patches == 0
        assert ctl.state.stats.reads_preempted == 1
        assert all(gated(fake, p) for p in pods[1:])
        client.go.set()
        decision = (await ctl.reconciler.reconcile(key)).decision
        assert decision is not None and len(decision.released_names) == 3
        assert not any(gated(fake, p) for p in pods)


async def test_an_admission_while_the_patches_are_out_cuts_nothing() -> None:
    """The same admission while the release's patch hangs: the patch is not dropped, it lands;
    the admission is decided on beside it (waves that overlap) and its two pods go too."""
    fake = FakeKube()
    client = Held(fake, "patch")
    j, key, pods = setup(fake, pods=4, admitted=2, released=1)
    async with standby(fake, client=client) as (ctl, _):
        await cached(ctl, key, fake, 4)
        await synced_owner(ctl, key)
        outcomes: list[Any] = []

        async def run() -> None:
            outcomes.append(await ctl.reconciler.reconcile(key))

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            with anyio.fail_after(3):
                await client.held.wait()
            _admit(fake, j, 4)
            await anyio.sleep(0.2)  # the watch has delivered it; the patch still hangs
            assert not outcomes and ctl.state.stats.reads_preempted == 0
            client.go.set()
        (outcome,) = outcomes
        assert outcome.decision is not None and len(outcome.decision.released_names) == 1
        assert client.patches == 3 and not any(gated(fake, p) for p in pods)
        assert ctl.state.stats.reads_preempted == 0


async def test_a_workload_change_that_is_not_an_admission_cuts_no_reads() -> None:
    """A label on the admitted slice changes while the view is read: the reads go on and the
    one release is made on them."""
    fake = FakeKube()
    client = Held(fake, "get")
    j, key, pods = setup(fake, pods=4, admitted=2, released=1)
    async with standby(fake, client=client) as (ctl, _):
        await cached(ctl, key, fake, 4)
        await synced_owner(ctl, key)
        outcomes: list[Any] = []

        async def run() -> None:
            outcomes.append(await ctl.reconciler.reconcile(key))

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            with anyio.fail_after(3):
                await client.held.wait()
            _admit(fake, j, 2, touched="yes")
            await anyio.sleep(0.2)
            assert ctl.state.stats.reads_preempted == 0
            client.go.set()
        (outcome,) = outcomes
        assert outcome.decision is not None and len(outcome.decision.released_names) == 1
        assert ctl.state.stats.reads_preempted == 0 and not gated(fake, pods[1])
