"""The JSON patch that releases one pod. Pure: a Release in, RFC 6902 operations out.

One patch per pod, applied by the API server whole or not at all: it removes exactly our gate
(guarded by a ``test`` of its name at its index, so a concurrent change fails the request
instead of removing another controller's gate) and applies the pod set updates the decision
attached, so a pod is never schedulable without them.
"""

from __future__ import annotations

from typing import Any

from ungater._decision import Release

__all__ = ["release_patch"]


def _pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def release_patch(release: Release) -> list[dict[str, Any]]:
    """One JSON patch (atomic: all of it or nothing) that removes exactly our gate and applies
    the pod set updates. The ``test`` fails the request if the gate list changed under us,
    instead of removing someone else's gate."""
    path = f"/spec/schedulingGates/{release.gate_index}"
    ops: list[dict[str, Any]] = [
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
