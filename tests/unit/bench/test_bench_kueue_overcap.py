"""Releases past the cap (bench/kueue_overcap.py) on hand-made event streams, and the owner
events the timeline records for it (bench/timeline.py) from a fake API server.

The cap is min(spec count, admitted count, the owner's own size) per pod set, as the tests'
oracles judge it (``tests/integration/realpeers.py``), and a pod first seen live without a gate
is released from that event on."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from bench.gapwatch import Gap, WatchSettings
from bench.kueue_overcap import OverCap, releases_past_cap
from bench.objects import JOBS, WORKLOADS
from bench.timeline import (
    OwnerEvent,
    PodEvent,
    SliceEvent,
    Timeline,
    job_sizes,
    raycluster_sizes,
)
from tests.fakekube import FakeKube
from ungater._kube.client import PODS, Resource

K, U = "k/gate", "u/gate"
GATES = {"kueue": K, "ungater": U}
BOTH = frozenset({K, U})
NONE: frozenset[str] = frozenset()
Event = PodEvent | SliceEvent | OwnerEvent


def pod(
    rv: int,
    uid: str,
    gates: frozenset[str],
    live: bool = True,
    owner: str = "o",
    carried: frozenset[str] = BOTH,
) -> PodEvent:
    return PodEvent(rv, uid, owner, "main", carried, gates, live)


def first_seen(rv: int, uid: str, gates: frozenset[str]) -> PodEvent:
    """A pod whose first event already lacks some gate: the gates it carried are those it has."""
    return pod(rv, uid, gates, carried=gates)


def admitted(
    rv: int, name: str, count: int, owner: str = "o", spec: int | None = None
) -> SliceEvent:
    spec_count = count if spec is None else spec
    return SliceEvent(rv, name, owner, True, (("main", count),), False, (("main", spec_count),))


def job(rv: int, size: int, owner: str = "o", gone: bool = False) -> OwnerEvent:
    return OwnerEvent(rv, owner, (("main", size),), gone)


def judge(events: list[Event]) -> dict[str, OverCap]:
    return releases_past_cap(events, GATES)


def counts(events: list[Event]) -> dict[str, int]:
    return {label: oc.count for label, oc in judge(events).items()}


# -- what the judge counted before: the admitted count, releases of gated pods -----------------


def test_releases_within_the_admitted_count_are_not_past_the_cap() -> None:
    events: list[Event] = [job(0, 2), admitted(1, "s1", 2), pod(2, "a", BOTH), pod(3, "b", BOTH)]
    events += [pod(4, "a", frozenset({U})), pod(5, "b", frozenset({U}))]  # Kueue's gate off
    events += [pod(6, "a", NONE), pod(7, "b", NONE)]  # ungater's off
    assert counts(events) == {"kueue": 0, "ungater": 0}


def test_a_release_beyond_the_count_is_counted_for_its_gate_alone() -> None:
    events: list[Event] = [job(0, 2), admitted(1, "s1", 1), pod(2, "a", BOTH), pod(3, "b", BOTH)]
    events += [pod(4, "a", frozenset({U})), pod(5, "b", frozenset({U}))]  # 2 for a cap of 1
    events += [pod(6, "a", NONE)]
    result = judge(events)
    assert result["kueue"].count == 1 and result["kueue"].worst == 1
    assert result["ungater"].count == 0


def test_a_release_before_any_admission_is_past_a_cap_of_zero() -> None:
    events: list[Event] = [job(0, 1), pod(1, "a", BOTH), pod(2, "a", frozenset({K}))]
    assert counts(events) == {"kueue": 0, "ungater": 1}


def test_resource_version_order_decides_not_arrival_order() -> None:
    # the release (rv 5) came after a slot freed (rv 4), though the pod watch delivered it first
    events: list[Event] = [
        job(0, 2),
        admitted(1, "s1", 1),
        pod(2, "a", frozenset({U})),  # released under the cap
        pod(3, "b", BOTH),
        pod(5, "b", frozenset({U})),
        pod(4, "a", frozenset({U}), live=False),  # a finished first
    ]
    assert counts(events) == {"kueue": 0, "ungater": 0}


def test_the_newest_admitted_slice_sets_the_cap() -> None:
    # a shrink: the replacement for 1 is admitted after a slice of 3; the second release is over
    events: list[Event] = [job(0, 3), admitted(1, "s1", 3), admitted(2, "s2", 1)]
    events += [pod(3 + i, f"p{i}", BOTH) for i in range(2)]
    events += [pod(10, "p0", frozenset({U})), pod(11, "p1", frozenset({U}))]
    assert counts(events) == {"kueue": 1, "ungater": 0}


def test_a_pod_seen_released_again_is_one_release() -> None:
    events: list[Event] = [job(0, 1), admitted(1, "s1", 0), pod(2, "a", BOTH)]
    events += [
        pod(3, "a", frozenset({U})),
        pod(4, "a", frozenset({U})),
        pod(5, "a", frozenset({U})),
    ]
    assert counts(events) == {"kueue": 1, "ungater": 0}


def test_owners_do_not_share_a_cap() -> None:
    events: list[Event] = [job(0, 1, owner="x"), job(0, 1, owner="y")]
    events += [admitted(1, "s1", 1, owner="x"), admitted(2, "s2", 1, owner="y")]
    events += [pod(3, "a", BOTH, owner="x"), pod(4, "b", BOTH, owner="y")]
    events += [pod(5, "a", frozenset({U}), owner="x"), pod(6, "b", frozenset({U}), owner="y")]
    assert counts(events) == {"kueue": 0, "ungater": 0}


# -- issue 33: min(spec, admitted, owner size); a pod first seen released ----------------------


def test_a_clean_history_is_nothing_past_the_cap() -> None:
    # a Job of 3 admitted at 3: two gated pods released, one first seen released, all within
    # the cap; two pods finish, the Job shrinks to 2, and a new pod's release fits again
    events: list[Event] = [job(1, 3), admitted(2, "s1", 3)]
    events += [pod(3, "a", BOTH), pod(4, "b", BOTH), first_seen(5, "c", NONE)]
    events += [pod(6, "a", frozenset({U})), pod(7, "b", frozenset({U}))]
    events += [pod(8, "a", NONE), pod(9, "b", NONE)]
    events += [pod(10, "a", NONE, live=False), pod(11, "b", NONE, live=False), job(12, 2)]
    events += [pod(13, "d", BOTH), pod(14, "d", NONE)]  # c and d: 2 of min(3, 3, 2)
    events += [pod(15, "e", NONE, live=False, carried=NONE)]  # first seen finished: not live
    assert counts(events) == {"kueue": 0, "ungater": 0}


def test_a_pod_first_seen_released_beyond_the_admitted_count_is_past_the_cap() -> None:
    # (a) admitted 1: pod a released under it; pod b is first seen live with neither gate
    events: list[Event] = [job(0, 5), admitted(1, "s1", 1), pod(2, "a", BOTH)]
    events += [pod(3, "a", frozenset({K})), pod(4, "a", NONE)]  # 1 of 1, each gate
    events += [first_seen(5, "b", NONE)]  # 2 live released for 1, for each gate
    events += [first_seen(5, "b", NONE), pod(6, "b", NONE)]  # seen again (a relist, an update)
    result = judge(events)
    assert {label: oc.count for label, oc in result.items()} == {"kueue": 1, "ungater": 1}
    assert result["ungater"].worst == 1
    assert result["ungater"].examples[0] == {
        "rv": 5,
        "owner": "o",
        "pod_set": "main",
        "live": 2,
        "cap": 1,
        "spec": 1,
        "admitted": 1,
        "owner_size": 5,
        "first_seen": True,
    }


def test_a_release_past_an_owner_shrunk_below_the_admitted_count_is_past_the_cap() -> None:
    # (b) a Job of 4 admitted at 4 shrinks to parallelism 2 before the slice is lowered: the
    # third live release is past min(4, 4, 2)
    events: list[Event] = [job(1, 4), admitted(2, "s1", 4)]
    events += [pod(3 + i, f"p{i}", BOTH) for i in range(4)]
    events += [job(10, 2)]
    events += [pod(11 + i, f"p{i}", frozenset({K})) for i in range(3)]  # ungater's gate off
    result = judge(events)
    assert {label: oc.count for label, oc in result.items()} == {"kueue": 0, "ungater": 1}
    assert result["ungater"].examples[0]["rv"] == 13
    assert result["ungater"].examples[0]["cap"] == 2
    assert result["ungater"].examples[0]["owner_size"] == 2


def test_a_release_past_a_spec_count_lower_than_the_admitted_count_is_past_the_cap() -> None:
    # (c) the slice admits 4 but its spec asks for 2 (lowered in place): min(2, 4, 4) = 2
    events: list[Event] = [job(1, 4), admitted(2, "s1", 4, spec=2)]
    events += [pod(3 + i, f"p{i}", BOTH) for i in range(3)]
    events += [pod(10 + i, f"p{i}", frozenset({K})) for i in range(3)]
    result = judge(events)
    assert {label: oc.count for label, oc in result.items()} == {"kueue": 0, "ungater": 1}
    assert result["ungater"].examples[0]["spec"] == 2
    assert result["ungater"].examples[0]["admitted"] == 4


def test_an_owner_never_seen_or_gone_bounds_at_zero() -> None:
    never: list[Event] = [admitted(1, "s1", 3), pod(2, "a", BOTH), pod(3, "a", frozenset({K}))]
    assert counts(never) == {"kueue": 0, "ungater": 1}
    gone: list[Event] = [job(0, 3), admitted(1, "s1", 3), pod(2, "a", BOTH)]
    gone += [job(3, 3, gone=True), pod(4, "a", frozenset({K}))]
    assert counts(gone) == {"kueue": 0, "ungater": 1}


def test_each_pod_set_has_its_own_cap_and_size() -> None:
    # a RayCluster: head 1, workers 2 (owner), the slice admits head 1, workers 3
    rc = OwnerEvent(0, "o", (("head", 1), ("workers", 2)), False)
    counts_ = (("head", 1), ("workers", 3))
    slice_ = SliceEvent(1, "s1", "o", True, counts_, False, counts_)
    events: list[Event] = [rc, slice_]
    for i, pod_set in enumerate(("head", "workers", "workers", "workers")):
        events.append(PodEvent(10 + i, f"p{i}", "o", pod_set, BOTH, BOTH, True))
        events.append(PodEvent(20 + i, f"p{i}", "o", pod_set, BOTH, frozenset({K}), True))
    result = judge(events)
    assert result["ungater"].count == 1  # the third worker: 3 > min(3, 3, 2)
    assert result["ungater"].examples[0]["pod_set"] == "workers"


# -- the owner's own size, from its raw object ----------------------------------------------


def test_a_jobs_size_is_what_its_controller_keeps_active() -> None:
    def size(spec: dict[str, Any], status: dict[str, Any] | None = None) -> int:
        return dict(job_sizes({"spec": spec, "status": status or {}}))["main"]

    assert size({"parallelism": 4, "completions": 10}) == 4
    assert size({"parallelism": 4, "completions": 10}, {"succeeded": 8}) == 2
    assert size({"parallelism": 4}) == 4  # no completions: parallelism alone
    assert size({}) == 1  # the API server's default parallelism
    assert size({"parallelism": 4, "suspend": True}) == 0


def test_a_rayclusters_size_is_the_head_and_each_group_as_kuberay_keeps_them() -> None:
    group = {"groupName": "Workers", "replicas": 3, "minReplicas": 0, "maxReplicas": 10}
    spec: dict[str, Any] = {"workerGroupSpecs": [group | {"numOfHosts": 2}]}
    assert dict(raycluster_sizes({"spec": spec})) == {"head": 1, "workers": 6}
    clamped = {"workerGroupSpecs": [group | {"replicas": 20}, group | {"groupName": "b"}]}
    assert dict(raycluster_sizes({"spec": clamped})) == {"head": 1, "workers": 10, "b": 3}
    assert dict(raycluster_sizes({"spec": spec | {"suspend": True}})) == {"head": 0, "workers": 0}


# -- the timeline records the owners beside the pods and slices -----------------------------


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_the_timeline_feeds_the_judge_the_owners_size_in_resource_version_order() -> None:
    """A Job of 4 under a slice of 4 shrinks to 2, then three pods lose ungater's gate: the
    timeline's own events (pods, Workloads, the Job) make the third past the cap."""
    fake, ns = FakeKube(), "ns"
    rayclusters = Resource("ray.io", "v1", "rayclusters", "RayCluster")
    tl = Timeline(fake, ns, (JOBS, rayclusters))
    meta = {"name": "j", "namespace": ns}
    created = fake.put(JOBS, {"metadata": meta, "spec": {"parallelism": 4, "completions": 4}})
    uid = created["metadata"]["uid"]
    owner_ref = {"controller": True, "uid": uid, "kind": "Job", "name": "j"}
    status = {
        "conditions": [{"type": "Admitted", "status": "True"}],
        "admission": {"podSetAssignments": [{"name": "main", "count": 4}]},
    }
    wl_meta = {"name": "w", "namespace": ns, "ownerReferences": [owner_ref]}
    fake.put(WORKLOADS, {"metadata": wl_meta, "spec": {"podSets": [{"name": "main", "count": 4}]}})
    fake.put(
        WORKLOADS,
        {
            "metadata": wl_meta,
            "spec": {"podSets": [{"name": "main", "count": 4}]},
            "status": status,
        },
    )

    def pod_obj(i: int, gates: list[str]) -> dict[str, Any]:
        labels = {"batch.kubernetes.io/controller-uid": uid}
        return {
            "metadata": {"name": f"p{i}", "namespace": ns, "labels": labels},
            "spec": {"schedulingGates": [{"name": g} for g in gates]},
            "status": {"phase": "Pending"},
        }

    async with anyio.create_task_group() as tg:
        tg.start_soon(tl.run)
        with anyio.fail_after(5):
            await tl.synced.wait()
        for i in range(4):
            fake.put(PODS, pod_obj(i, [K, U]))
        fake.put(JOBS, {"metadata": meta, "spec": {"parallelism": 2, "completions": 4}})
        for i in range(3):
            fake.put(PODS, pod_obj(i, [K]))
        rv = fake.rv

        def all_seen() -> bool:
            return max((e.rv for e in tl.events), default=0) >= rv

        assert await tl.until(all_seen, 5, "every event")
        tg.cancel_scope.cancel()
    owner_events = [e for e in tl.events if isinstance(e, OwnerEvent)]
    assert [dict(e.sizes) for e in owner_events] == [{"main": 4}, {"main": 2}]
    slices = [e for e in tl.events if isinstance(e, SliceEvent)]
    assert slices[-1].admitted and slices[-1].spec == (("main", 4),)
    assert tl.gaps == []
    result = judge(tl.events)
    assert {label: oc.count for label, oc in result.items()} == {"kueue": 0, "ungater": 1}
    assert result["ungater"].examples[0]["owner_size"] == 2


@pytest.mark.parametrize(
    ("reason", "active"), [("WorkloadSliceReplaced", True), ("JobFinished", False)]
)
def test_a_slice_finished_but_by_a_replacement_no_longer_admits(reason: str, active: bool) -> None:
    tl = Timeline(FakeKube(), "ns")
    conds = [
        {"type": "Admitted", "status": "True"},
        {"type": "Finished", "status": "True", "reason": reason},
    ]
    wl = {
        "metadata": {"name": "w", "resourceVersion": "7"},
        "spec": {"podSets": [{"name": "main", "count": 3}]},
        "status": {"conditions": conds, "admission": {"podSetAssignments": [{"name": "main"}]}},
    }
    tl._slice("MODIFIED", wl, 0.0)
    (event,) = tl.events
    assert isinstance(event, SliceEvent)
    assert event.admitted is active
    assert event.counts == (("main", 3),)  # no count in the assignment: the spec's


# -- the judge counts what it judged, refuses a history with gaps, and orders as the product --


def test_the_judge_counts_the_releases_it_judged() -> None:
    events: list[Event] = [job(0, 3), admitted(1, "s1", 2), pod(2, "a", BOTH), pod(3, "b", BOTH)]
    events += [pod(4, "a", frozenset({U})), pod(5, "b", frozenset({U})), pod(6, "c", NONE)]
    found = judge(events)
    assert {label: (oc.count, oc.judged) for label, oc in found.items()} == {
        "kueue": (1, 3),  # a, b and c (first seen without it): the third past the cap of 2
        "ungater": (0, 1),  # c alone: 1 live released of 2
    }
    assert found["kueue"].summary()["judged"] == 3


def test_a_history_with_a_gap_is_not_judged() -> None:
    """The over-release is in the events, but a watch missed some: no count, not even 1."""
    events: list[Event] = [job(0, 2), admitted(1, "s1", 1), pod(2, "a", NONE), pod(3, "b", NONE)]
    assert counts(events) == {"kueue": 1, "ungater": 1}
    gap = Gap("pods", 3, 9, "relisted after 410 Gone")
    found = releases_past_cap(events, GATES, [gap])
    for oc in found.values():
        assert oc.summary() == {"count": None, "judged": 0, "gaps": [gap.line()]}


def test_the_active_slice_is_the_products_even_when_the_old_one_was_written_last() -> None:
    """Slice ``b`` replaces ``a`` in the same second; ``a`` is written after ``b`` (Kueue
    finishing it), so in resourceVersion order ``a`` is met last. The old judge took the slice
    first seen last, ``a`` (cap 2), and counted the third and fourth releases past the cap."""
    same = "2026-01-01T00:00:05Z"
    b = SliceEvent(
        20, "b", "o", True, (("main", 4),), False, (("main", 4),), "uid-b", same, "ns/b", "ns/a"
    )
    a = SliceEvent(30, "a", "o", True, (("main", 2),), False, (("main", 2),), "uid-c", same, "ns/a")
    events: list[Event] = [job(0, 4), b, a]
    events += [pod(40 + i, f"p{i}", frozenset({K})) for i in range(4)]  # ungater's gate off
    assert counts(events) == {"kueue": 0, "ungater": 0}


@pytest.mark.anyio
async def test_the_timeline_records_a_gap_when_it_runs_out_of_watch_rounds() -> None:
    """Every watch ends at once: the timeline spends its rounds and stops. The old one stopped
    quietly with ``gaps`` at 0."""
    fake = FakeKube()

    class Ending:
        async def list_objects(self, *a: Any) -> Any:
            return await fake.list_objects(*a)

        def watch(self, *a: Any) -> Any:
            return self._none()

        async def _none(self) -> Any:
            return
            yield

    tl = Timeline(Ending(), "ns")  # type: ignore[arg-type]
    tl.settings = WatchSettings(rounds=3, retry_seconds=0.0)
    with anyio.fail_after(5):
        await tl.run()
    assert sorted(g.resource for g in tl.gaps) == ["pods", "workloads"]
    assert all("ran out of its 3 watch rounds" in g.why for g in tl.gaps)
    assert releases_past_cap(tl.events, GATES, tl.gaps)["ungater"].summary()["count"] is None


@pytest.mark.anyio
async def test_an_over_release_hidden_in_a_410_leaves_no_result() -> None:
    """A Job of 2 under a slice admitting 1: pod 0 released and seen; the pod watch held while
    pod 1 is released and deleted; the watch expires. Judged without its gap the history shows
    nothing past the cap (the release is in neither the watch nor the relist); with it, there
    is no result, never a count of 0."""
    fake, ns = FakeKube(), "ns"
    tl = Timeline(fake, ns, (JOBS,))
    meta = {"name": "j", "namespace": ns}
    uid = fake.put(JOBS, {"metadata": meta, "spec": {"parallelism": 2, "completions": 2}})[
        "metadata"
    ]["uid"]
    ref = {"controller": True, "uid": uid, "kind": "Job", "name": "j"}
    fake.put(
        WORKLOADS,
        {
            "metadata": {"name": "w", "namespace": ns, "ownerReferences": [ref]},
            "spec": {"podSets": [{"name": "main", "count": 2}]},
            "status": {
                "conditions": [{"type": "Admitted", "status": "True"}],
                "admission": {"podSetAssignments": [{"name": "main", "count": 1}]},
            },
        },
    )

    def pod_obj(i: int, gates: list[str]) -> dict[str, Any]:
        labels = {"batch.kubernetes.io/controller-uid": uid}
        return {
            "metadata": {"name": f"p{i}", "namespace": ns, "labels": labels},
            "spec": {"schedulingGates": [{"name": g} for g in gates]},
            "status": {"phase": "Pending"},
        }

    for i in (0, 1):
        fake.put(PODS, pod_obj(i, [U]))
    async with anyio.create_task_group() as tg:
        tg.start_soon(tl.run)
        with anyio.fail_after(5):
            await tl.synced.wait()
        fake.put(PODS, pod_obj(0, []))
        assert await tl.until(lambda: any(not p.gated(U) for p in tl.pods.values()), 5, "p0")
        fake.lag_watches("pods", open_only=True)
        fake.put(PODS, pod_obj(1, []))  # 2 live released for a cap of 1
        fake.delete(PODS, ns, "p1")
        lists = fake.lists
        assert fake.expire_watches("pods") == 1
        assert await tl.until(lambda: fake.lists > lists, 5, "the relist")
        tg.cancel_scope.cancel()
    (gap,) = tl.gaps
    assert gap.resource == "pods" and "410" in gap.why, gap
    assert gap.until_rv is not None, "relisted"
    assert releases_past_cap(tl.events, GATES)["ungater"].count == 0, "hidden, as told"
    assert releases_past_cap(tl.events, GATES, tl.gaps)["ungater"].summary()["count"] is None
