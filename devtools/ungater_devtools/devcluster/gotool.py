"""Small Go programs of this repository (a rule checker, a dashboard query runner), built
against a pinned Go module into the tools cache on first use.

Each program is one ``main.go`` kept in the repository; the build writes a throw-away
``go.mod`` requiring the pinned module, lets ``go mod tidy`` pick the rest from that module's
own ``go.mod``, and builds. The binary is keyed by the pin and the hash of ``main.go``, so an
edit rebuilds it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

from ungater_devtools.devcluster.build import ControlPlaneUnavailable, file_lock
from ungater_devtools.devcluster.helm import tools_root

__all__ = ["ensure_go_tool"]

_TIMEOUT_S = 30 * 60


def ensure_go_tool(name: str, source: Path, module: str, version: str, go_directive: str) -> Path:
    """The built program ``name`` from ``source`` (a ``main.go``) against ``module@version``."""
    key = hashlib.sha256(source.read_bytes()).hexdigest()[:12]
    directory = tools_root() / f"{name}-{module.rsplit('/', 1)[-1]}-{version}"
    binary, stamp = directory / name, directory / "stamp.json"

    def complete() -> bool:
        try:
            return json.loads(stamp.read_text()).get("source") == key and binary.is_file()
        except (OSError, ValueError):
            return False

    if complete():
        return binary
    go = os.environ.get("UNGATER_GO") or shutil.which("go")
    if not go:
        raise ControlPlaneUnavailable(f"the Go toolchain is needed to build {name}")
    directory.mkdir(parents=True, exist_ok=True)
    with file_lock(directory / "build.lock", lambda _: None):
        if complete():
            return binary
        src = directory / "src"
        src.mkdir(exist_ok=True)
        shutil.copyfile(source, src / "main.go")
        (src / "go.mod").write_text(
            f"// written by ungater_devtools.devcluster.gotool; lives in the tools cache only\n"
            f"module ungater.invalid/{name}\n\ngo {go_directive}\n\nrequire {module} {version}\n"
        )
        env = {**os.environ, "CGO_ENABLED": "0", "GOTOOLCHAIN": "local", "GOWORK": "off"}
        env.pop("GOFLAGS", None)
        log = directory / "build.log"
        with log.open("w") as out:
            for cmd in (
                [go, "mod", "tidy"],
                [go, "build", "-p", "2", "-trimpath", "-o", str(binary), "."],
            ):
                proc = subprocess.run(
                    cmd, cwd=src, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=_TIMEOUT_S
                )
                if proc.returncode != 0:
                    raise ControlPlaneUnavailable(
                        f"`{' '.join(cmd)}` failed (log: {log}):\n{log.read_text()[-3000:]}"
                    )
        stamp.write_text(json.dumps({"source": key, "module": f"{module}@{version}"}) + "\n")
    return binary
