"""Admission checks' pod set updates: merged, fitted to pods, carried by the decision, and
applied in the same JSON patch as the gate removal."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fakekube import apply_json_patch
from tests.unit.builders import GATE, facts, pod, workload
from ungater._decide.decision import decide
from ungater._decide.patches import release_patch
from ungater._decide.podsetupdates import PodChanges, fit_to_pod, merge_updates
from ungater._model.views import PodSetUpdate, parse_pod, parse_workload

PROVREQ = {
    "autoscaling.x-k8s.io/consume-provisioning-request": "prov-req-1",
    "autoscaling.x-k8s.io/provisioning-class-name": "check-capacity.autoscaling.x-k8s.io",
}
TOL = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def with_checks(wl: dict[str, Any], *checks: tuple[str, list[dict[str, Any]]]) -> dict[str, Any]:
    wl["status"]["admissionChecks"] = [
        {
            "name": name,
            "state": "Ready",
            "message": "",
            "lastTransitionTime": "2025-01-01T00:00:00Z",
            "podSetUpdates": updates,
        }
        for name, updates in checks
    ]
    return wl


def provreq_check(pod_set: str = "main", **extra: Any) -> tuple[str, list[dict[str, Any]]]:
    update = {
        "name": pod_set,
        "annotations": dict(PROVREQ),
        "nodeSelector": {"cloud.google.com/gke-nodepool": "pool-a"},
        **extra,
    }
    return ("prov-check", [update])


def test_parse_reads_updates_of_every_check() -> None:
    wl = parse_workload(
        with_checks(
            workload(), provreq_check(), ("other", [{"name": "main", "labels": {"a": "b"}}])
        )
    )
    assert [(u.check, u.pod_set) for u in wl.pod_set_updates] == [
        ("prov-check", "main"),
        ("other", "main"),
    ]
    assert wl.pod_set_updates[0].node_selector == {"cloud.google.com/gke-nodepool": "pool-a"}


def test_merge_combines_checks_and_dedups_tolerations() -> None:
    updates = [
        PodSetUpdate("a", "main", labels={"x": "1"}, tolerations=(TOL,)),
        PodSetUpdate("b", "main", labels={"y": "2"}, annotations={"z": "3"}, tolerations=(TOL,)),
        PodSetUpdate("c", "other", labels={"x": "99"}),
    ]
    merged, conflict = merge_updates(updates, "main")
    assert conflict == ""
    assert merged == PodChanges(
        labels={"x": "1", "y": "2"}, annotations={"z": "3"}, tolerations=(TOL,)
    )


@pytest.mark.parametrize("attr", ["labels", "annotations", "node_selector"])
def test_checks_disagreeing_on_a_key_is_a_conflict(attr: str) -> None:
    updates = [
        PodSetUpdate("a", "main", **{attr: {"k": "1"}}),
        PodSetUpdate("b", "main", **{attr: {"k": "2"}}),
    ]
    merged, conflict = merge_updates(updates, "main")
    assert not merged
    assert "disagree" in conflict and "'k'" in conflict and "a wants" in conflict


def test_fit_applies_only_what_the_pod_lacks() -> None:
    p = parse_pod(pod("p", labels={"x": "1"}))
    wanted = PodChanges(
        labels={"x": "1", "y": "2"}, node_selector={"pool": "a"}, tolerations=(TOL,)
    )
    fitted, conflict = fit_to_pod(wanted, p)
    assert conflict == ""
    assert fitted == PodChanges(labels={"y": "2"}, node_selector={"pool": "a"}, tolerations=(TOL,))


def test_fit_refuses_to_change_a_node_selector_entry() -> None:
    raw = pod("p")
    raw["spec"]["nodeSelector"] = {"pool": "b"}
    fitted, conflict = fit_to_pod(PodChanges(node_selector={"pool": "a"}), parse_pod(raw))
    assert not fitted
    assert conflict == (
        "node selector 'pool' is 'b' on the pod, the admission wants 'a' "
        "(a node selector entry cannot change)"
    )


def test_fit_accepts_an_equal_node_selector_entry_and_changes_labels() -> None:
    raw = pod("p", labels={"tier": "old"})
    raw["spec"]["nodeSelector"] = {"pool": "a"}
    fitted, conflict = fit_to_pod(
        PodChanges(labels={"tier": "new"}, node_selector={"pool": "a"}), parse_pod(raw)
    )
    assert conflict == "" and fitted == PodChanges(labels={"tier": "new"})


def _slice(*checks: tuple[str, list[dict[str, Any]]], count: int = 4, admitted: int = 2) -> Any:
    return parse_workload(
        with_checks(workload(pod_sets={"main": count}, admitted={"main": admitted}), *checks)
    )


def test_released_pods_carry_the_updates_and_a_conflicting_pod_waits_alone() -> None:
    bad = pod("p0", created=1)
    bad["spec"]["nodeSelector"] = {"cloud.google.com/gke-nodepool": "pool-z"}
    from ungater._decide.decision import PodFacts

    conflicting = PodFacts(parse_pod(bad), "main", (0,))
    others = [facts(f"p{i}", sort_key=(i,), created=i) for i in (1, 2, 3)]
    d = decide([_slice(provreq_check())], [conflicting, *others], GATE)
    assert d.released_names == ["p1", "p2"]  # the cap still fills, in order, past the conflict
    assert all(r.changes.annotations == PROVREQ for r in d.releases)
    assert all(
        r.changes.node_selector == {"cloud.google.com/gke-nodepool": "pool-a"} for r in d.releases
    )
    (report,) = d.pod_sets
    reasons = {w.pod: w.reason for w in report.waiting}
    assert "cannot change" in reasons["p0"] and reasons["p0"].startswith("pod set update conflict")


def test_checks_that_disagree_hold_the_whole_pod_set() -> None:
    a = ("a", [{"name": "main", "labels": {"k": "1"}}])
    b = ("b", [{"name": "main", "labels": {"k": "2"}}])
    d = decide([_slice(a, b)], [facts(f"p{i}", sort_key=(i,)) for i in range(3)], GATE)
    assert d.releases == ()
    assert all("disagree" in w.reason for w in d.pod_sets[0].waiting)


def test_switched_off_releases_without_changes() -> None:
    d = decide([_slice(provreq_check())], [facts("p0")], GATE, apply_pod_set_updates=False)
    assert d.released_names == ["p0"] and not d.releases[0].changes


def test_patch_applies_gate_removal_and_updates_together() -> None:
    raw = pod("p0", labels={"keep": "me"})
    raw["spec"]["schedulingGates"] = [{"name": "example.com/other"}, {"name": GATE}]
    raw["spec"]["tolerations"] = [{"key": "old", "operator": "Exists"}]
    d = decide(
        [_slice(provreq_check(tolerations=[TOL], labels={"a/b": "c"}))], [facts("x")], GATE
    )  # to get the merged changes shape
    changes, _ = fit_to_pod(d.releases[0].changes, parse_pod(raw))
    from ungater._decide.decision import Release

    patched = apply_json_patch(
        raw, release_patch(Release(parse_pod(raw), "main", GATE, 1, changes))
    )
    assert [g["name"] for g in patched["spec"]["schedulingGates"]] == ["example.com/other"]
    assert (
        patched["metadata"]["annotations"]["autoscaling.x-k8s.io/consume-provisioning-request"]
        == "prov-req-1"
    )
    assert patched["metadata"]["labels"] == {**raw["metadata"]["labels"], "a/b": "c"}
    assert patched["spec"]["nodeSelector"] == {"cloud.google.com/gke-nodepool": "pool-a"}
    assert patched["spec"]["tolerations"] == [{"key": "old", "operator": "Exists"}, TOL]


keys = st.sampled_from(["a", "b", "c", "x/y", "n~1"])
vals = st.sampled_from(["1", "2"])
maps = st.dictionaries(keys, vals, max_size=3)
tols = st.lists(
    st.sampled_from([TOL, {"key": "t2", "operator": "Exists"}]),
    max_size=2,
    unique_by=lambda t: t["key"],
)


@settings(max_examples=300, deadline=None)
@given(
    checks=st.lists(st.tuples(maps, maps, maps, tols), min_size=0, max_size=3),
    pod_labels=maps,
    pod_annotations=maps,
    pod_selector=maps,
    pod_tols=tols,
)
def test_property_released_pod_has_every_update_and_conflicts_never_release(
    checks: list[Any],
    pod_labels: dict[str, str],
    pod_annotations: dict[str, str],
    pod_selector: dict[str, str],
    pod_tols: list[dict[str, Any]],
) -> None:
    raw = pod("p0", labels=pod_labels)
    raw["metadata"]["annotations"] = dict(pod_annotations)
    if pod_selector:
        raw["spec"]["nodeSelector"] = dict(pod_selector)
    if pod_tols:
        raw["spec"]["tolerations"] = copy.deepcopy(pod_tols)
    updates = [
        (
            f"c{i}",
            [
                {
                    "name": "main",
                    "labels": lab,
                    "annotations": a,
                    "nodeSelector": n,
                    "tolerations": t,
                }
            ],
        )
        for i, (lab, a, n, t) in enumerate(checks)
    ]
    wl = _slice(*updates, count=1, admitted=1)
    from ungater._decide.decision import PodFacts

    d = decide([wl], [PodFacts(parse_pod(raw), "main")], GATE)
    merged, set_conflict = merge_updates(wl.pod_set_updates, "main")
    pod_conflict = any(
        k in pod_selector and pod_selector[k] != v for k, v in merged.node_selector.items()
    )
    if set_conflict or pod_conflict:
        assert d.releases == ()
        return
    (rel,) = d.releases
    patched = apply_json_patch(raw, release_patch(rel))
    assert GATE not in [g["name"] for g in patched["spec"]["schedulingGates"]]
    for k, v in merged.labels.items():
        assert patched["metadata"]["labels"][k] == v
    for k, v in merged.annotations.items():
        assert patched["metadata"]["annotations"][k] == v
    for k, v in merged.node_selector.items():
        assert patched["spec"]["nodeSelector"][k] == v
    for k, v in pod_selector.items():  # nothing the pod had is changed or removed
        assert patched["spec"]["nodeSelector"][k] == v
    for t in merged.tolerations:
        assert t in patched["spec"]["tolerations"]
    assert patched["spec"].get("tolerations", [])[: len(pod_tols)] == pod_tols
