"""A real local Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager) for tests.

The binaries are built from the upstream Go modules into a cache outside the repository
(:mod:`.build`), started on loopback with generated certificates (the bare plane in
:mod:`.plane`, one module per component, over :mod:`.process`, :mod:`.ports` and :mod:`.pki`),
made the cluster tests use by :mod:`.environment` (the plane, then the CRDs of :mod:`.crds`
and the real peers of :mod:`.peers`), run detached for manual work (:mod:`.detached`), and
offered to pytest suites as fixtures (:mod:`ungater_devtools.pytest_plugin`).  Names are imported lazily so that importing the package (which the
pytest plugin does in every run) stays cheap.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ungater_devtools.devcluster.build import (
        Binaries,
        ControlPlaneUnavailable,
        ensure_binaries,
        ensure_crds,
    )
    from ungater_devtools.devcluster.environment import LocalControlPlane
    from ungater_devtools.devcluster.process import ControlPlaneStartError

__all__ = [
    "Binaries",
    "ControlPlaneStartError",
    "ControlPlaneUnavailable",
    "LocalControlPlane",
    "ensure_binaries",
    "ensure_crds",
]

_LAZY = {
    "Binaries": "ungater_devtools.devcluster.build",
    "ControlPlaneUnavailable": "ungater_devtools.devcluster.build",
    "ensure_binaries": "ungater_devtools.devcluster.build",
    "ensure_crds": "ungater_devtools.devcluster.build",
    "ControlPlaneStartError": "ungater_devtools.devcluster.process",
    "LocalControlPlane": "ungater_devtools.devcluster.environment",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(module), name)
