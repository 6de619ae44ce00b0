"""The user-facing wait: from the event that made a pod releasable to its release
(``ungater_release_wait_seconds``), and gated pods by why they wait (``ungater_gated_pods``)."""

from __future__ import annotations

import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.clock import ManualClock
from tests.fakekube import FakeKube
from tests.objects import GATE, PODS, WORKLOADS, job_pod, with_phase, workload
from tests.polling import eventually
from tests.unit.controller.fake_jobs import NS, make_config, released_indexes, setup_job
from tests.unit.harness import running
from ungater._decide.releasable import ReleasableClock
from ungater._observe.metrics import Metrics


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_the_wait_starts_at_the_later_of_arrival_and_room() -> None:
    clock = ManualClock(100.0)
    c = ReleasableClock(clock)
    assert c.waited("owner", "p") is None  # never seen: no figure rather than a wrong one
    c.pod_seen("p")
    c.room_made("owner")  # both at 100
    clock.now = 103.0
    assert c.waited("owner", "p") == 3.0
    c.room_made("owner")  # a slot freed at 103 ...
    clock.now = 103.5
    assert c.waited("owner", "p") == 0.5  # ... so the pod waited from there
    c.pod_seen("p")  # seen again: the first sighting counts
    c.pod_seen("late")  # arrived after the room was made
    clock.now = 104.0
    assert c.waited("owner", "late") == 0.5
    assert c.waited("other-owner", "p") == 4.0  # no room event known: from its arrival
    c.pod_gone("p")
    c.owner_gone("owner")
    assert c.waited("owner", "p") is None and len(c) == 1


def samples(metrics: Metrics, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


@pytest.mark.anyio
async def test_a_freed_slot_is_timed_from_the_freeing_not_from_the_admission() -> None:
    fake = FakeKube()
    owner = setup_job(fake, 3)
    fake.put(WORKLOADS, workload(owner, "train-a", count=3, admitted=2))
    async with running(fake, make_config(), observed=True) as ctl:
        metrics = ctl.metrics
        assert metrics is not None
        await eventually(lambda: released_indexes(fake) == [0, 1])
        kind = (("kind", "Job.batch"),)
        assert samples(metrics, "ungater_release_wait_seconds_count")[kind] == 2
        assert ctl.gated_pods() == {("Job.batch", GATE, "capacity"): 1}
        gauge = samples(metrics, "ungater_gated_pods")
        assert gauge == {(("gate", GATE), ("kind", "Job.batch"), ("reason", "capacity")): 1.0}
        await anyio.sleep(0.8)  # pod 2 sits gated, for want of room, all this time
        first = fake.read(PODS, NS, job_pod(owner, 0)["metadata"]["name"])
        assert first is not None
        fake.put(PODS, with_phase(first, "Succeeded"))
        await eventually(lambda: released_indexes(fake) == [0, 1, 2])
        count = samples(metrics, "ungater_release_wait_seconds_count")[kind]
        total = samples(metrics, "ungater_release_wait_seconds_sum")[kind]
        assert count == 3
        assert total < 0.5, f"the freed slot's pod counted its time without room: {total:.2f}s"
        await eventually(lambda: ctl.gated_pods() == {})


def test_an_owner_is_stalled_only_while_its_count_stays_above_zero_past_the_threshold() -> None:
    from ungater._decide.releasable import Stalls

    now = [0.0]
    stalls = Stalls(clock=lambda: now[0])
    stalls.observe("a", "Job.batch", 2)
    now[0] = 10.0
    stalls.observe("a", "Job.batch", 1)  # still held: the clock keeps its start
    stalls.observe("b", "Job.batch", 3)
    assert stalls.stalled(9.0) == {"Job.batch": 1}
    assert stalls.stalled(10.0) == {}
    stalls.observe("a", "Job.batch", 0)  # released: no longer stalled
    now[0] = 30.0
    assert stalls.stalled(9.0) == {"Job.batch": 3}
    stalls.forget("b")
    assert stalls.stalled(0.0) == {}
