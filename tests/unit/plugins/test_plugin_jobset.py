"""The JobSet plugin: hooks, the two-hop ownership proof through child Jobs, whole decisions."""

from __future__ import annotations

from ungater_plugins import jobset as jobset_plugin

from tests.unit.podfactory import (
    GATE,
    facts,
    job,
    job_pod,
    jobset,
    jobset_child_job,
    names,
    release,
    strip_owner,
    workload,
)
from ungater._decide.decision import Ownership, decide
from ungater._model.views import Kind, parse_object, parse_pod, parse_workload
from ungater._plugins.registry import KindHandler, PluginRegistry
from ungater.plugin_api import KindSpec, ResourceSpec
from ungater.testing import ref_of

JOBSET = Kind("jobset.x-k8s.io", "JobSet")


def handler() -> KindHandler:
    registry = PluginRegistry.from_modules({"jobset": jobset_plugin})
    assert registry.failures == []
    return registry.handler(JOBSET)


# -- ungater_kinds / ungater_pod_selector -----------------------------------------------------


def test_kinds_declares_jobset_with_child_jobs_as_intermediates() -> None:
    assert jobset_plugin.ungater_kinds() == [
        KindSpec(
            group="jobset.x-k8s.io",
            kind="JobSet",
            pod_label="jobset.sigs.k8s.io/jobset-uid",
            intermediates=(
                ResourceSpec(
                    group="batch",
                    version="v1",
                    kind="Job",
                    plural="jobs",
                    label_selector="jobset.sigs.k8s.io/jobset-name",
                ),
            ),
            owner_resource=ResourceSpec(
                group="jobset.x-k8s.io", version="v1alpha2", kind="JobSet", plural="jobsets"
            ),
        )
    ]


def test_selector_is_the_jobset_uid_and_matches_pods_and_child_jobs_are_cached() -> None:
    js = jobset("llm", {"workers": 2})
    child = jobset_child_job(js, "workers", 1)
    selector = handler().pod_selector(ref_of(js))
    assert selector == {"jobset.sigs.k8s.io/jobset-uid": js["metadata"]["uid"]}
    pod = parse_pod(job_pod(child, index=0))
    assert all(pod.labels.get(k) == v for k, v in selector.items())
    # the intermediate watch's existence selector matches the child Job
    assert "jobset.sigs.k8s.io/jobset-name" in parse_object(child).labels


# -- ungater_owns_pod ------------------------------------------------------------------------


def test_owns_pods_of_its_child_jobs() -> None:
    js = jobset("llm", {"workers": 2})
    child = jobset_child_job(js, "workers", 0)
    assert jobset_plugin.ungater_owns_pod(ref_of(js), [ref_of(child), ref_of(js)]) is True
    [f] = facts(handler(), js, [job_pod(child, index=0)], [child])
    assert f.ownership is Ownership.PROVEN


def test_foreign_pod_with_copied_labels_is_not_owned() -> None:
    js = jobset("llm", {"workers": 1})
    child = jobset_child_job(js, "workers", 0)
    impostor = strip_owner(job_pod(child, index=0))
    [f] = facts(handler(), js, [impostor], [child])
    assert f.ownership is Ownership.FOREIGN


def test_pod_whose_job_belongs_to_another_jobset_is_not_owned() -> None:
    js, other = jobset("llm", {"workers": 1}), jobset("rival", {"workers": 1})
    stolen_child = jobset_child_job(other, "workers", 0)
    pod = job_pod(stolen_child, index=0)
    # the pod claims to be ours by label...
    pod["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-uid"] = js["metadata"]["uid"]
    assert (
        jobset_plugin.ungater_owns_pod(ref_of(js), [ref_of(stolen_child), ref_of(other)]) is False
    )
    [f] = facts(handler(), js, [pod], [stolen_child])
    assert f.ownership is Ownership.FOREIGN


def test_pod_of_a_standalone_job_is_not_owned() -> None:
    js = jobset("llm", {"workers": 1})
    lone = job("llm-workers-0", pod_set=None, labels={"jobset.sigs.k8s.io/jobset-name": "llm"})
    assert jobset_plugin.ungater_owns_pod(ref_of(js), [ref_of(lone)]) is False
    [f] = facts(handler(), js, [job_pod(lone, index=0)], [lone])
    assert f.ownership is Ownership.FOREIGN


def test_pod_owned_by_the_jobset_directly_is_not_owned() -> None:
    js = jobset("llm", {"workers": 1})
    assert jobset_plugin.ungater_owns_pod(ref_of(js), [ref_of(js)]) is False


def test_child_job_not_cached_yet_is_unresolved_not_foreign() -> None:
    js = jobset("llm", {"workers": 1})
    child = jobset_child_job(js, "workers", 0)
    [f] = facts(handler(), js, [job_pod(child, index=0)], [])
    assert f.ownership is Ownership.UNRESOLVED


# -- ungater_pod_set -------------------------------------------------------------------------


def test_pod_set_prefers_kueue_label_then_the_replicated_job_name() -> None:
    js = jobset("llm", {"driver": 1, "workers": 2})
    h = handler()
    stamped = jobset_child_job(js, "workers", 0, pod_set="")
    unstamped = jobset_child_job(js, "driver", 0, pod_set=None)
    assert h.pod_set(ref_of(js), parse_pod(job_pod(stamped, index=0))) == "workers"
    assert h.pod_set(ref_of(js), parse_pod(job_pod(unstamped, index=0))) == "driver"


def test_pod_without_any_pod_set_label_has_none() -> None:
    js = jobset("llm", {"workers": 1})
    raw = job_pod(jobset_child_job(js, "workers", 0, pod_set=None), index=0)
    del raw["metadata"]["labels"]["jobset.sigs.k8s.io/replicatedjob-name"]
    assert handler().pod_set(ref_of(js), parse_pod(raw)) is None


# -- ungater_sort_key / ungater_release_group ------------------------------------------------


def test_sort_key_is_job_index_then_completion_index() -> None:
    js = jobset("llm", {"workers": 12})
    h = handler()

    def key(job_index: int, index: int) -> tuple[int | str, ...]:
        child = jobset_child_job(js, "workers", job_index, parallelism=12)
        return h.sort_key(ref_of(js), parse_pod(job_pod(child, index=index)))

    assert key(0, 0) == (0, 0, 0, 0)
    assert key(0, 11) < key(1, 0) < key(1, 2) < key(10, 0)


def test_sort_key_of_non_indexed_child_jobs() -> None:
    js = jobset("llm", {"workers": 2})
    child = jobset_child_job(js, "workers", 1, indexed=False)
    assert handler().sort_key(ref_of(js), parse_pod(job_pod(child))) == (0, 1, 1, 0)


def test_no_release_groups() -> None:
    js = jobset("llm", {"workers": 1})
    pod = parse_pod(job_pod(jobset_child_job(js, "workers", 0), index=0))
    assert handler().release_group(ref_of(js), pod) is None


# -- whole decisions -------------------------------------------------------------------------


def test_jobset_releases_per_replicated_job_in_job_then_completion_order() -> None:
    js = jobset("llm", {"driver": 1, "workers": 2})
    driver = jobset_child_job(js, "driver", 0, parallelism=1)
    workers = [jobset_child_job(js, "workers", i, parallelism=2) for i in range(2)]
    driver_pod = job_pod(driver, index=0, created=5)
    # created newest-first, so creation order alone would pick the wrong pods
    worker_pods = {
        (ji, ci): job_pod(workers[ji], index=ci, created=20 - 2 * ji - ci)
        for ji in range(2)
        for ci in range(2)
    }
    rival = jobset("rival", {"workers": 1})
    rival_child = jobset_child_job(rival, "workers", 0)
    intruder = job_pod(rival_child, index=0, created=0)
    intruder["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-uid"] = js["metadata"]["uid"]
    pods = [intruder, driver_pod, *worker_pods.values()]
    slices = [
        parse_workload(
            workload(js, {"driver": 1, "workers": 4}, admitted={"driver": 1, "workers": 3})
        )
    ]
    decision = decide(slices, facts(handler(), js, pods, [driver, *workers, rival_child]), GATE)
    expected = [driver_pod, worker_pods[0, 0], worker_pods[0, 1], worker_pods[1, 0]]
    assert decision.released_names == names(expected)
    assert [w.pod for w in decision.unmapped] == names([intruder])


def test_jobset_counts_released_pods_against_the_cap() -> None:
    js = jobset("llm", {"workers": 2})
    workers = [jobset_child_job(js, "workers", i, parallelism=2) for i in range(2)]
    pods = [release(job_pod(workers[0], index=0, created=1))]
    pods += [job_pod(workers[0], index=1, created=1), job_pod(workers[1], index=0, created=1)]
    slices = [parse_workload(workload(js, {"workers": 4}, admitted={"workers": 2}))]
    decision = decide(slices, facts(handler(), js, pods, workers), GATE)
    assert decision.released_names == names([pods[1]])


def test_desired_counts_are_replicas_times_pods_per_child_job() -> None:
    js = jobset("llm", {"Workers": 2, "driver": 1})
    js["spec"]["replicatedJobs"][0]["template"]["spec"] = {"parallelism": 3, "completions": 3}
    js["spec"]["replicatedJobs"][1]["template"]["spec"] = {"parallelism": 4, "completions": 2}
    h = handler()
    assert h.desired_counts(h.owner_facts(js)) == {"workers": 6, "driver": 2}
    js["spec"]["suspend"] = True
    assert h.desired_counts(h.owner_facts(js)) == {"workers": 0, "driver": 0}
