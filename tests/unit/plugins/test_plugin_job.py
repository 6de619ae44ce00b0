"""The batch/v1 Job plugin: each hook, the ownership proof, and whole decisions through the core."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from ungater_plugins import job as job_plugin

from tests.unit.podfactory import (
    GATE,
    TAS_GATE,
    facts,
    job,
    job_pod,
    names,
    release,
    reown,
    strip_owner,
    workload,
)
from ungater._decide.decision import Ownership, decide
from ungater._model.views import Kind, ObjectRef, WorkloadView, parse_pod, parse_workload
from ungater._plugins.registry import KindHandler, PluginRegistry
from ungater.plugin_api import KindSpec, ResourceSpec
from ungater.testing import ref_of

JOB = Kind("batch", "Job")


def handler() -> KindHandler:
    registry = PluginRegistry.from_modules({"job": job_plugin})
    assert registry.failures == []
    return registry.handler(JOB)


# -- ungater_kinds / ungater_pod_selector -----------------------------------------------------


def test_kinds_declares_job_by_controller_uid_label() -> None:
    assert job_plugin.ungater_kinds() == [
        KindSpec(
            group="batch",
            kind="Job",
            pod_label="batch.kubernetes.io/controller-uid",
            owner_resource=ResourceSpec(group="batch", version="v1", kind="Job", plural="jobs"),
        )
    ]
    assert PluginRegistry.from_modules({"job": job_plugin}).all_kinds() == [JOB]


def test_selector_is_the_job_uid_and_matches_the_pods_it_creates() -> None:
    j = job("train")
    selector = handler().pod_selector(ref_of(j))
    assert selector == {"batch.kubernetes.io/controller-uid": j["metadata"]["uid"]}
    pod = parse_pod(job_pod(j, index=0))
    assert all(pod.labels.get(k) == v for k, v in selector.items())


# -- ungater_owns_pod ------------------------------------------------------------------------


def test_owns_a_pod_whose_controller_is_the_job() -> None:
    j = job("train")
    pod = parse_pod(job_pod(j, index=0))
    assert pod.controller is not None
    assert job_plugin.ungater_owns_pod(ref_of(j), [pod.controller]) is True
    [f] = facts(handler(), j, [job_pod(j, index=0)])
    assert f.ownership is Ownership.PROVEN


def test_foreign_pod_with_copied_labels_is_not_owned() -> None:
    j = job("train")
    impostor = strip_owner(job_pod(j, index=0))
    assert parse_pod(impostor).labels["batch.kubernetes.io/controller-uid"] == j["metadata"]["uid"]
    assert job_plugin.ungater_owns_pod(ref_of(j), []) is False
    [f] = facts(handler(), j, [impostor])
    assert f.ownership is Ownership.FOREIGN


def test_pod_owned_by_another_job_is_not_owned() -> None:
    j, other = job("train"), job("other")
    pod = reown(job_pod(j, index=0), other)
    assert job_plugin.ungater_owns_pod(ref_of(j), [ref_of(other)]) is False
    [f] = facts(handler(), j, [pod])
    assert f.ownership is Ownership.FOREIGN


def test_chain_of_wrong_shape_is_refused() -> None:
    j = job("train")
    same_uid_other_kind = ObjectRef(
        "jobset.x-k8s.io/v1alpha2", "JobSet", "train", j["metadata"]["uid"]
    )
    assert job_plugin.ungater_owns_pod(ref_of(j), [same_uid_other_kind]) is False
    assert job_plugin.ungater_owns_pod(ref_of(j), [ref_of(job("mid")), ref_of(j)]) is False


# -- ungater_pod_set -------------------------------------------------------------------------


def test_pod_set_prefers_kueue_label_and_falls_back_to_main() -> None:
    h = handler()
    stamped = job("a", pod_set="main")
    custom = job("b", pod_set="trainers")
    unstamped = job("c", pod_set=None)
    assert h.pod_set(ref_of(stamped), parse_pod(job_pod(stamped, index=0))) == "main"
    assert h.pod_set(ref_of(custom), parse_pod(job_pod(custom, index=0))) == "trainers"
    assert h.pod_set(ref_of(unstamped), parse_pod(job_pod(unstamped, index=0))) == "main"


# -- ungater_sort_key / ungater_release_group ------------------------------------------------


def test_sort_key_orders_indexed_pods_by_completion_index() -> None:
    j = job("train", parallelism=12)
    h = handler()
    keys = {i: h.sort_key(ref_of(j), parse_pod(job_pod(j, index=i))) for i in (0, 2, 10)}
    assert keys == {0: (0, 0), 2: (0, 2), 10: (0, 10)}
    assert keys[2] < keys[10]  # numeric, not "10" < "2"


def test_sort_key_reads_the_annotation_when_the_label_is_absent() -> None:
    j = job("train")
    pod = parse_pod(job_pod(j, index=3, index_label=False))
    assert "batch.kubernetes.io/job-completion-index" not in pod.labels
    assert handler().sort_key(ref_of(j), pod) == (0, 3)


def test_sort_key_falls_back_to_the_label_when_the_annotation_is_unusable() -> None:
    j = job("train")
    raw = job_pod(j, index=4)
    raw["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] = "four"
    assert handler().sort_key(ref_of(j), parse_pod(raw)) == (0, 4)


def test_non_indexed_pods_share_one_key_so_creation_time_decides() -> None:
    j = job("train", indexed=False)
    h = handler()
    assert {h.sort_key(ref_of(j), parse_pod(job_pod(j, created=t))) for t in (1, 2, 3)} == {(1, 0)}


@given(st.text(max_size=30))
def test_sort_key_never_raises_on_odd_annotations(value: str) -> None:
    j = job("train")
    raw = job_pod(j, index=None)
    raw["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] = value
    key = job_plugin.ungater_sort_key(parse_pod(raw))
    assert len(key) == 2 and all(isinstance(x, int) for x in key)


def test_no_release_groups() -> None:
    j = job("train")
    assert handler().release_group(ref_of(j), parse_pod(job_pod(j, index=0))) is None


# -- whole decisions -------------------------------------------------------------------------


def _scaled_up_slices(
    j: dict[str, Any], old: int, new: int, *, admitted_new: bool
) -> list[WorkloadView]:
    first = workload(j, {"main": old}, admitted={"main": old}, created=0, finished=admitted_new)
    first_key = f"{first['metadata']['namespace']}/{first['metadata']['name']}"
    second = workload(
        j,
        {"main": new},
        admitted={"main": new} if admitted_new else None,
        created=60,
        replacement_for=first_key,
        seed="scale-up",
    )
    return [parse_workload(first), parse_workload(second)]


def test_indexed_job_releases_lowest_indexes_first_whatever_the_creation_order() -> None:
    j = job("train", parallelism=5)
    order = [3, 0, 4, 1, 2]  # the Job controller creates pods in parallel: any order
    pods = [job_pod(j, index=i, created=10 + n) for n, i in enumerate(order)]
    slices = _scaled_up_slices(j, 2, 5, admitted_new=False)  # the scale-up is still pending
    decision = decide(slices, facts(handler(), j, pods), GATE)
    by_name = {p["metadata"]["name"]: p for p in pods}
    released = sorted(
        int(by_name[n]["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"])
        for n in decision.released_names
    )
    assert released == [0, 1]
    [report] = decision.pod_sets
    assert (report.cap, report.gated, len(report.waiting)) == (2, 5, 3)


def test_scale_up_admitted_releases_the_rest_and_counts_running_pods() -> None:
    j = job("train", parallelism=5)
    pods = [job_pod(j, index=i, created=10 + i) for i in range(5)]
    pods[0], pods[1] = release(pods[0]), release(pods[1])
    slices = _scaled_up_slices(j, 2, 5, admitted_new=True)
    decision = decide(slices, facts(handler(), j, pods), GATE)
    assert decision.released_names == names(pods[2:])


def test_impostor_pod_is_neither_released_nor_counted() -> None:
    j = job("train", parallelism=3)
    pods = [job_pod(j, index=i, created=10 + i) for i in range(3)]
    impostor = strip_owner(job_pod(j, index=0, created=1, seed="x"))
    slices = [parse_workload(workload(j, {"main": 2}, admitted={"main": 2}))]
    decision = decide(slices, facts(handler(), j, [impostor, *pods]), GATE)
    assert decision.released_names == names(pods[:2])
    assert [w.pod for w in decision.unmapped] == names([impostor])


def test_replacement_pod_for_a_failed_index_is_released() -> None:
    j = job("train", parallelism=2)
    failed = release(job_pod(j, index=0, created=10), phase="Failed")
    running = release(job_pod(j, index=1, created=10))
    replacement = job_pod(j, index=0, created=40, seed="retry")
    slices = [parse_workload(workload(j, {"main": 2}, admitted={"main": 2}))]
    decision = decide(slices, facts(handler(), j, [failed, running, replacement]), GATE)
    assert decision.released_names == names([replacement])


def test_only_our_gate_counts_when_the_pod_has_another_one() -> None:
    j = job("train", parallelism=2)
    pods = [job_pod(j, index=i, gates=(TAS_GATE, GATE), created=10) for i in range(2)]
    slices = [parse_workload(workload(j, {"main": 2}, admitted={"main": 1}))]
    decision = decide(slices, facts(handler(), j, pods), GATE)
    [release_] = decision.releases
    assert (release_.pod.name, release_.gate_index) == (names(pods)[0], 1)


def test_non_indexed_job_releases_oldest_first() -> None:
    j = job("batch", indexed=False, parallelism=3)
    pods = [job_pod(j, created=t) for t in (30, 10, 20)]
    slices = [parse_workload(workload(j, {"main": 3}, admitted={"main": 2}))]
    decision = decide(slices, facts(handler(), j, pods), GATE)
    assert decision.released_names == names([pods[1], pods[2]])


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(min_value=1, max_value=12),
    cap=st.integers(min_value=0, max_value=12),
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_any_creation_order_releases_exactly_the_lowest_indexes(
    n: int, cap: int, seed: int
) -> None:
    rng = random.Random(seed)
    j = job("prop", parallelism=n)
    indexes = list(range(n))
    rng.shuffle(indexes)
    pods = [job_pod(j, index=i, created=rng.randint(0, 3)) for i in indexes]
    slices = [parse_workload(workload(j, {"main": n}, admitted={"main": min(cap, n)}))]
    decision = decide(slices, facts(handler(), j, pods), GATE)
    released = sorted(
        int(r.pod.annotations["batch.kubernetes.io/job-completion-index"])
        for r in decision.releases
    )
    assert released == list(range(min(cap, n)))


def test_desired_count_is_parallelism_bounded_by_remaining_completions() -> None:
    h = handler()

    def desired(obj: dict[str, Any]) -> dict[str, int] | None:
        return h.desired_counts(h.owner_facts(obj))

    assert desired(job("train", parallelism=4)) == {"main": 4}
    done_two = job("train", parallelism=4, completions=5)
    done_two["status"] = {"succeeded": 2}
    assert desired(done_two) == {"main": 3}  # only three indexes are left to run
    done_two["status"] = {"succeeded": 7}
    assert desired(done_two) == {"main": 0}
    suspended = job("train", parallelism=4)
    suspended["spec"]["suspend"] = True
    assert desired(suspended) == {"main": 0}
    odd = job("train", parallelism=4)
    odd["spec"]["parallelism"] = "four"
    assert desired(odd) is None  # cannot tell: the slice alone bounds the pod set
