"""Where Kueue's API lives: its group and the Workload resource at a served version.

One home for these coordinates, so the manager, the reconciler's quorum reads, Events,
``explain`` and ``audit`` all address the same resource.
"""

from __future__ import annotations

from ungater._kube import Resource

__all__ = ["KUEUE_GROUP", "workload_resource"]

KUEUE_GROUP = "kueue.x-k8s.io"


def workload_resource(version: str) -> Resource:
    """Kueue's Workloads at one served version (``v1beta1``, ``v1beta2``)."""
    return Resource(KUEUE_GROUP, version, "workloads", "Workload")
