"""Table-driven tests of ``ungater._decide.decision.decide``: slice choice, caps, counting, eligibility,
order, release groups, the explanation and the gate index of every release."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.unit.builders import GATE, TOPOLOGY_GATE, facts, wl_view
from ungater._decide.decision import (
    Decision,
    Ownership,
    PodFacts,
    active_slice,
    decide,
    gated_by_reason,
    order_slices,
    pod_set_caps,
)

REPLACED = ("Finished", "True", "WorkloadSliceReplaced")


@dataclass
class Case:
    id: str
    slices: list[dict[str, Any]]  # kwargs of builders.wl_view (name included)
    pods: list[PodFacts] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    active: str | None = "wl-1"
    caps: dict[str, int] | None = None
    in_flight: tuple[str, ...] = ()


def _views(specs: list[dict[str, Any]]):
    return [wl_view(**dict(s)) for s in specs]


def _gated(n: int, prefix: str = "p", **kw: Any) -> list[PodFacts]:
    return [facts(f"{prefix}{i}", created=10 + i, **kw) for i in range(n)]


def _run(case: Case) -> Decision:
    return decide(_views(case.slices), case.pods, GATE, case.in_flight)


def _check(case: Case) -> Decision:
    d = _run(case)
    assert d.active_slice == case.active
    assert d.released_names == case.released
    if case.caps is not None:
        assert {r.name: r.cap for r in d.pod_sets} == case.caps
    return d


# -- which slice is active --------------------------------------------------------------------

SLICE_CASES = [
    Case("single-admitted", [dict(name="wl-1", pod_sets={"main": 2})], _gated(3), ["p0", "p1"]),
    Case(
        "newest-admitted-wins-old-finished",
        [
            dict(name="wl-1", created=0, pod_sets={"main": 2}, conditions=["Admitted", REPLACED]),
            dict(name="wl-2", created=5, pod_sets={"main": 4}, replacement_for="wl-1"),
        ],
        _gated(5),
        ["p0", "p1", "p2", "p3"],
        active="wl-2",
        caps={"main": 4},
    ),
    Case(
        "both-admitted-new-one-caps",  # old slice not yet marked Finished
        [
            dict(name="wl-1", created=0, pod_sets={"main": 2}),
            dict(name="wl-2", created=5, pod_sets={"main": 3}, replacement_for="wl-1"),
        ],
        _gated(5),
        ["p0", "p1", "p2"],
        active="wl-2",
        caps={"main": 3},
    ),
    Case(
        "scale-up-pending-old-caps",  # the new slice only asked: the old one still rules
        [
            dict(name="wl-1", created=0, pod_sets={"main": 2}),
            dict(
                name="wl-2",
                created=5,
                pod_sets={"main": 6},
                admitted=None,
                conditions=[],
                replacement_for="wl-1",
            ),
        ],
        _gated(5),
        ["p0", "p1"],
        active="wl-1",
        caps={"main": 2},
    ),
    Case(
        "quota-reserved-not-admitted-ignored",
        [
            dict(name="wl-1", created=0, pod_sets={"main": 1}),
            dict(
                name="wl-2",
                created=5,
                pod_sets={"main": 4},
                conditions=["QuotaReserved", ("Admitted", "False", "AdmissionChecksPending")],
                replacement_for="wl-1",
            ),
        ],
        _gated(3),
        ["p0"],
        active="wl-1",
    ),
    Case(
        "finished-only-nothing",
        [dict(name="wl-1", pod_sets={"main": 4}, conditions=["Admitted", "Finished"])],
        _gated(2),
        [],
        active=None,
    ),
    Case(
        "evicted-newest-ignored-old-finished",
        [
            dict(name="wl-1", created=0, pod_sets={"main": 2}, conditions=["Admitted", REPLACED]),
            dict(
                name="wl-2",
                created=5,
                pod_sets={"main": 4},
                conditions=["Admitted", ("Evicted", "True", "Preempted")],
                replacement_for="wl-1",
            ),
        ],
        _gated(5),
        [],
        active=None,
    ),
    Case(
        "evicted-false-does-not-count",
        [dict(name="wl-1", pod_sets={"main": 1}, conditions=["Admitted", ("Evicted", "False")])],
        _gated(2),
        ["p0"],
    ),
    Case(
        "finished-false-does-not-count",
        [dict(name="wl-1", pod_sets={"main": 1}, conditions=["Admitted", ("Finished", "False")])],
        _gated(2),
        ["p0"],
    ),
    Case(
        "admitted-unknown-is-not-admitted",
        [dict(name="wl-1", pod_sets={"main": 1}, conditions=[("Admitted", "Unknown")])],
        _gated(2),
        [],
        active=None,
    ),
    Case(
        "same-second-replacement-link-beats-uid",
        [
            dict(name="wl-1", uid="zzz", created=5, pod_sets={"main": 1}),
            dict(name="wl-2", uid="aaa", created=5, pod_sets={"main": 3}, replacement_for="wl-1"),
        ],
        _gated(4),
        ["p0", "p1", "p2"],
        active="wl-2",
    ),
    Case(
        "same-second-three-deep-chain",
        [
            dict(name="wl-3", uid="a", created=5, pod_sets={"main": 3}, replacement_for="wl-2"),
            dict(name="wl-1", uid="c", created=5, pod_sets={"main": 1}),
            dict(name="wl-2", uid="b", created=5, pod_sets={"main": 2}, replacement_for="wl-1"),
        ],
        _gated(4),
        ["p0", "p1", "p2"],
        active="wl-3",
    ),
    Case(
        "same-second-no-link-uid-breaks-tie",
        [
            dict(name="wl-1", uid="uid-b", created=5, pod_sets={"main": 1}),
            dict(name="wl-2", uid="uid-a", created=5, pod_sets={"main": 2}),
        ],
        _gated(4),
        ["p0"],
        active="wl-1",
    ),
    Case(
        "replacement-whose-origin-is-gone",
        [dict(name="wl-2", created=5, pod_sets={"main": 3}, replacement_for="wl-1")],
        _gated(4),
        ["p0", "p1", "p2"],
        active="wl-2",
    ),
    Case(
        "origin-gone-same-second-chain-still-ordered",
        [
            dict(name="wl-3", uid="a", created=5, pod_sets={"main": 3}, replacement_for="wl-2"),
            dict(name="wl-2", uid="z", created=5, pod_sets={"main": 2}, replacement_for="wl-1"),
        ],
        _gated(4),
        ["p0", "p1", "p2"],
        active="wl-3",
    ),
    Case(
        "older-timestamp-loses-despite-link-depth",
        [
            dict(name="wl-1", created=9, pod_sets={"main": 1}),
            dict(name="wl-2", created=3, pod_sets={"main": 2}, replacement_for="wl-x"),
        ],
        _gated(4),
        ["p0"],
        active="wl-1",
    ),
    Case(
        "replacement-cycle-does-not-hang",
        [
            dict(name="wl-1", uid="a", created=5, pod_sets={"main": 1}, replacement_for="wl-2"),
            dict(name="wl-2", uid="b", created=5, pod_sets={"main": 2}, replacement_for="wl-1"),
        ],
        _gated(4),
        ["p0", "p1"],
        active="wl-2",
    ),
    Case(
        "evicted-newest-falls-back-to-still-admitted-older",  # transient: old not yet Finished
        [
            dict(name="wl-1", created=0, pod_sets={"main": 1}),
            dict(
                name="wl-2",
                created=5,
                pod_sets={"main": 4},
                conditions=["Admitted", ("Evicted", "True", "Preempted")],
                replacement_for="wl-1",
            ),
        ],
        _gated(5),
        ["p0"],
        active="wl-1",
    ),
    Case("no-workload", [], _gated(2), [], active=None),
]


@pytest.mark.parametrize("case", SLICE_CASES, ids=[c.id for c in SLICE_CASES])
def test_active_slice(case: Case) -> None:
    _check(case)


def test_no_active_slice_reports_every_gated_pod() -> None:
    pods = [*_gated(2), facts("free", gates=())]
    d = decide([], pods, GATE)
    assert d.summary == "no workload"
    assert [w.pod for w in d.unmapped] == ["p0", "p1"]
    d = decide(_views([dict(conditions=["QuotaReserved"])]), pods, GATE)
    assert d.active_slice is None
    assert d.summary == "no admitted, unfinished, unevicted slice"
    assert {w.reason for w in d.unmapped} == {d.summary}
    assert d.releases == () and d.pod_sets == ()


def test_order_slices_is_input_order_independent() -> None:
    specs = [
        dict(name="wl-1", uid="9", created=5),
        dict(name="wl-2", uid="1", created=5, replacement_for="wl-1"),
        dict(name="wl-3", uid="5", created=5, replacement_for="wl-2"),
        dict(name="wl-0", uid="0", created=1),
    ]
    views = _views(specs)
    expected = ["wl-0", "wl-1", "wl-2", "wl-3"]
    assert [w.name for w in order_slices(views)] == expected
    assert [w.name for w in order_slices(reversed(views))] == expected
    assert active_slice(views).name == "wl-3"  # type: ignore[union-attr]
    assert active_slice([]) is None


# -- caps ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pod_sets", "admitted", "cap", "spec", "adm", "problem"),
    [
        pytest.param({"main": 4}, {"main": 4}, 4, 4, 4, "", id="equal"),
        pytest.param({"main": 2}, {"main": 4}, 2, 2, 4, "", id="in-place-scale-down-spec-lower"),
        pytest.param({"main": 4}, {"main": 2}, 2, 4, 2, "", id="partial-admission"),
        pytest.param({"main": 3}, {"main": None}, 3, 3, None, "", id="admitted-count-absent"),
        pytest.param({"main": 0}, {"main": 0}, 0, 0, 0, "", id="zero"),
        pytest.param({"main": 3}, {"other": 3}, 0, 3, None, "missing", id="missing-assignment"),
        pytest.param({"main": 3}, {}, 0, 3, None, "missing", id="no-assignments"),
        pytest.param({"main": 3}, None, 0, 3, None, "missing", id="no-admission-at-all"),
        pytest.param({"main": -1}, {"main": 3}, 0, None, 3, "spec count", id="spec-negative"),
        pytest.param({"main": "3"}, {"main": 3}, 0, None, 3, "spec count", id="spec-string"),
        pytest.param({"main": True}, {"main": 3}, 0, None, 3, "spec count", id="spec-bool"),
        pytest.param({"main": 2.0}, {"main": 3}, 0, None, 3, "spec count", id="spec-float"),
        pytest.param({"main": 3}, {"main": -2}, 0, 3, None, "admitted count", id="adm-negative"),
        pytest.param({"main": 3}, {"main": "2"}, 0, 3, None, "admitted count", id="adm-string"),
        pytest.param({"main": 3}, {"main": False}, 0, 3, None, "admitted count", id="adm-bool"),
    ],
)
def test_caps(
    pod_sets: dict[str, Any],
    admitted: dict[str, Any] | None,
    cap: int,
    spec: int | None,
    adm: int | None,
    problem: str,
) -> None:
    view = wl_view(pod_sets=pod_sets, admitted=admitted)
    c = pod_set_caps(view)["main"]
    assert (c.cap, c.spec, c.admitted) == (cap, spec, adm)
    assert problem in c.problem and bool(problem) == bool(c.problem)
    d = decide([view], _gated(6), GATE)
    (report,) = d.pod_sets
    assert report.cap == cap and len(d.releases) == cap
    assert report.spec_count == spec and report.admitted_count == adm
    assert report.problem == c.problem


def test_spec_count_absent_caps_zero() -> None:
    from tests.unit.builders import _ABSENT

    d = decide([wl_view(pod_sets={"main": _ABSENT}, admitted={"main": 2})], _gated(2), GATE)
    (report,) = d.pod_sets
    assert (report.cap, report.spec_count, report.admitted_count) == (0, None, 2)
    assert "spec count" in report.problem
    assert d.releases == ()


def test_caps_per_pod_set_are_independent() -> None:
    view = wl_view(pod_sets={"head": 1, "workers": 4}, admitted={"head": 1, "workers": 2})
    pods = [
        *_gated(2, "h", pod_set="head"),
        *_gated(3, "w", pod_set="workers"),
    ]
    d = decide([view], pods, GATE)
    assert d.released_names == ["h0", "w0", "w1"]
    assert [(r.name, r.cap, len(r.chosen)) for r in d.pod_sets] == [
        ("head", 1, 1),
        ("workers", 2, 2),
    ]
    assert {r.pod.name: r.pod_set for r in d.releases} == {
        "h0": "head",
        "w0": "workers",
        "w1": "workers",
    }


def test_pod_set_name_defaults_to_main() -> None:
    raw = wl_view(pod_sets={"": 2}, admitted={"": 2})
    assert [p.name for p in raw.pod_sets] == ["main"]
    assert decide([raw], _gated(3), GATE).released_names == ["p0", "p1"]


# -- counting ---------------------------------------------------------------------------------

ONE_SLICE = [dict(name="wl-1", pod_sets={"main": 3})]

COUNT_CASES = [
    Case(
        "running-ungated-use-the-cap",
        ONE_SLICE,
        [
            facts("r0", gates=(), phase="Running"),
            facts("r1", gates=(), phase="Running"),
            *_gated(3),
        ],
        ["p0"],
    ),
    Case(
        "pending-ungated-use-the-cap",
        ONE_SLICE,
        [facts("u0", gates=()), facts("u1", gates=()), facts("u2", gates=()), *_gated(3)],
        [],
    ),
    Case(
        "terminal-ungated-free-their-slot",
        ONE_SLICE,
        [
            facts("s0", gates=(), phase="Succeeded"),
            facts("f0", gates=(), phase="Failed"),
            facts("r0", gates=(), phase="Running"),
            *_gated(3),
        ],
        ["p0", "p1"],
    ),
    Case(
        "deleting-ungated-do-not-count",
        ONE_SLICE,
        [facts("d0", gates=(), phase="Running", deleting=True), *_gated(4)],
        ["p0", "p1", "p2"],
    ),
    Case(
        "deleting-gated-never-released",
        ONE_SLICE,
        [facts("d0", deleting=True, created=1), *_gated(1)],
        ["p0"],
    ),
    Case(
        "terminal-gated-never-released",
        ONE_SLICE,
        [facts("f0", phase="Failed", created=1), facts("s0", phase="Succeeded", created=2)],
        [],
    ),
    Case(
        "in-flight-counts-as-released",
        ONE_SLICE,
        _gated(5),
        ["p1", "p2"],
        in_flight=("uid-p0",),
    ),
    Case(
        "in-flight-already-ungated-not-double-counted",
        ONE_SLICE,
        [facts("r0", gates=(), phase="Running"), *_gated(4)],
        ["p0", "p1"],
        in_flight=("uid-r0",),
    ),
    Case(
        "in-flight-unknown-uid-ignored",
        ONE_SLICE,
        _gated(4),
        ["p0", "p1", "p2"],
        in_flight=("uid-gone",),
    ),
    Case(
        "in-flight-deleting-gated-frees",
        ONE_SLICE,
        [facts("d0", deleting=True), *_gated(4)],
        ["p0", "p1", "p2"],
        in_flight=("uid-d0",),
    ),
    Case(
        "other-gate-only-counts-as-released-by-us",
        ONE_SLICE,
        [facts("t0", gates=(TOPOLOGY_GATE,)), *_gated(4)],
        ["p0", "p1"],
    ),
    Case(
        "both-gates-released-as-ours",
        ONE_SLICE,
        [facts("b0", gates=(TOPOLOGY_GATE, GATE), created=1), *_gated(4)],
        ["b0", "p0", "p1"],
    ),
    Case(
        "scale-down-over-cap-releases-nothing",
        [dict(name="wl-1", pod_sets={"main": 1}, admitted={"main": 3})],
        [
            facts("r0", gates=(), phase="Running"),
            facts("r1", gates=(), phase="Running"),
            *_gated(2),
        ],
        [],
    ),
]


@pytest.mark.parametrize("case", COUNT_CASES, ids=[c.id for c in COUNT_CASES])
def test_counting(case: Case) -> None:
    _check(case)


def test_counting_report_fields() -> None:
    pods = [
        facts("r0", gates=(), phase="Running"),
        facts("s0", gates=(), phase="Succeeded"),
        facts("d0", gates=(), deleting=True),
        facts("fl", created=1),
        facts("gd", deleting=True),
        facts("gf", phase="Failed"),
        *_gated(3),
    ]
    d = decide(_views([dict(pod_sets={"main": 4})]), pods, GATE, ["uid-fl"])
    (r,) = d.pod_sets
    assert (r.live_ungated, r.in_flight, r.gated) == (1, 1, 3)
    assert r.free == 2
    assert r.chosen == ("p0", "p1")
    reasons = {w.pod: w.reason for w in r.waiting}
    assert reasons["gd"] == "being deleted"
    assert reasons["gf"] == "terminal (Failed)"
    assert reasons["p2"] == "cap reached (4 of 4 released)"
    assert set(reasons) == {"gd", "gf", "p2"}


# -- eligibility --------------------------------------------------------------------------------


def test_foreign_never_released_and_unmapped() -> None:
    pods = [
        facts("f0", ownership=Ownership.FOREIGN, created=1),
        facts("f1", ownership=Ownership.FOREIGN, gates=(), phase="Running"),
        *_gated(2),
    ]
    d = decide(_views([dict(pod_sets={"main": 2})]), pods, GATE)
    assert d.released_names == ["p0", "p1"]  # the ungated foreign pod does not use our cap
    assert [(w.pod, "not owned" in w.reason) for w in d.unmapped] == [("f0", True)]
    (r,) = d.pod_sets
    assert r.live_ungated == 0 and r.gated == 2
    assert "f0" not in {w.pod for w in r.waiting}


def test_unresolved_never_released_but_counted_and_explained() -> None:
    pods = [
        facts("u0", ownership=Ownership.UNRESOLVED, created=1),
        facts("u1", ownership=Ownership.UNRESOLVED, gates=(), phase="Running"),
        *_gated(3),
    ]
    d = decide(_views([dict(pod_sets={"main": 3})]), pods, GATE)
    # the released unresolved pod counts against the cap (conservative)
    assert d.released_names == ["p0", "p1"]
    (r,) = d.pod_sets
    assert r.live_ungated == 1
    assert r.gated == 4  # the unresolved gated pod is counted as gated
    reasons = {w.pod: w.reason for w in r.waiting}
    assert "ownership not yet provable" in reasons["u0"]
    assert d.unmapped == ()


def test_unresolved_member_blocks_its_group() -> None:
    pods = [
        facts("a0", group="ga", ownership=Ownership.UNRESOLVED, created=1),
        facts("a1", group="ga", created=2),
        facts("b0", group="gb", created=3),
        facts("b1", group="gb", created=4),
    ]
    d = decide(_views([dict(pod_sets={"main": 4})]), pods, GATE)
    assert d.released_names == ["b0", "b1"]
    reasons = {w.pod: w.reason for w in d.pod_sets[0].waiting}
    assert "a0" in reasons["a1"] and "not provably owned" in reasons["a1"]


@pytest.mark.parametrize(
    ("pod_set", "reason"),
    [
        pytest.param("ghost", "unknown pod set 'ghost' in slice wl-1", id="unknown"),
        pytest.param(None, "no pod set in slice wl-1", id="none"),
        pytest.param("", "no pod set in slice wl-1", id="empty"),
    ],
)
def test_unknown_pod_set_unmapped(pod_set: str | None, reason: str) -> None:
    pods = [
        facts("x0", pod_set=pod_set),
        facts("x1", pod_set=pod_set, gates=()),  # not ours to release: not reported
        *_gated(1),
    ]
    d = decide(_views([dict(pod_sets={"main": 5})]), pods, GATE)
    assert d.released_names == ["p0"]
    assert [(w.pod, w.reason) for w in d.unmapped] == [("x0", reason)]


def test_pod_set_of_old_slice_only_is_unmapped() -> None:
    specs = [
        dict(
            name="wl-1",
            created=0,
            pod_sets={"main": 1, "extra": 1},
            conditions=["Admitted", REPLACED],
        ),
        dict(name="wl-2", created=1, pod_sets={"main": 2}, replacement_for="wl-1"),
    ]
    d = decide(_views(specs), [facts("e0", pod_set="extra"), *_gated(3)], GATE)
    assert d.released_names == ["p0", "p1"]
    assert [w.pod for w in d.unmapped] == ["e0"]
    assert "wl-2" in d.unmapped[0].reason


# -- order --------------------------------------------------------------------------------------


def _names_in_order(pods: list[PodFacts], cap: int) -> list[str]:
    return decide(_views([dict(pod_sets={"main": cap})]), pods, GATE).released_names


ORDER_CASES = [
    pytest.param(
        [
            facts("job-10", sort_key=(10,), created=1),
            facts("job-2", sort_key=(2,), created=2),
            facts("job-0", sort_key=(0,), created=3),
            facts("job-1", sort_key=(1,), created=4),
        ],
        3,
        ["job-0", "job-1", "job-2"],
        id="index-order-not-name-order",
    ),
    pytest.param(
        [
            facts("b", sort_key=(1, 0), created=1),
            facts("a", sort_key=(0, 5), created=2),
            facts("c", sort_key=(0, 1), created=3),
        ],
        2,
        ["c", "a"],
        id="tuple-keys",
    ),
    pytest.param(
        [facts("z", created=3), facts("y", created=1), facts("x", created=2)],
        2,
        ["y", "x"],
        id="no-key-creation-time",
    ),
    pytest.param(
        [
            facts("b", sort_key=(1,), created=5),
            facts("a", sort_key=(1,), created=5),
            facts("c", sort_key=(1,), created=4),
        ],
        2,
        ["c", "a"],
        id="tie-creation-then-name",
    ),
    pytest.param(
        [
            facts("s", sort_key=("a",), created=1),
            facts("i", sort_key=(7,), created=2),
            facts("t", sort_key=(0, "x"), created=3),
            facts("u", sort_key=("b", 1), created=4),
            facts("e", sort_key=(), created=5),
        ],
        5,
        ["e", "t", "i", "s", "u"],
        id="mixed-int-str-no-crash",
    ),
    pytest.param(
        [
            facts("w1", sort_key=(1, 0), created=1),
            facts("head", sort_key=(0,), created=9),
            facts("w0", sort_key=(1, "0"), created=2),
        ],
        2,
        ["head", "w1"],
        id="ints-before-strs",
    ),
    pytest.param(
        [facts("neg", sort_key=(-1,), created=9), facts("pos", sort_key=(3,), created=1)],
        1,
        ["neg"],
        id="negative-int",
    ),
]


@pytest.mark.parametrize(("pods", "cap", "expected"), ORDER_CASES)
def test_order(pods: list[PodFacts], cap: int, expected: list[str]) -> None:
    assert _names_in_order(pods, cap) == expected
    assert _names_in_order(list(reversed(pods)), cap) == expected


# -- release groups -------------------------------------------------------------------------------


def _grp(prefix: str, n: int, key: int, size: int | None = None, start: int = 0, **kw: Any):
    return [
        facts(f"{prefix}{i}", group=prefix, size=size, sort_key=(key, i), created=start + i, **kw)
        for i in range(n)
    ]


GROUP_CASES = [
    Case(
        "whole-groups-only",
        [dict(pod_sets={"main": 5})],
        [*_grp("a", 2, 1), *_grp("b", 2, 2), *_grp("c", 2, 3)],
        ["a0", "a1", "b0", "b1"],
    ),
    Case(
        "group-not-fitting-stops-further-releases",
        [dict(pod_sets={"main": 3})],
        [*_grp("a", 2, 1), *_grp("b", 2, 2), facts("lone", sort_key=(3,))],
        ["a0", "a1"],
    ),
    Case(
        "incomplete-group-with-size-waits-others-go-on",
        [dict(pod_sets={"main": 4})],
        [*_grp("a", 2, 1, size=3), *_grp("b", 2, 2, size=2), facts("lone", sort_key=(3,))],
        ["b0", "b1", "lone"],
    ),
    Case(
        "group-complete-counting-ungated-member",
        [dict(pod_sets={"main": 4})],
        [
            facts("a0", group="a", size=3, gates=(), phase="Running", sort_key=(1, 0)),
            facts("a1", group="a", size=3, sort_key=(1, 1)),
            facts("a2", group="a", size=3, sort_key=(1, 2)),
        ],
        ["a1", "a2"],
    ),
    Case(
        "group-member-deleting-makes-it-incomplete",
        [dict(pod_sets={"main": 4})],
        [
            facts("a0", group="a", size=2, deleting=True, sort_key=(1, 0)),
            facts("a1", group="a", size=2, sort_key=(1, 1)),
        ],
        [],
    ),
    Case(
        "group-member-terminal-makes-it-incomplete",
        [dict(pod_sets={"main": 4})],
        [
            facts("a0", group="a", size=2, phase="Failed", gates=(), sort_key=(1, 0)),
            facts("a1", group="a", size=2, sort_key=(1, 1)),
        ],
        [],
    ),
    Case(
        "group-without-size-whatever-exists",
        [dict(pod_sets={"main": 4})],
        [
            facts("a0", group="a", deleting=True, sort_key=(1, 0)),
            facts("a1", group="a", sort_key=(1, 1)),
            facts("a2", group="a", sort_key=(1, 2)),
        ],
        ["a1", "a2"],
    ),
    Case(
        "group-member-in-flight-rest-released",
        [dict(pod_sets={"main": 4})],
        [*_grp("a", 3, 1, size=3)],
        ["a1", "a2"],
        in_flight=("uid-a0",),
    ),
    Case(
        "group-sorted-at-first-member",
        [dict(pod_sets={"main": 3})],
        [
            facts("g-late", group="g", sort_key=(9,)),
            facts("g-early", group="g", sort_key=(0,)),
            facts("lone", sort_key=(5,)),
        ],
        ["g-early", "g-late", "lone"],
    ),
    Case(
        "group-exactly-fits",
        [dict(pod_sets={"main": 3})],
        [facts("lone", sort_key=(0,)), *_grp("a", 2, 1, size=2)],
        ["lone", "a0", "a1"],
    ),
    Case(
        "cap-zero-group",
        [dict(pod_sets={"main": 0})],
        [*_grp("a", 2, 1, size=2)],
        [],
    ),
]


@pytest.mark.parametrize("case", GROUP_CASES, ids=[c.id for c in GROUP_CASES])
def test_release_groups(case: Case) -> None:
    _check(case)


def test_group_reasons() -> None:
    pods = [*_grp("a", 2, 1, size=3), *_grp("b", 2, 2), *_grp("c", 3, 3), facts("z", sort_key=(4,))]
    d = decide(_views([dict(pod_sets={"main": 4})]), pods, GATE)
    assert d.released_names == ["b0", "b1"]
    reasons = {w.pod: w.reason for w in d.pod_sets[0].waiting}
    assert reasons["a0"] == reasons["a1"] == "release group a incomplete (2 of 3 pods)"
    assert reasons["c0"] == "next release group needs 3 pods, 2 left under the cap"
    assert reasons["c2"] == reasons["z"] == reasons["c0"]


# -- the explanation ----------------------------------------------------------------------------


def test_explanation_is_complete_and_meaningful() -> None:
    specs = [
        dict(name="wl-1", created=0, pod_sets={"main": 1}, conditions=["Admitted", REPLACED]),
        dict(
            name="wl-2",
            created=3,
            pod_sets={"main": 3},
            admitted={"main": 5},
            replacement_for="wl-1",
        ),
    ]
    pods = [
        facts("run", gates=(), phase="Running"),
        *_gated(4),
        facts("u", ownership=Ownership.UNRESOLVED),
        facts("x", pod_set="ghost"),
    ]
    d = decide(_views(specs), pods, GATE)
    assert d.active_slice == "wl-2"
    assert d.summary == "active slice wl-2: releasing 2"
    (r,) = d.pod_sets
    assert r.name == "main"
    assert (r.spec_count, r.admitted_count, r.cap) == (3, 5, 3)
    assert (r.live_ungated, r.in_flight, r.gated) == (1, 0, 5)
    assert r.chosen == ("p0", "p1") == tuple(d.released_names)
    assert r.problem == ""
    assert r.free == 2  # free is computed before this decision's releases
    waiting = {w.pod: w.reason for w in r.waiting}
    assert set(waiting) == {"p2", "p3", "u"}
    assert waiting["p2"] == "cap reached (3 of 3 released)"
    assert all(w.reason for w in r.waiting)
    assert [w.pod for w in d.unmapped] == ["x"]
    # every gated pod is either released or explained, exactly once
    explained = [w.pod for w in r.waiting] + [w.pod for w in d.unmapped] + list(r.chosen)
    assert sorted(explained) == sorted(["p0", "p1", "p2", "p3", "u", "x"])


def test_problem_pod_set_explains_waiting() -> None:
    d = decide(_views([dict(pod_sets={"main": 2}, admitted={"other": 2})]), _gated(2), GATE)
    (r,) = d.pod_sets
    assert r.problem == "pod set missing from status.admission"
    assert [w.reason for w in r.waiting] == ["cap reached (0 of 0 released)"] * 2


def test_report_free_never_negative() -> None:
    pods = [facts(f"r{i}", gates=(), phase="Running") for i in range(3)]
    d = decide(_views([dict(pod_sets={"main": 1})]), pods, GATE)
    assert d.pod_sets[0].free == 0 and d.pod_sets[0].live_ungated == 3


# -- gate index -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gates", "index"),
    [
        pytest.param((GATE,), 0, id="only"),
        pytest.param((GATE, TOPOLOGY_GATE), 0, id="first"),
        pytest.param((TOPOLOGY_GATE, GATE), 1, id="after-topology"),
        pytest.param(("example.com/a", "example.com/b", GATE), 2, id="third"),
    ],
)
def test_release_gate_index(gates: tuple[str, ...], index: int) -> None:
    d = decide(_views([dict(pod_sets={"main": 1})]), [facts("p", gates=gates)], GATE)
    (rel,) = d.releases
    assert (rel.gate, rel.gate_index, rel.pod_set) == (GATE, index, "main")
    assert rel.pod.gates[rel.gate_index] == GATE


def test_other_gate_name_configured() -> None:
    """The gate is a parameter: with another gate configured, ours is left alone."""
    pods = [facts("a", gates=(GATE,)), facts("b", gates=(TOPOLOGY_GATE, GATE), created=11)]
    d = decide(_views([dict(pod_sets={"main": 2})]), pods, TOPOLOGY_GATE)
    # pod a has no topology gate: it counts as released for that gate
    assert [(r.pod.name, r.gate_index) for r in d.releases] == [("b", 0)]


def test_cap_reached_reason_counts_this_decisions_releases() -> None:
    """The count in the reason includes the pods this very decision releases."""
    pods = [facts("run", gates=(), phase="Running"), *_gated(3)]
    d = decide(_views([dict(pod_sets={"main": 3})]), pods, GATE)
    assert d.released_names == ["p0", "p1"]
    (w,) = d.pod_sets[0].waiting
    assert w.reason == "cap reached (3 of 3 released)"


# -- the owner's own size ---------------------------------------------------------------------


def test_owner_size_below_the_slice_caps_the_pod_set_and_says_so() -> None:
    """Scale-down: the owner shrank to 2, Kueue has not lowered the slice's 4 yet."""
    released = [facts(f"r{i}", created=i, gates=(), phase="Running") for i in range(2)]
    d = decide([wl_view(pod_sets={"main": 4})], [*released, *_gated(2)], GATE, desired={"main": 2})
    assert d.released_names == []
    (report,) = d.pod_sets
    assert (report.cap, report.desired_count, report.spec_count) == (2, 2, 4)
    assert all("the owner wants 2 of the 4 admitted" in w.reason for w in report.waiting)


def test_owner_size_above_the_slice_or_unnamed_changes_nothing() -> None:
    slices = [wl_view(pod_sets={"main": 2, "other": 1})]
    pods = _gated(3)
    d = decide(slices, pods, GATE, desired={"main": 5})
    assert d.released_names == ["p0", "p1"]  # the slice's 2, not the owner's 5
    assert {r.name: (r.cap, r.desired_count) for r in d.pod_sets} == {
        "main": (2, 5),
        "other": (1, None),  # not named by the plugin: the slice alone bounds it
    }
    assert decide(slices, pods, GATE, desired={"main": 0}).released_names == []


# -- the bound in the cap-reached reason (rows that kill mutants of ``_bound``) ---------------

BOUND_CASES = [
    pytest.param(
        {"main": 2},
        None,
        2,
        2,
        [],
        "cap reached (2 of 2 released)",
        id="owner-size-equal-to-the-slice-is-no-news",  # it bounds nothing the slice does not
    ),
    pytest.param(
        {"main": 4},
        None,
        3,
        2,
        ["p0"],
        "cap reached (3 of 3 released; the owner wants 3 of the 4 admitted)",
        id="owner-size-one-below-the-slice-says-so",
    ),
    pytest.param(
        {"main": 2},
        {"main": 3},
        1,
        0,
        ["p0"],
        "cap reached (1 of 1 released; the owner wants 1 of the 2 admitted)",
        id="slice-bound-is-min-of-spec-and-admitted",  # partial admission or in-place lowering
    ),
    pytest.param(
        {"main": "absent"},
        {"main": None},
        0,
        0,
        [],
        "cap reached (0 of 0 released)",
        id="no-slice-count-at-all-owner-at-zero",  # malformed slice: no count to compare with
    ),
    pytest.param(
        {"main": "absent"},
        {"main": None},
        2,
        0,
        [],
        "cap reached (0 of 0 released)",
        id="no-slice-count-at-all-owner-wants-two",  # the problem field says why, not the bound
    ),
]


@pytest.mark.parametrize(
    ("spec", "admitted", "desired", "running", "released", "reason"), BOUND_CASES
)
def test_cap_reached_reason_names_the_owner_bound_only_when_it_binds(
    spec: dict[str, Any],
    admitted: dict[str, Any] | None,
    desired: int,
    running: int,
    released: list[str],
    reason: str,
) -> None:
    from tests.unit.builders import _ABSENT

    pod_sets = {k: _ABSENT if v == "absent" else v for k, v in spec.items()}
    kw: dict[str, Any] = {"pod_sets": pod_sets}
    if admitted is not None:
        kw["admitted"] = admitted
    ran = [facts(f"r{i}", created=i, gates=(), phase="Running") for i in range(running)]
    d = decide([wl_view(**kw)], [*ran, *_gated(2)], GATE, desired={"main": desired})
    assert d.released_names == released
    (report,) = d.pod_sets
    assert {w.reason for w in report.waiting} == {reason}


# -- gated pods by reason (the ``ungater_gated_pods`` gauge's numbers) -------------------------

GATED_CASES = [
    pytest.param(
        [dict(pod_sets={"main": 1})],
        [facts("r0", gates=(), phase="Running"), *_gated(3)],
        {"capacity": 3},
        id="three-wait-for-capacity",  # counts above one: each waiting pod counted once
    ),
    pytest.param(
        [dict(pod_sets={"main": 3})],
        [facts("r0", gates=(), phase="Running"), *_gated(3)],
        {"capacity": 1},
        id="the-pods-released-now-do-not-wait",
    ),
    pytest.param(
        [dict(pod_sets={"main": 1})],
        [
            facts("r0", gates=(), phase="Running"),
            *_gated(2),
            facts("dead", phase="Failed"),
            facts("going", deleting=True),
            facts("u", ownership=Ownership.UNRESOLVED),
            facts("ghost", pod_set="ghost"),
            facts("alien", ownership=Ownership.FOREIGN),
        ],
        {"capacity": 2, "ownership-unresolved": 1, "unmapped": 2},
        id="ended-pods-are-not-waiting-the-others-by-code",
    ),
    pytest.param(
        [dict(pod_sets={"main": 1}, conditions=["Admitted", "Finished"])],
        _gated(2),
        {"capacity": 2},
        id="no-active-slice-all-wait-for-capacity",
    ),
    pytest.param(
        [dict(pod_sets={"main": 2})],
        [facts("dead", phase="Failed"), facts("going", deleting=True)],
        {},
        id="only-ended-pods-nothing-waits",
    ),
]


@pytest.mark.parametrize(("slices", "pods", "counts"), GATED_CASES)
def test_gated_by_reason_counts_each_waiting_pod_once_by_code(
    slices: list[dict[str, Any]], pods: list[PodFacts], counts: dict[str, int]
) -> None:
    assert gated_by_reason(decide(_views(slices), pods, GATE)) == counts
