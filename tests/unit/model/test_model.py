"""Parsing raw API objects into the slim views: realistic objects and malformed ones."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.unit.builders import GATE, TOPOLOGY_GATE, pod, workload
from ungater._model.views import (
    Condition,
    Kind,
    MalformedObject,
    ObjectRef,
    PodSetAssignment,
    PodSetSpec,
    parse_object,
    parse_pod,
    parse_workload,
)

# A pod of an Indexed Job as the API server serves it after Kueue admitted the job.
REAL_POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "train-2-x7k2p",
        "generateName": "train-2-",
        "namespace": "ml",
        "uid": "6f1c0d3e-8a43-4d1e-9e0b-0e4f5a1b2c3d",
        "resourceVersion": "48213",
        "creationTimestamp": "2025-03-01T10:00:07Z",
        "labels": {
            "batch.kubernetes.io/controller-uid": "0b6a8d1e-job",
            "batch.kubernetes.io/job-completion-index": "2",
            "batch.kubernetes.io/job-name": "train",
            "controller-uid": "0b6a8d1e-job",
            "job-name": "train",
            "kueue.x-k8s.io/podset": "main",
        },
        "annotations": {
            "batch.kubernetes.io/job-completion-index": "2",
            "kueue.x-k8s.io/workload-slice-name": "job-train-3f2a1",
        },
        "ownerReferences": [
            {
                "apiVersion": "example.com/v1",
                "kind": "Watcher",
                "name": "w",
                "uid": "not-the-controller",
            },
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": "train",
                "uid": "0b6a8d1e-job",
                "controller": True,
                "blockOwnerDeletion": True,
            },
        ],
        "finalizers": ["batch.kubernetes.io/job-tracking"],
    },
    "spec": {
        "schedulingGates": [{"name": TOPOLOGY_GATE}, {"name": GATE}],
        "containers": [{"name": "trainer", "image": "python:3.12"}],
        "nodeSelector": {"cloud.google.com/gke-accelerator": "nvidia-l4"},
        "tolerations": [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            "not-a-toleration",
        ],
        "restartPolicy": "Never",
    },
    "status": {
        "phase": "Pending",
        "qosClass": "BestEffort",
        "conditions": [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}],
    },
}


def test_parse_realistic_pod() -> None:
    v = parse_pod(REAL_POD)
    assert (v.namespace, v.name, v.uid) == ("ml", "train-2-x7k2p", REAL_POD["metadata"]["uid"])
    assert v.creation_timestamp == "2025-03-01T10:00:07Z"
    assert v.resource_version == "48213"
    assert v.labels["kueue.x-k8s.io/podset"] == "main"
    assert v.annotations["batch.kubernetes.io/job-completion-index"] == "2"
    assert v.gates == (TOPOLOGY_GATE, GATE)
    assert v.has_gate(GATE) and v.has_gate(TOPOLOGY_GATE) and not v.has_gate("x")
    assert v.phase == "Pending" and not v.terminal and not v.deleting
    assert len(v.owner_refs) == 2
    assert v.controller == ObjectRef("batch/v1", "Job", "train", "0b6a8d1e-job", True)
    assert v.controller.group_kind == Kind("batch", "Job")  # type: ignore[union-attr]
    assert v.node_selector == {"cloud.google.com/gke-accelerator": "nvidia-l4"}
    assert v.tolerations == (
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    )


def test_parse_pod_does_not_alias_the_input() -> None:
    raw = copy.deepcopy(REAL_POD)
    v = parse_pod(raw)
    raw["metadata"]["labels"]["kueue.x-k8s.io/podset"] = "changed"
    assert v.labels["kueue.x-k8s.io/podset"] == "main"


@pytest.mark.parametrize(
    ("phase", "terminal"),
    [
        ("Pending", False),
        ("Running", False),
        ("Succeeded", True),
        ("Failed", True),
        ("Unknown", False),
    ],
)
def test_pod_terminal(phase: str, terminal: bool) -> None:
    assert parse_pod(pod("p", phase=phase)).terminal is terminal


def test_pod_deleting_and_defaults() -> None:
    assert parse_pod(pod("p", deleting=True)).deleting
    bare = parse_pod({"metadata": {"name": "p", "uid": "u"}})
    assert bare.phase == "Pending"  # no status yet
    assert bare.gates == () and bare.owner_refs == () and bare.controller is None
    assert bare.labels == {} and bare.annotations == {} and bare.namespace == ""
    assert bare.creation_timestamp == "" and bare.resource_version == ""
    empty_status = parse_pod({"metadata": {"name": "p", "uid": "u"}, "spec": {}, "status": {}})
    assert empty_status.phase == "Pending" and empty_status.gates == ()


def test_pod_gates_and_owner_refs_without_identity_are_skipped() -> None:
    raw = pod("p", gates=(GATE,))
    raw["spec"]["schedulingGates"] += [{"nom": "x"}, "kueue.x-k8s.io/admission", None]
    raw["metadata"]["ownerReferences"] += [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "controller": True},  # no uid
        "garbage",
    ]
    v = parse_pod(raw)
    assert v.gates == (GATE,)
    assert [r.uid for r in v.owner_refs] == ["job-uid-1"]


def test_pod_without_controller_reference() -> None:
    raw = pod("p")
    raw["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "u1"}
    ]
    v = parse_pod(raw)
    assert v.controller is None and len(v.owner_refs) == 1


def test_label_values_are_strings() -> None:
    raw = pod("p", labels={"index": 3})  # type: ignore[dict-item]
    raw["metadata"]["annotations"] = ["not", "a", "map"]
    v = parse_pod(raw)
    assert v.labels["index"] == "3"
    assert v.annotations == {}


@pytest.mark.parametrize(
    "meta",
    [
        pytest.param(None, id="no-metadata"),
        pytest.param({"name": "p"}, id="no-uid"),
        pytest.param({"name": "p", "uid": ""}, id="empty-uid"),
        pytest.param({"uid": "u"}, id="no-name"),
        pytest.param(["name", "uid"], id="metadata-not-a-map"),
    ],
)
@pytest.mark.parametrize("parse", [parse_pod, parse_workload, parse_object])
def test_missing_identity_is_malformed(meta: Any, parse: Any) -> None:
    obj: dict[str, Any] = {"spec": {}, "status": {}}
    if meta is not None:
        obj["metadata"] = meta
    with pytest.raises(MalformedObject, match=r"metadata\.name and metadata\.uid"):
        parse(obj)


def test_malformed_object_is_a_value_error() -> None:
    assert issubclass(MalformedObject, ValueError)


# -- intermediate owners ----------------------------------------------------------------------


def test_parse_object_child_job_of_jobset() -> None:
    raw = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "js-workers-0",
            "namespace": "ml",
            "uid": "job-1",
            "labels": {"jobset.sigs.k8s.io/jobset-name": "js"},
            "ownerReferences": [
                {
                    "apiVersion": "jobset.x-k8s.io/v1alpha2",
                    "kind": "JobSet",
                    "name": "js",
                    "uid": "js-uid",
                    "controller": True,
                }
            ],
        },
        "spec": {"parallelism": 2},
    }
    v = parse_object(raw)
    assert (v.api_version, v.kind, v.namespace, v.name, v.uid) == (
        "batch/v1",
        "Job",
        "ml",
        "js-workers-0",
        "job-1",
    )
    assert v.labels == {"jobset.sigs.k8s.io/jobset-name": "js"}
    assert v.controller is not None
    assert v.controller.group_kind == Kind("jobset.x-k8s.io", "JobSet")
    assert str(v.controller.group_kind) == "JobSet.jobset.x-k8s.io"


@pytest.mark.parametrize(
    ("api_version", "kind", "expected", "text"),
    [
        ("batch/v1", "Job", Kind("batch", "Job"), "Job.batch"),
        ("v1", "Pod", Kind("", "Pod"), "Pod"),
        ("ray.io/v1", "RayCluster", Kind("ray.io", "RayCluster"), "RayCluster.ray.io"),
        (
            "jobset.x-k8s.io/v1alpha2",
            "JobSet",
            Kind("jobset.x-k8s.io", "JobSet"),
            "JobSet.jobset.x-k8s.io",
        ),
    ],
)
def test_kind_from_api_version(api_version: str, kind: str, expected: Kind, text: str) -> None:
    k = Kind.from_api_version(api_version, kind)
    assert k == expected and str(k) == text


# -- workloads ----------------------------------------------------------------------------------


def _real_workload(api_version: str) -> dict[str, Any]:
    """A scale-up slice of an elastic Job, as Kueue writes it (v1beta2 and v1beta1 have the
    same shape for every field read here)."""
    return {
        "apiVersion": api_version,
        "kind": "Workload",
        "metadata": {
            "name": "job-train-9c1d2",
            "namespace": "ml",
            "uid": "wl-uid-2",
            "resourceVersion": "50001",
            "creationTimestamp": "2025-03-01T10:05:00Z",
            "generation": 1,
            "labels": {"kueue.x-k8s.io/job-uid": "0b6a8d1e-job"},
            "annotations": {
                "kueue.x-k8s.io/workload-slice-name": "job-train-3f2a1",
                "kueue.x-k8s.io/workload-slice-replacement-for": "ml/job-train-3f2a1",
                "kueue.x-k8s.io/elastic-job": "true",
            },
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": "train",
                    "uid": "0b6a8d1e-job",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "finalizers": ["kueue.x-k8s.io/resource-in-use"],
        },
        "spec": {
            "active": True,
            "queueName": "user-queue",
            "priority": 0,
            "podSets": [
                {
                    "name": "main",
                    "count": 6,
                    "minCount": 2,
                    "template": {
                        "metadata": {"labels": {"kueue.x-k8s.io/podset": "main"}},
                        "spec": {"containers": [{"name": "trainer", "image": "python:3.12"}]},
                    },
                },
                {"name": "driver", "count": 1, "template": {"spec": {"containers": []}}},
            ],
        },
        "status": {
            "admission": {
                "clusterQueue": "cluster-queue",
                "podSetAssignments": [
                    {
                        "name": "main",
                        "flavors": {"cpu": "default-flavor"},
                        "resourceUsage": {"cpu": "6"},
                        "count": 4,
                    },
                    {"name": "driver", "flavors": {"cpu": "default-flavor"}},
                ],
            },
            "conditions": [
                {
                    "type": "QuotaReserved",
                    "status": "True",
                    "reason": "QuotaReserved",
                    "message": "Quota reserved in ClusterQueue cluster-queue",
                    "lastTransitionTime": "2025-03-01T10:05:01Z",
                    "observedGeneration": 1,
                },
                {
                    "type": "Admitted",
                    "status": "True",
                    "reason": "Admitted",
                    "message": "The workload is admitted",
                    "lastTransitionTime": "2025-03-01T10:05:01Z",
                },
                {"type": "PodsReady", "status": "False", "reason": "WaitForStart"},
            ],
            "admissionChecks": [],
            "requeueState": {"count": 0},
        },
    }


@pytest.mark.parametrize("api_version", ["kueue.x-k8s.io/v1beta2", "kueue.x-k8s.io/v1beta1"])
def test_parse_realistic_workload(api_version: str) -> None:
    w = parse_workload(_real_workload(api_version))
    assert (w.namespace, w.name, w.uid, w.key) == (
        "ml",
        "job-train-9c1d2",
        "wl-uid-2",
        "ml/job-train-9c1d2",
    )
    assert w.creation_timestamp == "2025-03-01T10:05:00Z"
    assert w.resource_version == "50001"
    assert w.elastic
    assert w.replacement_for == "ml/job-train-3f2a1"
    assert w.owner == ObjectRef("batch/v1", "Job", "train", "0b6a8d1e-job", True)
    assert w.pod_sets == (PodSetSpec("main", 6), PodSetSpec("driver", 1))
    assert w.assignments == (PodSetAssignment("main", 4), PodSetAssignment("driver", None))
    assert w.condition_true("Admitted") and w.condition_true("QuotaReserved")
    assert not w.condition_true("PodsReady") and not w.condition_true("Finished")
    assert w.conditions["PodsReady"] == Condition("False", "WaitForStart")


def test_v1beta1_and_v1beta2_views_are_equal() -> None:
    a = parse_workload(_real_workload("kueue.x-k8s.io/v1beta2"))
    b = parse_workload(_real_workload("kueue.x-k8s.io/v1beta1"))
    assert a == b


def test_workload_without_status() -> None:
    raw = _real_workload("kueue.x-k8s.io/v1beta2")
    del raw["status"]
    w = parse_workload(raw)
    assert w.assignments is None and w.conditions == {}
    assert not w.condition_true("Admitted")
    raw["status"] = None
    assert parse_workload(raw).assignments is None


def test_workload_without_spec_or_owner() -> None:
    w = parse_workload({"metadata": {"name": "w", "uid": "u"}})
    assert w.pod_sets == () and w.assignments is None and w.owner is None
    assert not w.elastic and w.replacement_for is None


def test_workload_owner_is_the_controller_reference_only() -> None:
    raw = workload()
    raw["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "u1", "controller": False}
    ]
    assert parse_workload(raw).owner is None


def test_elastic_annotation_must_be_true() -> None:
    raw = workload()
    raw["metadata"]["annotations"]["kueue.x-k8s.io/elastic-job"] = "True"
    assert not parse_workload(raw).elastic


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(3, 3, id="int"),
        pytest.param(0, 0, id="zero"),
        pytest.param(-1, None, id="negative"),
        pytest.param("3", None, id="string"),
        pytest.param(True, None, id="bool"),
        pytest.param(3.0, None, id="float"),
        pytest.param(None, None, id="null"),
        pytest.param([3], None, id="list"),
    ],
)
def test_spec_count_values(value: Any, expected: int | None) -> None:
    raw = workload(pod_sets={"main": value}, admitted={"main": 1})
    assert parse_workload(raw).pod_sets == (PodSetSpec("main", expected),)


def test_spec_count_missing() -> None:
    raw = workload()
    del raw["spec"]["podSets"][0]["count"]
    assert parse_workload(raw).pod_sets == (PodSetSpec("main", None),)


@pytest.mark.parametrize(
    ("value", "count", "invalid"),
    [
        pytest.param(2, 2, False, id="int"),
        pytest.param(0, 0, False, id="zero"),
        pytest.param(None, None, False, id="absent"),
        pytest.param(-2, None, True, id="negative"),
        pytest.param("2", None, True, id="string"),
        pytest.param(False, None, True, id="bool"),
        pytest.param(2.5, None, True, id="float"),
    ],
)
def test_admitted_count_values(value: Any, count: int | None, invalid: bool) -> None:
    raw = workload(pod_sets={"main": 3}, admitted={"main": value})
    assert parse_workload(raw).assignments == (PodSetAssignment("main", count, invalid),)


def test_explicit_null_admitted_count_is_absent() -> None:
    raw = workload(pod_sets={"main": 3}, admitted={"main": 1})
    raw["status"]["admission"]["podSetAssignments"][0]["count"] = None
    assert parse_workload(raw).assignments == (PodSetAssignment("main", None, False),)


def test_admission_without_pod_set_assignments() -> None:
    raw = workload()
    raw["status"]["admission"] = {"clusterQueue": "cq"}
    assert parse_workload(raw).assignments == ()
    raw["status"]["admission"] = {"clusterQueue": "cq", "podSetAssignments": None}
    assert parse_workload(raw).assignments == ()
    raw["status"]["admission"] = None
    assert parse_workload(raw).assignments is None


def test_pod_set_and_assignment_names_default_to_main() -> None:
    raw = workload(pod_sets={"x": 2}, admitted={"x": 1})
    del raw["spec"]["podSets"][0]["name"]
    del raw["status"]["admission"]["podSetAssignments"][0]["name"]
    w = parse_workload(raw)
    assert w.pod_sets == (PodSetSpec("main", 2),)
    assert w.assignments == (PodSetAssignment("main", 1),)


def test_non_mapping_entries_are_skipped() -> None:
    raw = workload()
    raw["spec"]["podSets"].append("garbage")
    raw["status"]["admission"]["podSetAssignments"].append(7)
    raw["status"]["conditions"] += ["garbage", {"status": "True"}]  # the latter has no type
    w = parse_workload(raw)
    assert len(w.pod_sets) == 1 and len(w.assignments or ()) == 1
    assert set(w.conditions) == {"QuotaReserved", "Admitted"}


@pytest.mark.parametrize(
    "mutate",
    [
        pytest.param(lambda o: o.__setitem__("spec", ["x"]), id="spec-list"),
        pytest.param(lambda o: o.__setitem__("status", "x"), id="status-string"),
    ],
)
def test_workload_spec_status_not_objects(mutate: Any) -> None:
    raw = workload()
    mutate(raw)
    with pytest.raises(MalformedObject, match="spec and status must be objects"):
        parse_workload(raw)


# A field of the wrong JSON type must be a MalformedObject (or skipped like other ill-typed
# entries), never a stray TypeError: Reflector._parse skips only MalformedObject, so anything
# else would fail every relist of that cache and it would never sync.


MALFORMED = "malformed"


@pytest.mark.parametrize(
    ("parse", "raw", "outcome"),
    [
        pytest.param(
            parse_workload,
            {**workload(), "spec": {"podSets": 5}},
            MALFORMED,
            id="workload-podSets-int",
        ),
        pytest.param(
            parse_workload,
            {**workload(), "status": {"conditions": 3}},
            MALFORMED,
            id="workload-conditions-int",
        ),
        pytest.param(
            parse_workload,
            {**workload(), "status": {"admission": {"podSetAssignments": 3}}},
            MALFORMED,
            id="workload-podSetAssignments-int",
        ),
        pytest.param(parse_pod, {**pod("p"), "spec": ["x"]}, MALFORMED, id="pod-spec-list"),
        pytest.param(
            parse_pod, {**pod("p"), "status": "Running"}, MALFORMED, id="pod-status-string"
        ),
        pytest.param(
            parse_pod, {**pod("p"), "spec": {"schedulingGates": 3}}, MALFORMED, id="pod-gates-int"
        ),
        # a map's keys and a string's characters are entries that are not objects: each is
        # skipped, as an ill-typed entry of a list is, and the field comes out empty
        pytest.param(
            parse_workload,
            {**workload(), "spec": {"podSets": {"a": 1}}},
            ("pod_sets", ()),
            id="workload-podSets-map",
        ),
        pytest.param(
            parse_workload,
            {**workload(), "status": {"conditions": "x"}},
            ("conditions", {}),
            id="workload-conditions-str",
        ),
    ],
)
def test_ill_typed_fields_are_malformed_or_ignored(
    parse: Any, raw: dict[str, Any], outcome: Any
) -> None:
    """Each case names its outcome: a ``MalformedObject``, or the view with the ill-typed
    field empty and the rest parsed (before, the test passed on any outcome but a crash)."""
    if outcome == MALFORMED:
        with pytest.raises(MalformedObject, match="ill-typed field"):
            parse(raw)
        return
    field_name, empty = outcome
    view = parse(raw)
    assert getattr(view, field_name) == empty
    assert view.name == raw["metadata"]["name"] and view.uid == raw["metadata"]["uid"]


def test_condition_without_status_is_not_true() -> None:
    raw = workload(conditions=[{"type": "Admitted"}])
    w = parse_workload(raw)
    assert w.conditions["Admitted"] == Condition("", "")
    assert not w.condition_true("Admitted")
