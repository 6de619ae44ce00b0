"""The two patches ungater sends a pod, applied as the API server applies a JSON patch: the
release tests the pod's version and our gate, the fence changes the pod only if it is still
at the version a release tested, so that release can never apply afterwards."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.fakekube import apply_json_patch
from tests.unit.podfactory import GATE, job, job_pod
from ungater._decide.decision import Release
from ungater._decide.patches import FENCE_ANNOTATION, fence_patch, release_patch
from ungater._decide.podsetupdates import NO_CHANGES
from ungater._kube.client import ApiError
from ungater._model.views import parse_pod


def pod_at(rv: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    raw = job_pod(job("train", parallelism=2), index=0)
    raw["metadata"]["resourceVersion"] = rv
    if annotations is None:
        raw["metadata"].pop("annotations", None)
    else:
        raw["metadata"]["annotations"] = dict(annotations)
    return raw


def release_of(raw: dict[str, Any]) -> Release:
    view = parse_pod(raw)
    return Release(view, "main", GATE, view.gates.index(GATE), NO_CHANGES)


def test_a_release_applies_only_to_the_pod_at_the_version_it_was_decided_on() -> None:
    raw = pod_at("7", {"a": "1"})
    ops = release_patch(release_of(raw))
    assert ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "7"}
    released = apply_json_patch(raw, ops)
    assert GATE not in str(released["spec"].get("schedulingGates"))
    moved = copy.deepcopy(raw)
    moved["metadata"]["resourceVersion"] = "8"
    with pytest.raises(ApiError) as refused:
        apply_json_patch(moved, ops)
    assert refused.value.status == 422


def test_a_release_whose_gate_is_not_where_it_was_is_refused() -> None:
    raw = pod_at("7", {"a": "1"})
    ops = release_patch(release_of(raw))
    raw["spec"]["schedulingGates"] = [{"name": "example.com/other"}]  # same version, other gate
    with pytest.raises(ApiError) as refused:
        apply_json_patch(raw, ops)
    assert refused.value.status == 422


@pytest.mark.parametrize("annotations", [None, {}, {"a": "1"}])
def test_the_fence_moves_the_pod_on_and_a_late_release_can_never_apply(
    annotations: dict[str, str] | None,
) -> None:
    raw = pod_at("7", annotations)
    late = release_patch(release_of(raw))
    fenced = apply_json_patch(raw, fence_patch("7", bool(annotations)))
    assert fenced["metadata"]["annotations"] == {**(annotations or {}), FENCE_ANNOTATION: "7"}
    assert fenced["spec"] == raw["spec"]  # the gate stays: nothing else changes
    fenced["metadata"]["resourceVersion"] = "9"  # the API server's new version for the write
    with pytest.raises(ApiError):
        apply_json_patch(fenced, late)


def test_the_fence_is_refused_when_the_pod_moved_on_already() -> None:
    raw = pod_at("8", {"a": "1"})
    with pytest.raises(ApiError) as refused:
        apply_json_patch(raw, fence_patch("7", True))
    assert refused.value.status == 422


def test_the_fake_refuses_an_operation_it_does_not_know() -> None:
    with pytest.raises(ApiError) as refused:
        apply_json_patch(pod_at("7"), [{"op": "frobnicate", "path": "/metadata/name"}])
    assert refused.value.status == 422
