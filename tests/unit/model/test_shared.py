"""The table of shared values the parsers keep one copy of (ungater/_model/interning.py) and the views
parsed through it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ungater._model.interning import Shared
from ungater._model.views import parse_pod


def fresh(text: str) -> str:
    """An equal string that is not the same object (as two JSON decodes give)."""
    out: str = json.loads(json.dumps(text))
    return out


def test_text_gives_the_first_equal_copy() -> None:
    shared = Shared()
    first = fresh("batch.kubernetes.io/job-name")
    assert shared.text(first) is first
    again = fresh("batch.kubernetes.io/job-name")
    assert again is not first and shared.text(again) is first
    assert len(shared) == 1


def test_equal_flat_mappings_are_shared_and_another_order_is_kept_apart() -> None:
    shared = Shared()
    a = shared.mapping({"key": fresh("node.kubernetes.io/not-ready"), "tolerationSeconds": 300})
    b = shared.mapping({"key": fresh("node.kubernetes.io/not-ready"), "tolerationSeconds": 300})
    assert a is b and a == {"key": "node.kubernetes.io/not-ready", "tolerationSeconds": 300}
    assert shared.mapping({"key": "other"}) is not a
    reordered = shared.mapping({"tolerationSeconds": 300, "key": "node.kubernetes.io/not-ready"})
    assert reordered == a and reordered is not a  # no sort per pod: the server keeps one order


def test_a_mapping_with_nested_values_is_copied_not_shared() -> None:
    shared = Shared()
    nested: dict[str, Any] = {"key": "k", "extra": {"x": 1}}
    a, b = shared.mapping(nested), shared.mapping(nested)
    assert a == nested and a is not nested and a is not b
    assert len(shared) == 0


def test_the_table_is_emptied_when_full_and_sharing_starts_over() -> None:
    shared = Shared(limit=3)
    for word in ("a", "b", "c"):
        shared.text(fresh(word))
    assert len(shared) == 3
    d = fresh("d")
    assert shared.text(d) is d and len(shared) == 1  # emptied, then d kept
    a = fresh("a")
    assert shared.text(a) is a  # the old copy of "a" is forgotten


def test_equal_values_are_shared_apart_from_mappings() -> None:
    shared = Shared()
    gates = (fresh("kueue.x-k8s.io/elastic-job"),)
    assert shared.value(gates) is gates
    again = (fresh("kueue.x-k8s.io/elastic-job"),)
    assert shared.value(again) is gates
    # an empty tuple is the key of an empty mapping too: each keeps its own kind of value
    empty_map = shared.mapping({})
    assert shared.value(()) == () and shared.mapping({}) is empty_map == {}


def test_a_limit_below_one_is_refused_and_one_is_the_smallest_taken() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Shared(limit=0)
    one = Shared(limit=1)  # keeps the last value only
    first = one.text(fresh("job-name"))
    assert one.text(fresh("job-name")) is first and len(one) == 1
    one.text("controller-uid")
    assert len(one) == 1 and one.text(fresh("job-name")) is not first


def pod(name: str, index: int) -> dict[str, Any]:
    raw = {
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "uid": f"uid-{name}",
            "resourceVersion": "7",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {"batch.kubernetes.io/controller-uid": "job-uid", "index": str(index)},
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": "job", "uid": "job-uid"}
            ],
        },
        "spec": {
            "schedulingGates": [{"name": "example.com/gate"}],
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists"}],
        },
        "status": {"phase": "Pending"},
    }
    decoded: dict[str, Any] = json.loads(json.dumps(raw))  # no string shared with another pod
    return decoded


def test_two_pods_of_one_job_share_what_they_repeat() -> None:
    a, b = parse_pod(pod("p-0", 0)), parse_pod(pod("p-1", 1))
    assert a.namespace is b.namespace and a.creation_timestamp is b.creation_timestamp
    assert a.phase is b.phase and a.gates[0] is b.gates[0]
    (ka, va), (kb, vb) = next(iter(a.labels.items())), next(iter(b.labels.items()))
    assert ka is kb and va is vb
    ra, rb = a.owner_refs[0], b.owner_refs[0]
    assert ra.uid is rb.uid is va and ra.name is rb.name and ra.api_version is rb.api_version
    assert a.tolerations[0] is b.tolerations[0]
    # the tuples themselves: one copy per owner, not an ObjectRef and two tuples per pod
    assert a.owner_refs is b.owner_refs and a.gates is b.gates
    assert a.node_selector is b.node_selector == {}
    assert a.labels["index"] == "0" and b.labels["index"] == "1"  # what differs stays apart
