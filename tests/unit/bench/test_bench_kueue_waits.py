"""The side-by-side benchmark's arithmetic (bench/kueue_waits.py) on hand-made timelines."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from bench.kueue_waits import Waits
from bench.timeline import PodTrack

pytestmark = pytest.mark.anyio
GATES = {"kueue": "k/gate", "ungater": "u/gate"}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Done:
    """A timeline whose events have all arrived: nothing to wait for."""

    async def until(self, done: Callable[[], bool], timeout: float, what: str) -> bool:
        return done()


def pod(added: float, **removed: float) -> PodTrack:
    gates = {GATES[k]: t for k, t in removed.items()}
    return PodTrack("uid", "p", "owner", 0, added, set(GATES.values()), gates)


async def record(w: Waits, pods: list[PodTrack], since: float, **kw: Any) -> dict[str, Any]:
    return await w.record(Done(), lambda: pods, since, **kw)  # type: ignore[arg-type]


async def test_a_sample_is_the_worst_pod_from_when_it_became_releasable() -> None:
    t0 = time.monotonic()
    w = Waits(GATES)
    # pod 2 was created 0.5 s after the trigger: its wait starts then, not at the trigger
    pods = [
        pod(t0 - 1, kueue=t0 + 0.3, ungater=t0 + 0.1),
        pod(t0 + 0.5, kueue=t0 + 0.6, ungater=t0 + 0.7),
    ]
    got = await record(w, pods, t0)
    assert got["kueue"] == pytest.approx(0.3)
    assert got["ungater"] == pytest.approx(0.2)
    assert w.samples == {"kueue": [pytest.approx(0.3)], "ungater": [pytest.approx(0.2)]}
    s = w.summary()
    assert s["ratio_median"] == pytest.approx(1.5)
    assert s["stalls"] == {"kueue": 0, "ungater": 0}


async def test_a_pod_never_released_or_too_late_is_a_stall_not_a_sample() -> None:
    t0 = time.monotonic() - 40  # everything below happened long ago: no waiting
    w = Waits(GATES, stall_s=30)
    pods = [pod(t0, kueue=t0 + 31, ungater=t0 + 0.1), pod(t0, ungater=t0 + 0.2)]
    await record(w, pods, t0)
    assert w.stalls == {"kueue": 2, "ungater": 0}
    assert w.samples["kueue"] == []
    assert w.samples["ungater"] == [pytest.approx(0.2)]
    assert "ratio_median" not in w.summary()


async def test_one_freed_slot_counts_the_first_candidate_released() -> None:
    t0 = time.monotonic() - 40
    w = Waits(GATES)
    pods = [pod(t0 - 5, ungater=t0 + 0.04), pod(t0 - 5)]  # Kueue releases neither
    got = await record(w, pods, t0, first_only=True)
    assert got == {"kueue": None, "ungater": pytest.approx(0.04)}
    assert w.stalls == {"kueue": 1, "ungater": 0}


class Bound:
    """A timeline that records how long ``record`` was willing to wait."""

    def __init__(self) -> None:
        self.timeouts: list[float] = []

    async def until(self, done: Callable[[], bool], timeout: float, what: str) -> bool:
        self.timeouts.append(timeout)
        return done()


async def test_a_pod_created_long_after_the_trigger_gets_its_full_stall_bound() -> None:
    now = time.monotonic()
    w = Waits(GATES, stall_s=30)
    # admitted 40 s ago; the pod came (at the Job controller's pace) just now
    pods = [pod(now, ungater=now + 0.1)]
    tl = Bound()
    await w.record(tl, lambda: pods, now - 40)  # type: ignore[arg-type]
    assert tl.timeouts[0] > 30  # from the pod's creation, not from the admission 40 s ago
    old = Bound()
    await w.record(old, lambda: [pod(now - 40)], now - 40)  # type: ignore[arg-type]
    assert old.timeouts[0] <= 1.0  # a pod releasable for 40 s already: no more waiting


async def test_a_trigger_no_pod_carried_the_gate_for_is_a_missing_sample() -> None:
    t0 = time.monotonic() - 40
    w = Waits(GATES)
    # the pods never carried Kueue's gate: no wait to take and nothing stalled, still counted
    pods = [PodTrack("uid", "p", "owner", 0, t0, {GATES["ungater"]}, {GATES["ungater"]: t0 + 0.1})]
    got = await record(w, pods, t0)
    assert got == {"kueue": None, "ungater": pytest.approx(0.1)}
    await record(w, pods, t0, first_only=True)  # nor in a freed-slot case: not a stall there
    await record(w, [], t0)  # no releasable pod at all: missing for both
    assert w.missing == {"kueue": 3, "ungater": 1}
    assert w.stalls == {"kueue": 0, "ungater": 0}
    s = w.summary()
    assert s["missing"] == {"kueue": 3, "ungater": 1}
    assert s["kueue"]["n"] == 0 and s["ungater"]["n"] == 2  # the case keeps its summary


async def test_a_sample_with_a_stall_or_a_wait_is_not_also_missing() -> None:
    t0 = time.monotonic() - 40
    w = Waits(GATES, stall_s=30)
    await record(w, [pod(t0, ungater=t0 + 0.2)], t0)  # Kueue's gate stayed: a stall
    await record(w, [pod(t0 - 5), pod(t0 - 5)], t0, first_only=True)  # none went: a stall each
    assert w.stalls == {"kueue": 2, "ungater": 1}
    assert w.missing == {"kueue": 0, "ungater": 0}


async def test_one_gate_alone_is_summarized_without_a_ratio() -> None:
    t0 = time.monotonic() - 40
    w = Waits({"ungater": GATES["ungater"]})
    await record(w, [pod(t0, ungater=t0 + 0.1)], t0)
    await record(w, [], t0)
    s = w.summary()
    assert s["ungater"]["n"] == 1
    assert s["stalls"] == {"ungater": 0}
    assert s["missing"] == {"ungater": 1}
    assert "kueue" not in s and "ratio_median" not in s
