"""Installing CustomResourceDefinitions on a running plane and waiting until the API server
serves them (Established); a step after the plane is up, the way envtest installs its CRDs."""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Sequence
from pathlib import Path

from ungater_devtools.devcluster.plane.plane import ControlPlane
from ungater_devtools.devcluster.process import ControlPlaneStartError

__all__ = ["install_crds"]

_BASE = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
_POLL_S = 0.2


def install_crds(
    plane: ControlPlane, paths: Sequence[Path], *, timeout: float | None = None
) -> list[str]:
    """Create (or replace) each CRD manifest and wait until all are Established."""
    import yaml

    names: list[str] = []
    for path in paths:
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            name = doc["metadata"]["name"]
            status, result = plane.request("POST", _BASE, doc, timeout=30)
            if status == 409:
                status, current = plane.request("GET", f"{_BASE}/{name}")
                doc["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                status, result = plane.request("PUT", f"{_BASE}/{name}", doc, timeout=30)
            if status not in (200, 201):
                raise ControlPlaneStartError(f"installing CRD {name} from {path}: {result}")
            names.append(name)
    deadline = time.monotonic() + (timeout or plane.startup_timeout)
    pending = list(names)
    while pending:
        still = []
        for name in pending:
            status, crd = plane.request("GET", f"{_BASE}/{urllib.parse.quote(name)}")
            conditions = (
                ((crd.get("status") or {}).get("conditions") or []) if status == 200 else []
            )
            if not any(
                c.get("type") == "Established" and c.get("status") == "True" for c in conditions
            ):
                still.append(name)
        pending = still
        if pending and time.monotonic() > deadline:
            raise ControlPlaneStartError(f"CRDs not Established in time: {pending}")
        if pending:
            time.sleep(_POLL_S)
    return names
