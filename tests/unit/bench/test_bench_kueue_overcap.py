"""Releases past the cap (bench/kueue_overcap.py) on hand-made event streams."""

from __future__ import annotations

from bench.kueue_overcap import releases_past_cap
from bench.timeline import PodEvent, SliceEvent

K, U = "k/gate", "u/gate"
GATES = {"kueue": K, "ungater": U}
BOTH = frozenset({K, U})


def pod(rv: int, uid: str, gates: frozenset[str], live: bool = True, owner: str = "o") -> PodEvent:
    return PodEvent(rv, uid, owner, "main", BOTH, gates, live)


def admitted(rv: int, name: str, count: int, owner: str = "o") -> SliceEvent:
    return SliceEvent(rv, name, owner, True, (("main", count),), False)


def counts(events: list[PodEvent | SliceEvent]) -> dict[str, int]:
    return {label: oc.count for label, oc in releases_past_cap(events, GATES).items()}


def test_releases_within_the_admitted_count_are_not_past_the_cap() -> None:
    events = [admitted(1, "s1", 2), pod(2, "a", BOTH), pod(3, "b", BOTH)]
    events += [pod(4, "a", frozenset({U})), pod(5, "b", frozenset({U}))]  # Kueue's gate off
    events += [pod(6, "a", frozenset()), pod(7, "b", frozenset())]  # ungater's off
    assert counts(events) == {"kueue": 0, "ungater": 0}


def test_a_release_beyond_the_count_is_counted_for_its_gate_alone() -> None:
    events = [admitted(1, "s1", 1), pod(2, "a", BOTH), pod(3, "b", BOTH)]
    events += [pod(4, "a", frozenset({U})), pod(5, "b", frozenset({U}))]  # 2 for a cap of 1
    events += [pod(6, "a", frozenset())]
    result = releases_past_cap(events, GATES)
    assert result["kueue"].count == 1 and result["kueue"].worst == 1
    assert result["ungater"].count == 0


def test_a_release_before_any_admission_is_past_a_cap_of_zero() -> None:
    events = [pod(1, "a", BOTH), pod(2, "a", frozenset({K}))]
    assert counts(events) == {"kueue": 0, "ungater": 1}


def test_resource_version_order_decides_not_arrival_order() -> None:
    # the release (rv 5) came after a slot freed (rv 4), though the pod watch delivered it first
    events: list[PodEvent | SliceEvent] = [
        admitted(1, "s1", 1),
        pod(2, "a", frozenset({U})),  # released under the cap
        pod(3, "b", BOTH),
        pod(5, "b", frozenset({U})),
        pod(4, "a", frozenset({U}), live=False),  # a finished first
    ]
    assert counts(events) == {"kueue": 0, "ungater": 0}


def test_the_newest_admitted_slice_sets_the_cap() -> None:
    # a shrink: the replacement for 1 is admitted after a slice of 3; the third release is over
    events = [admitted(1, "s1", 3), admitted(2, "s2", 1)]
    events += [pod(3 + i, f"p{i}", BOTH) for i in range(2)]
    events += [pod(10, "p0", frozenset({U})), pod(11, "p1", frozenset({U}))]
    assert counts(events) == {"kueue": 1, "ungater": 0}


def test_a_pod_seen_released_again_is_one_release() -> None:
    events = [admitted(1, "s1", 0), pod(2, "a", BOTH), pod(3, "a", frozenset({U}))]
    events += [pod(4, "a", frozenset({U})), pod(5, "a", frozenset({U}))]  # later updates
    assert counts(events) == {"kueue": 1, "ungater": 0}


def test_owners_do_not_share_a_cap() -> None:
    events = [admitted(1, "s1", 1, owner="x"), admitted(2, "s2", 1, owner="y")]
    events += [pod(3, "a", BOTH, owner="x"), pod(4, "b", BOTH, owner="y")]
    events += [pod(5, "a", frozenset({U}), owner="x"), pod(6, "b", frozenset({U}), owner="y")]
    assert counts(events) == {"kueue": 0, "ungater": 0}
