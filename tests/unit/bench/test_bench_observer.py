"""The harness's pod observer: waiting for releases reads only what changed since it looked."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from bench.objects import GATE
from bench.observer import PodObserver

pytestmark = pytest.mark.anyio


def pod(uid: str, gated: bool) -> dict[str, Any]:
    gates = [{"name": GATE}] if gated else []
    return {"metadata": {"uid": uid, "labels": {}}, "spec": {"schedulingGates": gates}}


async def test_released_waits_for_every_pod_and_gives_the_last_moment() -> None:
    obs = PodObserver(client=None, namespace="ns")  # type: ignore[arg-type]
    for i, uid in enumerate(("a", "b", "c")):
        obs._apply("ADDED", pod(uid, True), float(i))
    obs._apply("MODIFIED", pod("a", False), 10.0)  # released before the wait begins

    async def release_later() -> None:
        await anyio.sleep(0.01)
        obs._apply("MODIFIED", pod("c", False), 12.0)
        obs._notify()
        await anyio.sleep(0.01)
        obs._apply("MODIFIED", pod("b", False), 11.0)
        obs._notify()

    async with anyio.create_task_group() as tg:
        tg.start_soon(release_later)
        last = await obs.released(["a", "b", "c"], timeout=5)
    assert last == 12.0  # c's moment: the latest, though b was seen last


async def test_released_times_out_while_a_pod_is_still_gated() -> None:
    obs = PodObserver(client=None, namespace="ns")  # type: ignore[arg-type]
    obs._apply("ADDED", pod("a", True), 0.0)
    obs._apply("ADDED", pod("b", True), 0.0)
    obs._apply("MODIFIED", pod("a", False), 1.0)
    obs._notify()
    with pytest.raises(TimeoutError, match="2 pods released"):
        await obs.released(["a", "b"], timeout=0.05)
