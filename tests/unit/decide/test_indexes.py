"""The pod and object indexes the decisions read (ungater/_decide/indexes.py): a selector with
no pods, the controllers above a pod (which owners a pod event queues), the order of
resourceVersions a cache keeps."""

from __future__ import annotations

import dataclasses

from tests.unit.podfactory import job_pod, jobset, jobset_child_job
from ungater._decide.indexes import MAX_CHAIN, ObjectIndex, PodIndex, ancestors, older
from ungater._model.views import parse_object, parse_pod

LABEL = "batch.kubernetes.io/controller-uid"


def test_a_selector_selects_the_pods_carrying_every_one_of_its_labels() -> None:
    index = PodIndex(LABEL)
    child = jobset_child_job(jobset("llm", {"workers": 1}), "workers", 0)
    pod = parse_pod(job_pod(child, index=0))
    index.on_change(None, pod)
    uid = pod.labels[LABEL]
    assert index.select(pod.namespace, {LABEL: uid}) == [pod]
    assert index.select(pod.namespace, {LABEL: uid, **dict(list(pod.labels.items())[:1])}) == [pod]
    assert index.select(pod.namespace, {LABEL: uid, "not-on-the-pod": "x"}) == []
    assert index.select("ns-without-pods", {LABEL: "nobody"}) == []
    assert index.select("ns-without-pods", {LABEL: "nobody", "other": "label"}) == []


def test_the_controllers_above_a_jobset_pod_are_its_job_then_the_jobset() -> None:
    js = jobset("llm", {"workers": 1})
    child = jobset_child_job(js, "workers", 0)
    pod = parse_pod(job_pod(child, index=0))
    objects = ObjectIndex()
    assert ancestors(pod.controller, objects.by_uid) == [child["metadata"]["uid"]]
    objects.keep(parse_object(child))  # the child Job cached: the JobSet above it is found
    assert ancestors(pod.controller, objects.by_uid) == [
        child["metadata"]["uid"],
        js["metadata"]["uid"],
    ]
    assert ancestors(None, objects.by_uid) == []


def test_a_controller_cycle_is_walked_no_further_than_the_bound() -> None:
    child = parse_object(jobset_child_job(jobset("llm", {"workers": 1}), "workers", 0))
    assert child.controller is not None
    own = dataclasses.replace(child.controller, uid=child.uid)  # its own controller
    looped = dataclasses.replace(child, owner_refs=(own,))
    assert ancestors(own, {child.uid: looped}) == [child.uid] * MAX_CHAIN


def test_only_a_lower_resource_version_is_older() -> None:
    assert older("41", "42") and not older("42", "42") and not older("43", "42")
    assert not older("abc", "42")  # no order outside an etcd-backed server's integers
