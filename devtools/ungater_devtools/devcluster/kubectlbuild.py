"""kubectl of the control plane's Kubernetes version, built from the same Go module.

Only the tests of the kubectl plugin need it (``kubectl ungater ...`` run by the real kubectl,
which finds ``kubectl-ungater`` on ``PATH``), so it is built on first use, not with the control
plane. It reuses the control plane's wrapper module (``src/kubernetes``: the same pins and
staging replacements) in a copy of its own, because kubectl needs a few modules the server
binaries do not (``-mod=mod`` adds them to the copy's ``go.sum``). The binary lands in
``<build dir>/kubectl/bin/kubectl`` with a ``stamp.json`` written last.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from ungater_devtools.devcluster import versions
from ungater_devtools.devcluster.build import (
    ControlPlaneUnavailable,
    build_dir,
    ensure_binaries,
    file_lock,
    run_go_with_progress,
)

__all__ = ["ensure_kubectl", "find_kubectl"]

Log = Callable[[str], None]
_PACKAGE = f"{versions.KUBERNETES_MODULE}/cmd/kubectl"


def _directory() -> Path:
    return build_dir() / "kubectl"


def _stamp() -> dict[str, str]:
    return {"package": _PACKAGE, "version": versions.KUBERNETES_VERSION}


def find_kubectl() -> Path | None:
    """The cached kubectl, or None; never builds."""
    path = _directory() / "bin" / "kubectl"
    try:
        recorded = json.loads((_directory() / "stamp.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(recorded, dict) or any(recorded.get(k) != v for k, v in _stamp().items()):
        return None
    return path if path.is_file() and os.access(path, os.X_OK) else None


def ensure_kubectl(*, log: Log | None = None) -> Path:
    """The cached kubectl, built first if need be (a few minutes on two cores)."""
    say = log or (lambda _: None)
    found = find_kubectl()
    if found is not None:
        return found
    go = os.environ.get("UNGATER_GO") or shutil.which("go")
    if not go:
        raise ControlPlaneUnavailable("the Go toolchain (`go`) is needed to build kubectl")
    ensure_binaries(log=say)  # writes the wrapper module this build starts from
    directory = _directory()
    with file_lock(build_dir() / "build.lock", say):
        found = find_kubectl()
        if found is not None:
            return found
        src = directory / "src"
        src.mkdir(parents=True, exist_ok=True)
        for name in ("go.mod", "go.sum"):
            shutil.copyfile(build_dir() / "src" / "kubernetes" / name, src / name)
        bin_dir = directory / "bin"
        bin_dir.mkdir(parents=True, exist_ok=True)
        tmp = bin_dir / ".kubectl.tmp"
        env = {
            **os.environ,
            "CGO_ENABLED": "0",
            "GOTOOLCHAIN": "local",
            "GOWORK": "off",
            "GOFLAGS": "-mod=mod -buildvcs=false",
        }
        started = time.monotonic()
        say(
            f"go build kubectl {versions.KUBERNETES_VERSION} (only the kubectl plugin tests use it)"
        )
        run_go_with_progress(
            [
                go,
                "build",
                "-v",
                "-p",
                "2",
                "-trimpath",
                "-ldflags",
                "-s -w",
                "-o",
                str(tmp),
                _PACKAGE,
            ],
            cwd=src,
            env=env,
            log_file=directory / "build.log",
            what="kubectl",
            log=say,
        )
        os.replace(tmp, bin_dir / "kubectl")
        seconds = round(time.monotonic() - started, 1)
        (directory / "stamp.json").write_text(json.dumps({**_stamp(), "seconds": seconds}) + "\n")
        say(f"  built {bin_dir / 'kubectl'} in {seconds}s")
    return bin_dir / "kubectl"
