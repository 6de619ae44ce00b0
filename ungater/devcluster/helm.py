"""Builds the helm CLI from its published Go module, for the deploy tests (``helm lint``/``template``).

No helm ships on PyPI or in Debian's main archive, but Go and the Go module proxy are at hand,
so ``helm.sh/helm/v3/cmd/helm`` is compiled once at a pinned version into
``~/.cache/ungater/tools/helm-<version>/helm`` (``$UNGATER_TOOLS_DIR`` moves the root), under a
file lock so that concurrent test runs build it once, and reused afterwards.  The binary is
written to a temporary name and renamed into place, so a file at the final path is always a
finished build.

``ensure_helm()`` returns ``None`` (and logs why) instead of raising when helm cannot be had:
the deploy tests then validate the committed plain manifests only.  ``$UNGATER_HELM`` names an
existing helm binary to use instead of building one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = [
    "HELM_MODULE",
    "HELM_VERSION",
    "HelmUnavailable",
    "build_helm",
    "ensure_helm",
    "find_helm",
    "helm_path",
    "tools_root",
]

Log = Callable[[str], None]

#: The helm module and the pinned release.  v3.21.4: a patch release of the 3.21 line, whose
#: go.mod asks for Go 1.26.0 and carries no ``replace`` directives, so ``go install
#: module/cmd/helm@version`` builds it as published (checked with Go 1.26.8).
HELM_MODULE = "helm.sh/helm/v3"
HELM_VERSION = "v3.21.4"

_GO_TIMEOUT_S = 60 * 60  # ~5-10 min on 2 cores with a cold module cache
_LOCK_WAIT_S = 60 * 60
_LOCK_POLL_S = 1.0


class HelmUnavailable(RuntimeError):
    """helm cannot be built or found on this machine (and why)."""


def _noop_log(_: str) -> None:
    return None


def tools_root() -> Path:
    """Root of the tools cache: ``$UNGATER_TOOLS_DIR`` or ``~/.cache/ungater/tools``."""
    env = os.environ.get("UNGATER_TOOLS_DIR")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "ungater" / "tools"


def helm_path(version: str = HELM_VERSION) -> Path:
    """Where the helm binary of ``version`` lives once built."""
    return tools_root() / f"helm-{version}" / "helm"


def _usable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def find_helm(version: str = HELM_VERSION) -> Path | None:
    """``$UNGATER_HELM`` if set and executable, else the cached build; never builds."""
    override = os.environ.get("UNGATER_HELM")
    if override:
        path = Path(override).expanduser()
        return path if _usable(path) else None
    path = helm_path(version)
    return path if _usable(path) else None


def _go_executable() -> str:
    go = os.environ.get("UNGATER_GO") or shutil.which("go")
    if not go:
        raise HelmUnavailable("the Go toolchain (`go`) is not on PATH; it is needed to build helm")
    return go


def _go_env(gobin: Path) -> dict[str, str]:
    env = dict(os.environ)
    flags = [f for f in env.get("GOFLAGS", "").split() if not f.startswith("-mod=")]
    env.update(
        {
            "CGO_ENABLED": "0",
            "GOTOOLCHAIN": "local",  # never fetch another toolchain behind the caller's back
            "GOWORK": "off",
            "GO111MODULE": "on",
            "GOBIN": str(gobin),
            # `go install pkg@version` refuses -mod=...; keep the caller's other flags
            "GOFLAGS": " ".join([*flags, "-buildvcs=false"]),
        }
    )
    return env


@contextlib.contextmanager
def _file_lock(path: Path, log: Log) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+") as handle:
        deadline = time.monotonic() + _LOCK_WAIT_S
        announced = False
        while True:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise HelmUnavailable(
                        f"another build held {path} for more than {_LOCK_WAIT_S}s"
                    ) from None
                if not announced:
                    log(f"waiting for another build to release {path}")
                    announced = True
                time.sleep(_LOCK_POLL_S)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def build_helm(version: str = HELM_VERSION, *, log: Log | None = None) -> Path:
    """``go install helm.sh/helm/v3/cmd/helm@version`` into the cache; the binary's path.

    Builds unconditionally (callers check :func:`find_helm` first) and raises
    :class:`HelmUnavailable` on failure, with the tail of the build log.
    """
    say = log or _noop_log
    target = helm_path(version)
    directory = target.parent
    directory.mkdir(parents=True, exist_ok=True)
    log_file = directory / "build.log"
    go = _go_executable()
    ldflags = f"-s -w -X {HELM_MODULE}/internal/version.version={version}"
    cmd = [go, "install", "-trimpath", "-ldflags", ldflags, f"{HELM_MODULE}/cmd/helm@{version}"]
    started = time.monotonic()
    say(f"go install {HELM_MODULE}/cmd/helm@{version} (log: {log_file}) ...")
    with tempfile.TemporaryDirectory(dir=directory, prefix=".gobin-") as gobin:
        with log_file.open("a") as err:
            err.write(f"\n$ GOBIN={gobin} {' '.join(cmd)}\n")
            err.flush()
            try:
                proc = subprocess.run(
                    cmd,
                    cwd=directory,
                    env=_go_env(Path(gobin)),
                    stdin=subprocess.DEVNULL,
                    stdout=err,
                    stderr=subprocess.STDOUT,
                    timeout=_GO_TIMEOUT_S,
                    check=False,
                )
            except subprocess.TimeoutExpired as exc:
                raise HelmUnavailable(f"building helm took more than {_GO_TIMEOUT_S}s") from exc
        built = Path(gobin) / "helm"
        if proc.returncode != 0 or not _usable(built):
            raise HelmUnavailable(
                f"`{' '.join(cmd)}` failed with exit code {proc.returncode} "
                f"(log: {log_file}):\n{_tail(log_file)}"
            )
        os.replace(built, target)
    seconds = round(time.monotonic() - started, 1)
    (directory / "build-seconds").write_text(f"{seconds}\n")
    say(f"built {target} in {seconds}s")
    return target


def ensure_helm(
    version: str = HELM_VERSION, *, build: bool = True, log: Log | None = None
) -> Path | None:
    """The helm binary: ``$UNGATER_HELM``, the cached build, or a fresh build (when ``build``).

    ``None`` when none can be had; the reason goes to ``log``.
    """
    say = log or _noop_log
    found = find_helm(version)
    if found is not None:
        return found
    if os.environ.get("UNGATER_HELM"):
        say(f"$UNGATER_HELM={os.environ['UNGATER_HELM']} is not an executable file")
        return None
    if not build:
        say(f"no cached helm at {helm_path(version)} and building is off")
        return None
    target = helm_path(version)
    try:
        _go_executable()
        with _file_lock(target.parent / "build.lock", say):
            if _usable(target):
                say(f"reusing {target} (built by another process)")
                return target
            return build_helm(version, log=say)
    except (HelmUnavailable, OSError) as exc:
        say(f"helm unavailable: {exc}")
        return None


def main() -> int:
    """``python -m ungater.devcluster.helm``: build (or reuse) helm and print its path."""
    import sys

    path = ensure_helm(log=lambda m: print(m, file=sys.stderr))
    if path is None:
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
