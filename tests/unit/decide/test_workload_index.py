"""The Workload index keeps the newest view it was given: a fresh read that got ahead of the
watch is not undone by the watch's late, older event."""

from __future__ import annotations

from tests.objects import workload
from ungater._decide.indexes import WorkloadIndex
from ungater._model.views import parse_workload

OWNER = {
    "apiVersion": "batch/v1",
    "kind": "Job",
    "metadata": {"name": "train", "namespace": "ml", "uid": "uid-train"},
}


def view(count: int, rv: str):  # type: ignore[no-untyped-def]
    raw = workload(OWNER, "train-a", count=count, admitted=count)
    raw["metadata"] |= {"uid": "uid-wl", "resourceVersion": rv}
    return parse_workload(raw)


def test_a_late_older_event_does_not_undo_a_fresh_read() -> None:
    index = WorkloadIndex()
    at_10, at_12, at_15 = view(4, "10"), view(1, "12"), view(1, "15")
    index.on_change(None, at_10)
    index.on_change(at_10, at_15)  # the quorum read
    index.on_change(at_10, at_12)  # the watch, late, with an older state
    assert index.for_owner("uid-train") == [at_15]
    index.on_change(at_12, view(2, "20"))  # newer events apply as usual
    assert [w.pod_sets[0].count for w in index.for_owner("uid-train")] == [2]
    index.on_change(view(2, "20"), None)  # and deletions always do
    assert index.for_owner("uid-train") == []


def test_resource_versions_that_are_not_integers_apply_in_arrival_order() -> None:
    index = WorkloadIndex()
    index.on_change(None, view(4, "b"))
    index.on_change(None, view(1, "a"))
    assert [w.pod_sets[0].count for w in index.for_owner("uid-train")] == [1]
