"""The RayCluster plugin: hooks, ownership by UID behind a name selector, multi-host replicas."""

from __future__ import annotations

from typing import Any

from ungater_plugins import raycluster as ray_plugin

from tests.unit.podfactory import (
    GATE,
    facts,
    names,
    ray_head_pod,
    ray_replica_name,
    ray_worker_pod,
    raycluster,
    release,
    reown,
    strip_owner,
    workload,
)
from ungater._decide.decision import Ownership, decide
from ungater._model.views import Kind, ObjectRef, parse_pod, parse_workload
from ungater._plugins.registry import KindHandler, PluginRegistry
from ungater.plugin_api import KindSpec, ReleaseGroup
from ungater.testing import new_uid, ref_of

RAYCLUSTER = Kind("ray.io", "RayCluster")


def handler() -> KindHandler:
    registry = PluginRegistry.from_modules({"raycluster": ray_plugin})
    assert registry.failures == []
    return registry.handler(RAYCLUSTER)


def multi_host_replica(
    rc: dict[str, Any], group: str, replica_index: int, hosts: int, *, created: float = 2
) -> list[dict[str, Any]]:
    """The pods KubeRay creates for one multi-host replica: one per host, same replica name."""
    name = ray_replica_name(group, f"replica-{replica_index}")
    return [
        ray_worker_pod(
            rc,
            group,
            replica_index=replica_index,
            replica_name=name,
            host_index=h,
            created=created,
        )
        for h in range(hosts)
    ]


# -- ungater_kinds / ungater_pod_selector -----------------------------------------------------


def test_kinds_declares_raycluster_by_cluster_name_label() -> None:
    assert ray_plugin.ungater_kinds() == [
        KindSpec(
            group="ray.io",
            kind="RayCluster",
            pod_label="ray.io/cluster",
            owner_resource=ray_plugin.RAYCLUSTERS,
        )
    ]


def test_owner_facts_are_num_of_hosts_per_worker_group() -> None:
    rc = raycluster("rc", {"tpu": (2, 4), "cpu": (3, 1)})
    assert handler().owner_facts(rc)["numOfHosts"] == {"tpu": 4, "cpu": 1}
    broken = raycluster("rc", {"tpu": (2, 4)})
    broken["spec"]["workerGroupSpecs"][0]["numOfHosts"] = "four"
    assert handler().owner_facts(broken)["numOfHosts"] == {}


def test_desired_counts_follow_kuberay_replicas_clamped_times_hosts() -> None:
    rc = raycluster("rc", {"TPU": (2, 4), "cpu": (3, 1)})
    groups = rc["spec"]["workerGroupSpecs"]
    h = handler()
    assert h.desired_counts(h.owner_facts(rc)) == {"head": 1, "tpu": 8, "cpu": 3}
    groups[1].update(minReplicas=5, maxReplicas=9)  # below min: KubeRay keeps min
    assert h.desired_counts(h.owner_facts(rc))["cpu"] == 5
    groups[1].update(replicas=12)  # above max: KubeRay keeps max
    assert h.desired_counts(h.owner_facts(rc))["cpu"] == 9
    groups[0]["suspend"] = True  # a suspended worker group has no pods
    assert h.desired_counts(h.owner_facts(rc))["tpu"] == 0
    rc["spec"]["suspend"] = True  # a suspended cluster has none at all
    assert h.desired_counts(h.owner_facts(rc)) == {"head": 0, "tpu": 0, "cpu": 0}


def test_selector_is_the_cluster_name_and_matches_head_and_workers() -> None:
    rc = raycluster("rc", {"cpu": (1, 1)})
    selector = handler().pod_selector(ref_of(rc))
    assert selector == {"ray.io/cluster": "rc"}
    for raw in (ray_head_pod(rc), ray_worker_pod(rc, "cpu")):
        pod = parse_pod(raw)
        assert all(pod.labels.get(k) == v for k, v in selector.items())


# -- ungater_owns_pod ------------------------------------------------------------------------


def test_owns_pods_whose_controller_is_the_cluster() -> None:
    rc = raycluster("rc", {"cpu": (1, 1)})
    assert ray_plugin.ungater_owns_pod(ref_of(rc), [ref_of(rc)]) is True
    got = facts(handler(), rc, [ray_head_pod(rc), ray_worker_pod(rc, "cpu")])
    assert [f.ownership for f in got] == [Ownership.PROVEN, Ownership.PROVEN]


def test_foreign_pod_with_copied_labels_is_not_owned() -> None:
    rc = raycluster("rc", {"cpu": (1, 1)})
    [f] = facts(handler(), rc, [strip_owner(ray_worker_pod(rc, "cpu"))])
    assert f.ownership is Ownership.FOREIGN
    assert ray_plugin.ungater_owns_pod(ref_of(rc), []) is False


def test_pod_of_a_deleted_and_recreated_cluster_of_the_same_name_is_not_owned() -> None:
    rc = raycluster("rc", {"cpu": (1, 1)})
    old = dict(rc, metadata={**rc["metadata"], "uid": new_uid("previous incarnation")})
    pod = reown(ray_worker_pod(rc, "cpu"), old)  # same name, same labels, old UID
    [f] = facts(handler(), rc, [pod])
    assert f.ownership is Ownership.FOREIGN
    assert ray_plugin.ungater_owns_pod(ref_of(rc), [ref_of(old)]) is False


def test_chain_through_a_rayjob_is_not_this_plugins_shape() -> None:
    rc = raycluster("rc", {"cpu": (1, 1)})
    rayjob = ObjectRef("ray.io/v1", "RayJob", "job", new_uid("rayjob"))
    assert ray_plugin.ungater_owns_pod(rayjob, [ref_of(rc), rayjob]) is False


# -- ungater_pod_set -------------------------------------------------------------------------


def test_pod_set_prefers_kueue_label_then_head_then_group_name() -> None:
    rc = raycluster("rc", {"GPU-Workers": (2, 1)})
    h, owner = handler(), ref_of(rc)
    assert h.pod_set(owner, parse_pod(ray_head_pod(rc))) == "head"
    assert h.pod_set(owner, parse_pod(ray_head_pod(rc, pod_set=None))) == "head"
    assert h.pod_set(owner, parse_pod(ray_worker_pod(rc, "GPU-Workers"))) == "gpu-workers"
    # without Kueue's label: Kueue lowercases groupName into the pod set name
    unstamped = ray_worker_pod(rc, "GPU-Workers", pod_set=None)
    assert h.pod_set(owner, parse_pod(unstamped)) == "gpu-workers"


def test_pod_set_unknown_without_node_type() -> None:
    rc = raycluster("rc", {"cpu": (1, 1)})
    raw = ray_worker_pod(rc, "cpu", pod_set=None)
    del raw["metadata"]["labels"]["ray.io/node-type"]
    assert handler().pod_set(ref_of(rc), parse_pod(raw)) is None


# -- ungater_sort_key ------------------------------------------------------------------------


def test_sort_key_head_first_then_replica_index_then_host_index() -> None:
    rc = raycluster("rc", {"tpu": (3, 2)})
    h, owner = handler(), ref_of(rc)
    head = h.sort_key(owner, parse_pod(ray_head_pod(rc)))
    replicas = [multi_host_replica(rc, "tpu", i, 2) for i in (0, 1, 10)]
    keys = [[h.sort_key(owner, parse_pod(p)) for p in r] for r in replicas]
    flat = [k for r in keys for k in r]
    assert head < flat[0]
    assert flat == sorted(flat)  # (replica 0: hosts 0, 1), (replica 1: ...), (replica 10: ...)
    assert len({len(k) for k in [head, *flat]}) == 1  # one shape for every pod


def test_sort_key_single_host_workers_by_replica_index() -> None:
    rc = raycluster("rc", {"cpu": (3, 1)})
    h, owner = handler(), ref_of(rc)
    keys = [
        h.sort_key(owner, parse_pod(ray_worker_pod(rc, "cpu", replica_index=i))) for i in (2, 0, 11)
    ]
    assert sorted(keys) == [keys[1], keys[0], keys[2]]


def test_sort_key_without_indexing_labels_leaves_creation_order_to_the_core() -> None:
    rc = raycluster("rc", {"cpu": (3, 1)})
    h, owner = handler(), ref_of(rc)
    keys = {
        h.sort_key(owner, parse_pod(ray_worker_pod(rc, "cpu", replica_index=None, created=t)))
        for t in (1, 2)
    }
    assert len(keys) == 1
    indexed = h.sort_key(owner, parse_pod(ray_worker_pod(rc, "cpu", replica_index=5)))
    assert indexed < keys.pop()


# -- ungater_release_group -------------------------------------------------------------------


def test_multi_host_workers_are_grouped_by_replica_name() -> None:
    rc = raycluster("rc", {"tpu": (2, 4)})
    h, owner = handler(), ref_of(rc)
    replica = multi_host_replica(rc, "tpu", 0, 4)
    groups = {h.release_group(owner, parse_pod(p)) for p in replica}
    name = replica[0]["metadata"]["labels"]["ray.io/worker-group-replica-name"]
    assert groups == {ReleaseGroup(key=name, size=None)}  # the RayCluster is not cached yet
    facts_ = h.owner_facts(rc)
    sized = {h.release_group(owner, parse_pod(p), facts_) for p in replica}
    assert sized == {ReleaseGroup(key=name, size=4)}


def test_a_replica_missing_a_host_waits_when_num_of_hosts_is_known() -> None:
    rc = raycluster("rc", {"tpu": (2, 2)})
    h = handler()
    first = multi_host_replica(rc, "tpu", 0, 2, created=1)
    half = multi_host_replica(rc, "tpu", 1, 2, created=2)[:1]  # host 1 not created yet
    slices = [parse_workload(workload(rc, {"head": 0, "tpu": 4}, admitted={"head": 0, "tpu": 4}))]
    pods = [*first, *half]
    from ungater._decide.assess import pod_facts

    views = [parse_pod(p) for p in pods]
    decision = decide(slices, pod_facts(h, ref_of(rc), views, {}, h.owner_facts(rc)), GATE)
    assert decision.released_names == names(first)
    tpu = next(r for r in decision.pod_sets if r.name == "tpu")
    assert [w.reason for w in tpu.waiting] == [
        f"release group {half[0]['metadata']['labels']['ray.io/worker-group-replica-name']} "
        "incomplete (1 of 2 pods)"
    ]


def test_head_and_single_host_workers_are_not_grouped() -> None:
    rc = raycluster("rc", {"cpu": (2, 1)})
    h, owner = handler(), ref_of(rc)
    assert h.release_group(owner, parse_pod(ray_head_pod(rc))) is None
    assert h.release_group(owner, parse_pod(ray_worker_pod(rc, "cpu", replica_index=1))) is None


# -- whole decisions -------------------------------------------------------------------------


def test_multi_host_group_cap_three_releases_one_whole_replica() -> None:
    rc = raycluster("rc", {"tpu": (2, 2)})
    head = ray_head_pod(rc, created=1)
    second = multi_host_replica(rc, "tpu", 1, 2, created=2)  # created first, index 1
    first = multi_host_replica(rc, "tpu", 0, 2, created=3)
    pods = [head, *second, *first]
    slices = [parse_workload(workload(rc, {"head": 1, "tpu": 4}, admitted={"head": 1, "tpu": 3}))]
    decision = decide(slices, facts(handler(), rc, pods), GATE)
    assert decision.released_names == names([head, *first])
    tpu = next(r for r in decision.pod_sets if r.name == "tpu")
    assert {w.pod for w in tpu.waiting} == set(names(second))
    assert all("needs 2 pods, 1 left" in w.reason for w in tpu.waiting)


def test_scale_up_by_one_replica_while_one_runs() -> None:
    rc = raycluster("rc", {"tpu": (2, 2)})
    running = [release(p) for p in multi_host_replica(rc, "tpu", 0, 2)]
    new = multi_host_replica(rc, "tpu", 1, 2, created=50)
    head = release(ray_head_pod(rc))
    slices = [parse_workload(workload(rc, {"head": 1, "tpu": 4}, admitted={"head": 1, "tpu": 4}))]
    decision = decide(slices, facts(handler(), rc, [head, *running, *new]), GATE)
    assert decision.released_names == names(new)


def test_single_host_workers_follow_replica_index_and_foreign_pods_are_skipped() -> None:
    rc = raycluster("rc", {"cpu": (4, 1)})
    workers = [ray_worker_pod(rc, "cpu", replica_index=i, created=10 - i) for i in range(4)]
    impostor = strip_owner(ray_worker_pod(rc, "cpu", replica_index=0, created=0, seed="evil"))
    slices = [parse_workload(workload(rc, {"head": 1, "cpu": 4}, admitted={"head": 1, "cpu": 2}))]
    decision = decide(slices, facts(handler(), rc, [impostor, *workers]), GATE)
    assert decision.released_names == names(workers[:2])
    assert [w.pod for w in decision.unmapped] == names([impostor])
