"""Tests share a control plane (one per pytest worker, per Kueue version), so each keeps to its
own namespace: a cluster-scoped object a test creates and leaves behind can change what the
next test on that plane sees (a policy that refuses a patch, a ClusterQueue that lends quota, a
ClusterRole the next chart install collides with). ``leaks`` names what a test left.

Namespaces count too, unless being deleted: the namespace fixtures delete theirs at teardown,
and the API server finishes that deletion in the background.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["CLUSTER_SCOPED", "KUEUE_SCOPED", "cluster_objects", "leaks"]

#: The cluster-scoped kinds a test here creates, or could, by their list paths.
CLUSTER_SCOPED = (
    "/api/v1/namespaces",
    "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies",
    "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings",
    "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
    "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
    "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
    "/apis/scheduling.k8s.io/v1/priorityclasses",
)
#: Kueue's own cluster-scoped kinds, listed on the planes that run it.
KUEUE_SCOPED = (
    "/apis/kueue.x-k8s.io/v1beta2/clusterqueues",
    "/apis/kueue.x-k8s.io/v1beta2/resourceflavors",
    "/apis/kueue.x-k8s.io/v1beta2/workloadpriorityclasses",
)

RETRIES = 150
RETRY_S = 0.2

#: Names only: a CRD list in full is megabytes of schema.
_METADATA_ONLY = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"


class Plane(Protocol):
    def request(
        self, method: str, path: str, body: Any = None, *, accept: str = ...
    ) -> tuple[int, Any]: ...


def _list(plane: Plane, path: str, sleep: Callable[[float], None]) -> tuple[int, Any]:
    """One list, asked again while the server answers 429: a CRD's storage is still
    initializing for a while after the plane started (``RETRIES`` times, ``RETRY_S`` apart)."""
    for _ in range(RETRIES):
        status, body = plane.request("GET", path, accept=_METADATA_ONLY)
        if status != 429:
            break
        sleep(RETRY_S)
    return status, body


def cluster_objects(
    plane: Plane, paths: tuple[str, ...], sleep: Callable[[float], None] = time.sleep
) -> set[str]:
    """``path/name`` of every object of ``paths`` that is not being deleted."""
    found: set[str] = set()
    for path in paths:
        status, body = _list(plane, path, sleep)
        if status == 404:  # the kind is not served on this plane (e.g. no Kueue CRDs)
            continue
        if status != 200:
            raise RuntimeError(f"listing {path}: HTTP {status}: {str(body)[:200]}")
        for item in body.get("items") or ():  # the real server sends null for an empty list
            meta = item.get("metadata", {})
            if not meta.get("deletionTimestamp"):
                found.add(f"{path.rsplit('/', 1)[-1]}/{meta.get('name')}")
    return found


def leaks(before: set[str], after: set[str]) -> list[str]:
    """What exists after a test that did not before it, sorted."""
    return sorted(after - before)
