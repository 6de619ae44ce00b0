"""The JSON patch that releases one pod. Pure: a Release in, RFC 6902 operations out.

One patch per pod, applied by the API server whole or not at all: it removes exactly our gate
(guarded by a ``test`` of its name at its index, so a concurrent change fails the request
instead of removing another controller's gate) and applies the pod set updates the decision
attached, so a pod is never schedulable without them.

Every release also tests the pod's ``resourceVersion`` as the decision saw it. A patch can be
committed after its client gave up (a timeout, a 504); the test makes such a late write fail
once the pod has changed in any way, and ``fence_patch`` is that change: written when an
outcome is unknown, it settles for good whether the release can still land.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ungater._decide.decision import Release
from ungater._model.views import PodView

__all__ = ["FENCE_ANNOTATION", "fence_patch", "release_patch", "resend"]

#: Written by ``fence_patch``: its value is the resourceVersion whose late release it fences.
FENCE_ANNOTATION = "ungater.dev/release-fence"


def _pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def release_patch(release: Release) -> list[dict[str, Any]]:
    """One JSON patch (atomic: all of it or nothing) that removes exactly our gate and applies
    the pod set updates. The ``test`` fails the request if the gate list changed under us,
    instead of removing someone else's gate."""
    path = f"/spec/schedulingGates/{release.gate_index}"
    ops: list[dict[str, Any]] = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": release.pod.resource_version},
        {"op": "test", "path": f"{path}/name", "value": release.gate},
        {"op": "remove", "path": path},
    ]
    pod, changes = release.pod, release.changes
    for field_path, wanted, have in (
        ("/metadata/labels", changes.labels, pod.labels),
        ("/metadata/annotations", changes.annotations, pod.annotations),
        ("/spec/nodeSelector", changes.node_selector, pod.node_selector),
    ):
        if not wanted:
            continue
        if not have:  # the map is absent (or empty): add it whole
            ops.append({"op": "add", "path": field_path, "value": dict(wanted)})
        else:
            ops.extend(
                {"op": "add", "path": f"{field_path}/{_pointer(k)}", "value": v}
                for k, v in wanted.items()
            )
    if changes.tolerations:
        if not pod.tolerations:
            ops.append(
                {"op": "add", "path": "/spec/tolerations", "value": list(changes.tolerations)}
            )
        else:
            ops.extend(
                {"op": "add", "path": "/spec/tolerations/-", "value": dict(t)}
                for t in changes.tolerations
            )
    return ops


def fence_patch(resource_version: str, has_annotations: bool) -> list[dict[str, Any]]:
    """A patch that changes the pod, if it is still at ``resource_version``, and nothing else:
    once it is applied, a release patch that tested that version can never be applied."""
    test = {"op": "test", "path": "/metadata/resourceVersion", "value": resource_version}
    if has_annotations:
        path = f"/metadata/annotations/{_pointer(FENCE_ANNOTATION)}"
        return [test, {"op": "add", "path": path, "value": resource_version}]
    value = {FENCE_ANNOTATION: resource_version}
    return [test, {"op": "add", "path": "/metadata/annotations", "value": value}]


def resend(release: Release, fresh: PodView) -> Release | None:
    """The same release on ``fresh`` (the pod read after the API server refused the patch),
    when nothing the decision read has changed but the resourceVersion and the gates of other
    writers; None when the pod must be decided on again.

    Two releasers of two gates on one pod (Kueue's and ours) refuse each other's first patch
    whenever they patch it at once: re-deciding after a backoff would cost a reconcile for a
    change no decision reads. Anything else (labels, annotations, phase, deletion, our gate
    gone, another pod by that name) goes back to the decision.
    """
    decided = release.pod
    if fresh.resource_version == decided.resource_version:
        return None  # the version did not move: the refusal was for something else
    if release.gate not in fresh.gates or fresh.deleting or fresh.terminal:
        return None
    same = replace(fresh, resource_version=decided.resource_version, gates=decided.gates)
    if same != decided:
        return None
    return replace(release, pod=fresh, gate_index=fresh.gates.index(release.gate))
