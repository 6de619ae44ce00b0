"""Where Kueue's API lives: its group and the Workload resource at a served version.

One home for these coordinates, so the controller, the reconciler's view, Events,
``explain`` and ``audit`` all address the same resource; and for the gates Kueue removes
itself, which ``mode: auto`` releases only behind an admission policy (``ungater._controller.modes``).
"""

from __future__ import annotations

from ungater._kube.client import Resource

__all__ = ["KUEUE_GROUP", "SELF_RELEASED_GATES", "workload_resource"]

KUEUE_GROUP = "kueue.x-k8s.io"
#: Gates Kueue removes itself: every Kueue from v0.17.1 that makes Workload slices runs its own
#: count-aware ungater for this one (``pkg/controller/elasticjobs``, on by default from v0.18).
SELF_RELEASED_GATES = frozenset({"kueue.x-k8s.io/elastic-job"})


def workload_resource(version: str) -> Resource:
    """Kueue's Workloads at one served version (``v1beta1``, ``v1beta2``)."""
    return Resource(KUEUE_GROUP, version, "workloads", "Workload")
