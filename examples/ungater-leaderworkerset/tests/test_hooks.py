"""Tests of the LeaderWorkerSet plugin: each hook on pods shaped as the LWS controller makes
them, the ownership proof through both StatefulSets, and whole decisions through the core.

The builders below write the objects the LWS controller and its pod webhook produce (v0.10):
the leader StatefulSet is named after the LWS and owned by it; leader pods are ``<lws>-<group>``;
each group's worker StatefulSet is named after its leader pod and owned by that pod, and its
pods are ``<leader>-<1..size-1>``.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.metadata
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from ungater.plugin_api import KindSpec, ReleaseGroup
from ungater.testing import (
    GATE,
    Outcome,
    PluginUnderTest,
    new_uid,
    owner_ref,
    pod_view,
    ref_of,
    slice_workload,
)

import ungater_leaderworkerset as lws_plugin

Obj = dict[str, Any]
NS = "serving"
LWS_KIND = ("leaderworkerset.x-k8s.io", "LeaderWorkerSet")
P = "leaderworkerset.sigs.k8s.io/"


# -- builders --------------------------------------------------------------------------------


def _ts(seconds: int) -> str:
    return f"2026-03-02T10:{seconds // 60:02d}:{seconds % 60:02d}Z"


def lws(name: str = "vllm", *, size: int = 4, replicas: int = 2, exclusive: bool = False) -> Obj:
    annotations = {P + "exclusive-topology": "cloud.google.com/gke-nodepool"} if exclusive else {}
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": new_uid("lws", name),
            "creationTimestamp": _ts(0),
            "labels": {"kueue.x-k8s.io/queue-name": "serving"},
            "annotations": annotations,
        },
        "spec": {
            "replicas": replicas,
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {"size": size, "restartPolicy": "RecreateGroupOnPodRestart"},
        },
    }


def _revision(owner: Mapping[str, Any]) -> str:
    return hashlib.sha1(owner["metadata"]["uid"].encode()).hexdigest()[:10]


def leader_sts(owner: Mapping[str, Any]) -> Obj:
    name = owner["metadata"]["name"]
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": new_uid("sts", name),
            "labels": {P + "name": name, P + "template-revision-hash": _revision(owner)},
            "annotations": {P + "replicas": str(owner["spec"]["replicas"])},
            "ownerReferences": [owner_ref(owner)],
        },
    }


def _kueue(labels: dict[str, str], annotations: dict[str, str], pod_set: str | None) -> None:
    if pod_set is not None:
        labels["kueue.x-k8s.io/podset"] = pod_set
        annotations["kueue.x-k8s.io/role-hash"] = pod_set


def _pod(
    name: str,
    owner: Obj,
    labels: dict[str, str],
    annotations: dict[str, str],
    index: int,
    created: int,
    gated: bool,
) -> Obj:
    labels |= {
        "apps.kubernetes.io/pod-index": str(index),
        "statefulset.kubernetes.io/pod-name": name,
        "controller-revision-hash": f"{owner['metadata']['name']}-5d8f7c9b4",
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": new_uid("pod", name, str(created)),
            "creationTimestamp": _ts(created),
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [owner_ref(owner)],
        },
        "spec": {
            "containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.9.0"}],
            "schedulingGates": [{"name": GATE}] if gated else [],
            "hostname": name,
            "subdomain": owner["metadata"]["name"],
        },
        "status": {"phase": "Pending"} if gated else {"phase": "Running"},
    }


def leader_pod(
    owner: Obj,
    sts: Obj,
    group: int,
    *,
    pod_set: str | None = "leader",
    created: int = 1,
    gated: bool = True,
) -> Obj:
    name = f"{owner['metadata']['name']}-{group}"
    labels = {
        P + "name": owner["metadata"]["name"],
        P + "worker-index": "0",
        P + "template-revision-hash": _revision(owner),
        # added by the LWS pod webhook
        P + "group-index": str(group),
        P + "group-key": hashlib.sha1(f"{NS}/{name}".encode()).hexdigest(),
    }
    annotations = {P + "size": str(owner["spec"]["leaderWorkerTemplate"]["size"])}
    annotations |= {k: v for k, v in owner["metadata"]["annotations"].items() if k.startswith(P)}
    _kueue(labels, annotations, pod_set)
    return _pod(name, sts, labels, annotations, group, created, gated)


def worker_sts(owner: Obj, leader: Obj) -> Obj:
    name = leader["metadata"]["name"]
    labels = {
        k: leader["metadata"]["labels"][k]
        for k in (P + "name", P + "group-index", P + "group-key", P + "template-revision-hash")
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": new_uid("sts", name),
            "labels": labels,
            "ownerReferences": [owner_ref(leader)],
        },
        "spec": {
            "replicas": owner["spec"]["leaderWorkerTemplate"]["size"] - 1,
            "ordinals": {"start": 1},
        },
    }


def worker_pod(
    owner: Obj,
    sts: Obj,
    worker: int,
    *,
    pod_set: str | None = "worker",
    created: int = 2,
    gated: bool = True,
) -> Obj:
    leader_name = sts["metadata"]["name"]
    labels = dict(sts["metadata"]["labels"])
    labels[P + "worker-index"] = str(worker)  # added by the LWS pod webhook
    annotations = {
        P + "size": str(owner["spec"]["leaderWorkerTemplate"]["size"]),
        P + "leader-name": leader_name,
    }
    annotations |= {k: v for k, v in owner["metadata"]["annotations"].items() if k.startswith(P)}
    _kueue(labels, annotations, pod_set)
    return _pod(f"{leader_name}-{worker}", sts, labels, annotations, worker, created, gated)


def group(
    owner: Obj,
    top: Obj,
    index: int,
    *,
    shared: bool = False,
    created: int = 1,
    workers: int | None = None,
) -> tuple[list[Obj], list[Obj]]:
    """One group's pods, leader first, and the intermediates the core would cache for it."""
    leader_set, worker_set = ("main", "main") if shared else ("leader", "worker")
    leader = leader_pod(owner, top, index, pod_set=leader_set, created=created)
    wsts = worker_sts(owner, leader)
    count = owner["spec"]["leaderWorkerTemplate"]["size"] - 1 if workers is None else workers
    pods = [leader] + [
        worker_pod(owner, wsts, w, pod_set=worker_set, created=created + 1)
        for w in range(1, count + 1)
    ]
    return pods, [leader, wsts]


def plugin() -> PluginUnderTest:
    """The plugin as `ungater run` loads it, through the public test kit."""
    return PluginUnderTest.from_module(lws_plugin, LWS_KIND, "leaderworkerset")


def run(
    owner: Obj,
    pods: list[Obj],
    intermediates: list[Obj],
    pod_sets: dict[str, int],
    admitted: dict[str, int],
) -> Outcome:
    """Decide with one admitted Workload slice whose controller is the LWS."""
    wl = slice_workload(owner, pod_sets, admitted)
    return plugin().decide(owner, pods, [wl], intermediates)


def names(pods: list[Obj]) -> list[str]:
    return [p["metadata"]["name"] for p in pods]


# -- ungater_kinds / ungater_pod_selector -----------------------------------------------------


def test_kinds_declares_lws_with_both_intermediates() -> None:
    [spec] = lws_plugin.ungater_kinds()
    assert isinstance(spec, KindSpec)
    assert (spec.group, spec.kind, spec.pod_label) == (
        "leaderworkerset.x-k8s.io",
        "LeaderWorkerSet",
        P + "name",
    )
    assert {(r.group, r.kind) for r in spec.intermediates} == {("apps", "StatefulSet"), ("", "Pod")}


def test_intermediate_selectors_match_what_the_chains_pass_through() -> None:
    owner = lws()
    top = leader_sts(owner)
    (leader, *_), (_, wsts) = group(owner, top, 0)
    sts_spec, pod_spec = lws_plugin.INTERMEDIATES
    assert sts_spec.label_selector in top["metadata"]["labels"]
    assert sts_spec.label_selector in wsts["metadata"]["labels"]
    key, _, value = pod_spec.label_selector.partition(",")[2].partition("=")
    assert pod_spec.label_selector.split(",")[0] in leader["metadata"]["labels"]
    assert leader["metadata"]["labels"][key] == value


def test_selector_is_the_lws_name() -> None:
    owner = lws()
    assert plugin().pod_selector(owner) == {P + "name": "vllm"}


# -- ungater_owns_pod ------------------------------------------------------------------------


def test_leader_and_workers_are_proven_through_their_chains() -> None:
    owner = lws()
    top = leader_sts(owner)
    pods, mids = group(owner, top, 0)
    assert plugin().ownership(owner, pods, [top, *mids]) == ["proven"] * 4


def test_foreign_pod_with_copied_labels_is_not_owned() -> None:
    owner = lws()
    top = leader_sts(owner)
    pods, mids = group(owner, top, 0)
    impostor = copy.deepcopy(pods[1])
    impostor["metadata"] |= {"name": "impostor", "uid": new_uid("impostor")}
    del impostor["metadata"]["ownerReferences"]
    assert plugin().ownership(owner, [impostor], [top, *mids]) == ["foreign"]
    assert lws_plugin.ungater_owns_pod(ref_of(owner), pod_view(impostor), []) is False


def test_pods_of_another_lws_are_not_owned() -> None:
    owner, other = lws(), lws("other")
    other_top = leader_sts(other)
    pods, mids = group(other, other_top, 0)
    for p in pods:
        p["metadata"]["labels"][P + "name"] = "vllm"  # relabelled to look like ours
    assert set(plugin().ownership(owner, pods, [other_top, *mids])) == {"foreign"}


def test_worker_claiming_another_group_is_not_owned() -> None:
    owner = lws()
    top = leader_sts(owner)
    pods, mids = group(owner, top, 0)
    liar = copy.deepcopy(pods[1])
    liar["metadata"]["annotations"][P + "leader-name"] = "vllm-1"
    assert plugin().ownership(owner, [liar], [top, *mids]) == ["foreign"]


def test_worker_whose_leader_is_not_cached_is_unresolved() -> None:
    owner = lws()
    top = leader_sts(owner)
    pods, (_, wsts) = group(owner, top, 0)
    # the leader pod is missing from the cache
    assert plugin().ownership(owner, [pods[1]], [top, wsts]) == ["unresolved"]


# -- ungater_pod_set / ungater_sort_key ------------------------------------------------------


def test_pod_set_prefers_kueue_stamps_then_the_role() -> None:
    owner = lws()
    top = leader_sts(owner)
    h = plugin()
    assert h.pod_set(owner, leader_pod(owner, top, 0, pod_set="main")) == "main"
    unstamped = leader_pod(owner, top, 1, pod_set=None)
    assert h.pod_set(owner, unstamped) == "leader"
    wsts = worker_sts(owner, unstamped)
    assert h.pod_set(owner, worker_pod(owner, wsts, 1, pod_set=None)) == "worker"
    role_only = worker_pod(owner, wsts, 2, pod_set=None)
    role_only["metadata"]["annotations"]["kueue.x-k8s.io/role-hash"] = "main"
    assert h.pod_set(owner, role_only) == "main"


def test_sort_key_is_group_then_worker_index() -> None:
    owner = lws(size=12, replicas=11)
    top = leader_sts(owner)
    h = plugin()
    keys = []
    for g in (0, 2, 10):
        pods, _ = group(owner, top, g)
        keys += [h.sort_key(owner, p) for p in pods]
    assert keys == sorted(keys)
    assert keys[0] == (0, 0, 0, 0)


# -- ungater_release_group -------------------------------------------------------------------


def test_shared_pod_set_makes_the_whole_group_one_release_group() -> None:
    owner = lws(size=4)
    pods, _ = group(owner, leader_sts(owner), 0, shared=True)
    groups = {plugin().release_group(owner, p) for p in pods}
    assert groups == {ReleaseGroup(key="vllm-0", size=4)}


def test_separate_leader_pod_set_groups_the_workers() -> None:
    owner = lws(size=4)
    pods, _ = group(owner, leader_sts(owner), 1)
    got = [plugin().release_group(owner, p) for p in pods]
    assert got == [None] + [ReleaseGroup(key="vllm-1", size=3)] * 3


def test_exclusive_placement_lets_the_leader_go_first() -> None:
    owner = lws(size=3, exclusive=True)
    pods, _ = group(owner, leader_sts(owner), 0, shared=True)
    got = [plugin().release_group(owner, p) for p in pods]
    assert got == [None, ReleaseGroup(key="vllm-0", size=2), ReleaseGroup(key="vllm-0", size=2)]


@given(st.text(max_size=12))
def test_odd_size_annotations_never_raise(value: str) -> None:
    owner = lws()
    raw = leader_pod(owner, leader_sts(owner), 0, pod_set="main")
    raw["metadata"]["annotations"][P + "size"] = value
    group_ = lws_plugin.ungater_release_group(pod_view(raw))
    assert group_ is not None and group_.key == "vllm-0"


# -- whole decisions -------------------------------------------------------------------------


def test_cap_six_with_groups_of_four_releases_one_whole_group() -> None:
    owner = lws(size=4, replicas=3)
    top = leader_sts(owner)
    pods: list[Obj] = []
    mids: list[Obj] = [top]
    for g in (2, 0, 1):  # created out of order
        p, m = group(owner, top, g, shared=True, created=10 - g)
        pods += p
        mids += m
    outcome = run(owner, pods, mids, {"main": 12}, {"main": 6})
    assert outcome.released == ["vllm-0", "vllm-0-1", "vllm-0-2", "vllm-0-3"]
    assert len(outcome.waiting) == 8
    assert outcome.caps == {"main": 6}


def test_incomplete_group_waits_for_its_last_worker() -> None:
    owner = lws(size=4, replicas=2)
    top = leader_sts(owner)
    first, m0 = group(owner, top, 0, shared=True)
    second, m1 = group(owner, top, 1, shared=True, workers=2)  # StatefulSet still creating
    outcome = run(owner, first + second, [top, *m0, *m1], {"main": 8}, {"main": 8})
    assert outcome.released == names(first)
    assert set(outcome.waiting.values()) == {"release group vllm-1 incomplete (3 of 4 pods)"}
    assert "vllm-1: waits: release group vllm-1 incomplete" in outcome.text()


def test_separate_pod_sets_release_leaders_and_whole_worker_groups() -> None:
    owner = lws(size=3, replicas=3)
    top = leader_sts(owner)
    pods: list[Obj] = []
    mids: list[Obj] = [top]
    for g in range(3):
        p, m = group(owner, top, g)
        pods += p
        mids += m
    outcome = run(owner, pods, mids, {"leader": 3, "worker": 6}, {"leader": 2, "worker": 5})
    assert sorted(outcome.released) == sorted(
        ["vllm-0", "vllm-1", "vllm-0-1", "vllm-0-2", "vllm-1-1", "vllm-1-2"]
    )


# -- discovery -------------------------------------------------------------------------------


def test_discovered_through_the_entry_point_when_installed() -> None:
    found = [
        e
        for e in importlib.metadata.entry_points(group="ungater.plugins")
        if e.name == "leaderworkerset"
    ]
    if not found:
        pytest.skip("ungater-leaderworkerset is not installed (pip install this directory)")
    installed = PluginUnderTest.installed("leaderworkerset", LWS_KIND)
    assert installed.distribution == "ungater-leaderworkerset"
    assert (installed.spec.group, installed.spec.kind) == LWS_KIND
