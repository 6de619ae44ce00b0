"""Property tests of ``ungater.decision.decide`` over random slice chains and random pods.

The expectations here are computed independently of the implementation (from the raw
strategy data), so a shared mistake is less likely to hide.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.builders import _ABSENT, GATE, TOPOLOGY_GATE, pod, workload
from ungater.decision import Decision, Ownership, PodFacts, decide
from ungater.model import WorkloadView, parse_pod, parse_workload
from ungater.plugin_api import ReleaseGroup

POD_SETS = ("main", "workers")
SETTINGS = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

# -- strategies -----------------------------------------------------------------------------

count_values = st.one_of(
    st.integers(min_value=0, max_value=6),
    st.sampled_from([-1, "3", None, True, _ABSENT]),  # None / _ABSENT: see builders.workload
)


@st.composite
def slice_chains(draw: st.DrawFn) -> list[WorkloadView]:
    n = draw(st.integers(min_value=1, max_value=4))
    names = [f"wl-{i}" for i in range(n)]
    uids = draw(st.permutations([f"u{i}" for i in range(n)]))
    out = []
    for i, name in enumerate(names):
        sets = draw(st.lists(st.sampled_from(POD_SETS), min_size=1, max_size=2, unique=True))
        pod_sets = {s: draw(count_values.filter(lambda v: v is not None)) for s in sets}
        admission = draw(st.sampled_from(["full", "partial", "none"]))
        admitted: Any
        if admission == "none":
            admitted = None
        else:
            admitted = {}
            for s in sets:
                if admission == "partial" and draw(st.booleans()):
                    continue  # pod set missing from admission
                v = draw(count_values.filter(lambda v: v is not _ABSENT))
                admitted[s] = v  # None: count absent
        conds: list[Any] = []
        for kind, weights in (
            ("QuotaReserved", ["True", "False", None]),
            ("Admitted", ["True", "True", "False", None]),
            ("Finished", ["True", "False", None, None]),
            ("Evicted", ["True", "False", None, None]),
        ):
            status = draw(st.sampled_from(weights))
            if status is not None:
                conds.append((kind, status))
        link = draw(st.sampled_from([None, "gone", *names[:i], *names[i + 1 :]]))
        raw = workload(
            name,
            uid=uids[i],
            created=draw(st.integers(min_value=0, max_value=2)),
            pod_sets=pod_sets,
            admitted=admitted,
            conditions=conds,
            replacement_for=link,
        )
        out.append(parse_workload(raw))
    return out


sort_key_items = st.one_of(st.integers(min_value=-2, max_value=5), st.sampled_from(["a", "b", "0"]))


@st.composite
def pod_facts(draw: st.DrawFn) -> list[PodFacts]:
    n = draw(st.integers(min_value=0, max_value=12))
    group_sizes = {f"g{i}": draw(st.sampled_from([None, 1, 2, 3])) for i in range(3)}
    out = []
    for i in range(n):
        pod_set = draw(st.sampled_from([*POD_SETS, *POD_SETS, "ghost", None]))
        gates = draw(
            st.sampled_from([(), (GATE,), (GATE,), (GATE,), (TOPOLOGY_GATE, GATE), (TOPOLOGY_GATE,)])
        )
        raw = pod(
            f"p{i}",
            uid=f"uid-p{i}",
            gates=gates,
            phase=draw(st.sampled_from(["Pending", "Pending", "Running", "Succeeded", "Failed"])),
            deleting=draw(st.booleans()),
            created=draw(st.integers(min_value=0, max_value=3)),
            pod_set=pod_set,
        )
        gkey = draw(st.sampled_from([None, None, "g0", "g1", "g2"]))
        group = ReleaseGroup(gkey, group_sizes[gkey]) if gkey else None
        ownership = draw(
            st.sampled_from([Ownership.PROVEN] * 4 + [Ownership.FOREIGN, Ownership.UNRESOLVED])
        )
        key = tuple(draw(st.lists(sort_key_items, max_size=2)))
        out.append(PodFacts(parse_pod(raw), pod_set, key, group, ownership))
    return out


@dataclass
class Scenario:
    slices: list[WorkloadView]
    pods: list[PodFacts]
    in_flight: frozenset[str]


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    slices = draw(slice_chains())
    pods = draw(pod_facts())
    uids = [f.pod.uid for f in pods]
    flying = draw(st.sets(st.sampled_from(uids))) if uids else set()
    if draw(st.booleans()):
        flying = set(flying) | {"uid-not-a-pod"}
    return Scenario(slices, pods, frozenset(flying))


# -- independent model of the rules ------------------------------------------------------------


def _true(w: WorkloadView, kind: str) -> bool:
    c = w.conditions.get(kind)
    return c is not None and c.status == "True"


def _qualifies(w: WorkloadView) -> bool:
    return _true(w, "Admitted") and not _true(w, "Finished") and not _true(w, "Evicted")


def _cap(active: WorkloadView, name: str) -> int:
    spec = next(p.count for p in active.pod_sets if p.name == name)
    if spec is None:
        return 0
    if active.assignments is None:
        return 0
    a = {x.name: x for x in active.assignments}.get(name)
    if a is None or a.invalid:
        return 0
    return spec if a.count is None else min(spec, a.count)


def _live(f: PodFacts) -> bool:
    return f.pod.phase not in ("Succeeded", "Failed") and not f.pod.deleting


def _gated(f: PodFacts) -> bool:
    return GATE in f.pod.gates


def _members(s: Scenario, active: WorkloadView, name: str) -> list[PodFacts]:
    known = {p.name for p in active.pod_sets}
    assert name in known
    return [f for f in s.pods if f.pod_set == name and f.ownership is not Ownership.FOREIGN]


def _eligible(f: PodFacts, s: Scenario) -> bool:
    return (
        _gated(f)
        and _live(f)
        and f.ownership is Ownership.PROVEN
        and f.pod.uid not in s.in_flight
    )


def _cmp_key(f: PodFacts) -> tuple[Any, ...]:
    # documented order: sort key (ints before strs), then creation time, then name
    key = tuple((0, x, "") if isinstance(x, int) else (1, 0, x) for x in f.sort_key)
    return (key, f.pod.creation_timestamp, f.pod.name)


def _active(s: Scenario, d: Decision) -> WorkloadView | None:
    if d.active_slice is None:
        return None
    (w,) = [w for w in s.slices if w.name == d.active_slice]
    return w


def _released_in(d: Decision, name: str) -> list[PodFacts]:
    return [r for r in d.releases if r.pod_set == name]  # type: ignore[misc]


# -- properties ----------------------------------------------------------------------------------


@SETTINGS
@given(scenarios())
def test_never_exceeds_the_cap(s: Scenario) -> None:
    d = decide(s.slices, s.pods, GATE, s.in_flight)
    active = _active(s, d)
    if active is None:
        assert d.releases == ()
        return
    assert _qualifies(active)
    for report in d.pod_sets:
        members = _members(s, active, report.name)
        cap = _cap(active, report.name)
        assert report.cap == cap
        live_ungated = sum(1 for f in members if not _gated(f) and _live(f))
        flying = sum(1 for f in members if _gated(f) and _live(f) and f.pod.uid in s.in_flight)
        assert (report.live_ungated, report.in_flight) == (live_ungated, flying)
        released = len(_released_in(d, report.name))
        if live_ungated + flying >= cap:
            assert released == 0
        else:
            assert released + live_ungated + flying <= cap
        assert len(report.chosen) == released
    assert len(d.releases) == sum(len(r.chosen) for r in d.pod_sets)


@SETTINGS
@given(scenarios())
def test_only_eligible_pods_are_released(s: Scenario) -> None:
    d = decide(s.slices, s.pods, GATE, s.in_flight)
    by_uid = {f.pod.uid: f for f in s.pods}
    active = _active(s, d)
    uids = [r.pod.uid for r in d.releases]
    assert len(uids) == len(set(uids)), "a pod released twice"
    for r in d.releases:
        assert active is not None
        f = by_uid[r.pod.uid]
        assert r.pod is f.pod
        assert _eligible(f, s), f
        assert f.pod_set == r.pod_set
        assert r.pod_set in {p.name for p in active.pod_sets}
        assert r.gate == GATE
        assert f.pod.gates[r.gate_index] == GATE


@SETTINGS
@given(scenarios())
def test_idempotent_with_in_flight(s: Scenario) -> None:
    d = decide(s.slices, s.pods, GATE, s.in_flight)
    released = {r.pod.uid for r in d.releases}
    again = decide(s.slices, s.pods, GATE, s.in_flight | released)
    assert again.releases == ()
    assert again.active_slice == d.active_slice


def _caught_up(s: Scenario, released: set[str]) -> list[PodFacts]:
    out = []
    for f in s.pods:
        if f.pod.uid in released:
            gates = tuple(g for g in f.pod.gates if g != GATE)
            f = dataclasses.replace(f, pod=dataclasses.replace(f.pod, gates=gates))
        out.append(f)
    return out


@SETTINGS
@given(scenarios())
def test_idempotent_when_the_cache_catches_up(s: Scenario) -> None:
    d = decide(s.slices, s.pods, GATE, s.in_flight)
    released = {r.pod.uid for r in d.releases}
    pods = _caught_up(s, released)
    assert decide(s.slices, pods, GATE, s.in_flight).releases == ()
    # both at once (the cache caught up before the expectation was observed)
    assert decide(s.slices, pods, GATE, s.in_flight | released).releases == ()


@SETTINGS
@given(scenarios())
def test_lone_pods_released_in_order(s: Scenario) -> None:
    d = decide(s.slices, s.pods, GATE, s.in_flight)
    active = _active(s, d)
    if active is None:
        return
    released = {r.pod.uid for r in d.releases}
    for report in d.pod_sets:
        lone = [
            f for f in _members(s, active, report.name) if f.group is None and _eligible(f, s)
        ]
        got = [f for f in lone if f.pod.uid in released]
        waiting = [f for f in lone if f.pod.uid not in released]
        if got and waiting:
            assert min(_cmp_key(f) for f in waiting) > max(_cmp_key(f) for f in got)


@SETTINGS
@given(scenarios())
def test_whole_groups_only(s: Scenario) -> None:
    d = decide(s.slices, s.pods, GATE, s.in_flight)
    active = _active(s, d)
    if active is None:
        return
    released = {r.pod.uid for r in d.releases}
    for report in d.pod_sets:
        members = _members(s, active, report.name)
        keys = {f.group.key for f in members if f.group and f.pod.uid in released}
        for key in keys:
            group = [f for f in members if f.group and f.group.key == key]
            for f in group:
                if _eligible(f, s):
                    assert f.pod.uid in released, (key, f.pod.name)
                # an unresolved member blocks the whole group
                assert not (_gated(f) and _live(f) and f.ownership is Ownership.UNRESOLVED
                            and f.pod.uid not in s.in_flight)
            sizes = {f.group.size for f in group if f.group}
            size = next(iter(sizes)) if len(sizes) == 1 else None
            if size is not None:
                assert sum(1 for f in group if _live(f)) >= size


@SETTINGS
@given(slice_chains(), pod_facts())
def test_no_active_slice_releases_nothing(slices: list[WorkloadView], pods: list[PodFacts]) -> None:
    stale = [
        parse_workload(
            workload(
                w.name,
                uid=w.uid,
                pod_sets={"main": 3},
                conditions=[("Admitted", "True"), ("Finished", "True")]
                if i % 2
                else [("Admitted", "True"), ("Evicted", "True")],
            )
        )
        for i, w in enumerate(slices)
    ]
    for chain in (stale, []):
        d = decide(chain, pods, GATE)
        assert d.active_slice is None
        assert d.releases == () and d.pod_sets == ()
        assert len(d.unmapped) == sum(1 for f in pods if _gated(f))


@SETTINGS
@given(scenarios())
def test_active_slice_is_the_newest_qualifying(s: Scenario) -> None:
    d = decide(s.slices, s.pods, GATE, s.in_flight)
    qualifying = [w for w in s.slices if _qualifies(w)]
    if not qualifying:
        assert d.active_slice is None
        return
    active = _active(s, d)
    assert active is not None and _qualifies(active)
    newest = max(w.creation_timestamp for w in qualifying)
    assert active.creation_timestamp == newest
    # a qualifying slice that directly replaces the active one in the same second must win
    for w in qualifying:
        if w.creation_timestamp == newest and w.replacement_for == active.key:
            replaced_back = active.replacement_for == w.key  # a cycle: no order can satisfy it
            assert replaced_back, (w.name, active.name)


@SETTINGS
@given(scenarios(), st.randoms(use_true_random=False))
def test_input_order_does_not_matter(s: Scenario, rnd: random.Random) -> None:
    d = decide(s.slices, s.pods, GATE, s.in_flight)
    slices, pods = list(s.slices), list(s.pods)
    rnd.shuffle(slices)
    rnd.shuffle(pods)
    e = decide(slices, pods, GATE, s.in_flight)
    assert e.active_slice == d.active_slice
    assert sorted(r.pod.uid for r in e.releases) == sorted(r.pod.uid for r in d.releases)


@SETTINGS
@given(scenarios())
def test_every_gated_pod_is_accounted_for(s: Scenario) -> None:
    d = decide(s.slices, s.pods, GATE, s.in_flight)
    active = _active(s, d)
    seen: dict[str, int] = {}
    for name in [w.pod for w in d.unmapped]:
        seen[name] = seen.get(name, 0) + 1
    for r in d.pod_sets:
        for name in [*r.chosen, *(w.pod for w in r.waiting)]:
            seen[name] = seen.get(name, 0) + 1
        assert all(w.reason for w in r.waiting)
    assert all(w.reason for w in d.unmapped)
    known = {p.name for p in active.pod_sets} if active else set()
    for f in s.pods:
        if not _gated(f):
            assert f.pod.name not in seen
            continue
        counted_in_flight = (
            f.pod.uid in s.in_flight
            and active is not None
            and f.ownership is not Ownership.FOREIGN
            and f.pod_set in known
        )
        if counted_in_flight:
            assert f.pod.name not in seen
        else:
            assert seen.get(f.pod.name) == 1, f.pod.name
