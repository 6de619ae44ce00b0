"""The user-facing wait: from the event that made a pod releasable to its release
(``ungater_release_wait_seconds``), and gated pods by why they wait (``ungater_gated_pods``).
The controller's measurement is tested in tests/unit/controller/test_release_wait_metric.py."""

from __future__ import annotations

from tests.clock import ManualClock
from ungater._decide.releasable import ReleasableClock


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
