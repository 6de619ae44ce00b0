"""Builds kube-apiserver, kube-controller-manager and etcd from published Go modules.

No kube-apiserver ships on PyPI or in Debian, but Go and the Go module proxy are at hand, so
the binaries are compiled once into a cache directory outside the repository, keyed by the
pinned versions (see :mod:`ungater_devtools.devcluster.versions`), and reused afterwards.

Kubernetes' own ``go.mod`` points every ``k8s.io/<staging>`` module at ``./staging/...``
with a ``v0.0.0`` requirement, which only works inside its repository.  The build therefore
writes a small wrapper module that requires ``k8s.io/kubernetes`` and replaces each of those
staging modules with its published ``v0.X.Y`` twin; the list comes from the ``replace`` block
of that release's own ``go.mod``, read from the module cache.  etcd gets the same kind of
wrapper around ``go.etcd.io/etcd/server/v3`` (whose root package is etcd's ``main``).

This module also locates the upstream CRD manifests (Kueue, JobSet, KubeRay) in the Go
module cache; nothing is copied into the repository.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import string
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from ungater_devtools.devcluster import versions

__all__ = [
    "Binaries",
    "ControlPlaneUnavailable",
    "build_dir",
    "cache_root",
    "ensure_binaries",
    "ensure_crds",
    "find_binaries",
    "read_stamp",
    "staging_replacements",
]

Log = Callable[[str], None]

_STAMP = "stamp.json"
_STAMP_FORMAT = 2  # bump when the build recipe changes, to rebuild
_GO_STEP_TIMEOUT_S = 2 * 60 * 60  # one `go build` of kube-apiserver on 2 cores: ~10-20 min
_LOCK_WAIT_S = 3 * 60 * 60
_LOCK_POLL_S = 2.0
_BUILD_TAGS = "selinux,notest"
_VERSION_PACKAGES = ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
_STAGING_REPLACE = re.compile(r"^\s*(k8s\.io/[A-Za-z0-9._/-]+)\s*=>\s*\./staging/src/\1\s*$")


class ControlPlaneUnavailable(RuntimeError):
    """The control-plane binaries or CRDs cannot be had on this machine (and why)."""


@dataclass(frozen=True)
class Binaries:
    """Paths of the three control-plane executables and the versions they were built at."""

    bin_dir: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    etcd: Path
    kubernetes_version: str
    etcd_version: str


def _noop_log(_: str) -> None:
    return None


def cache_root() -> Path:
    """Root of the build cache: ``$UNGATER_CACHE_DIR`` or ``~/.cache/ungater/control-plane``."""
    env = os.environ.get("UNGATER_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "ungater" / "control-plane"


def build_dir(
    kubernetes_version: str = versions.KUBERNETES_VERSION,
    etcd_version: str = versions.ETCD_VERSION,
) -> Path:
    """The version-keyed directory that holds ``bin/``, the wrapper modules and build logs."""
    return cache_root() / f"k8s-{kubernetes_version}-etcd-{etcd_version}"


def _binaries_in(directory: Path) -> Binaries:
    bin_dir = directory / "bin"
    return Binaries(
        bin_dir=bin_dir,
        kube_apiserver=bin_dir / "kube-apiserver",
        kube_controller_manager=bin_dir / "kube-controller-manager",
        etcd=bin_dir / "etcd",
        kubernetes_version=versions.KUBERNETES_VERSION,
        etcd_version=versions.ETCD_VERSION,
    )


def _expected_stamp() -> dict[str, Any]:
    return {
        "format": _STAMP_FORMAT,
        "kubernetes": versions.KUBERNETES_VERSION,
        "etcd": versions.ETCD_VERSION,
    }


def _is_complete(directory: Path) -> bool:
    bins = _binaries_in(directory)
    stamp = directory / _STAMP
    if not stamp.is_file():
        return False
    try:
        recorded = json.loads(stamp.read_text())
    except (OSError, ValueError):
        return False
    if any(recorded.get(k) != v for k, v in _expected_stamp().items()):
        return False
    return all(
        p.is_file() and os.access(p, os.X_OK)
        for p in (bins.kube_apiserver, bins.kube_controller_manager, bins.etcd)
    )


def find_binaries() -> Binaries | None:
    """The cached binaries if a finished build exists; never builds."""
    directory = build_dir()
    return _binaries_in(directory) if _is_complete(directory) else None


def _go_executable() -> str:
    go = os.environ.get("UNGATER_GO") or shutil.which("go")
    if not go:
        raise ControlPlaneUnavailable(
            "the Go toolchain (`go`) is not on PATH; it is needed to build kube-apiserver, "
            "kube-controller-manager and etcd from Go modules"
        )
    return go


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "CGO_ENABLED": "0",
            "GOTOOLCHAIN": "local",  # never fetch another toolchain behind the caller's back
            "GOWORK": "off",
            "GOFLAGS": " ".join(
                f for f in (env.get("GOFLAGS", ""), "-mod=mod", "-buildvcs=false") if f
            ),
        }
    )
    return env


def _run_go(args: list[str], *, cwd: Path, log_file: Path | None = None) -> str:
    """Run ``go ARGS`` in ``cwd``; return stdout.  Stderr goes to ``log_file`` if given."""
    cmd = [_go_executable(), *args]
    cwd.mkdir(parents=True, exist_ok=True)
    try:
        with contextlib.ExitStack() as stack:
            if log_file is not None:
                err: Any = stack.enter_context(log_file.open("a"))
                err.write(f"\n$ (cd {cwd} && {' '.join(cmd)})\n")
                err.flush()
            else:
                err = subprocess.PIPE
            proc = subprocess.run(
                cmd,
                cwd=cwd,
                env=_go_env(),
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                timeout=_GO_STEP_TIMEOUT_S,
                check=False,
            )
    except subprocess.TimeoutExpired as exc:
        raise ControlPlaneUnavailable(
            f"`{' '.join(cmd)}` did not finish within {_GO_STEP_TIMEOUT_S}s"
        ) from exc
    if proc.returncode != 0:
        detail = proc.stderr if log_file is None else _tail(log_file)
        raise ControlPlaneUnavailable(
            f"`{' '.join(cmd)}` failed with exit code {proc.returncode}"
            + (f" (log: {log_file})" if log_file else "")
            + f":\n{detail}"
        )
    return proc.stdout


_HEARTBEAT_S = 30.0


def run_go_with_progress(
    cmd: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    log_file: Path,
    what: str,
    log: Log,
    error: type[Exception] = ControlPlaneUnavailable,
    timeout: float = _GO_STEP_TIMEOUT_S,
    heartbeat: float = _HEARTBEAT_S,
) -> None:
    """Run a long ``go build -v`` with its output in ``log_file``, saying every ``heartbeat``
    seconds how long it has run and how many packages it has compiled (``-v`` prints one line
    per package), so a cold build of many minutes is never silent."""
    cwd.mkdir(parents=True, exist_ok=True)
    with log_file.open("a") as out:
        out.write(f"\n$ (cd {cwd} && {' '.join(cmd)})\n")
        out.flush()
        start_offset = out.tell()
        started = time.monotonic()
        proc = subprocess.Popen(
            cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
        )
        try:
            while True:
                try:
                    proc.wait(timeout=heartbeat)
                    break
                except subprocess.TimeoutExpired:
                    elapsed = time.monotonic() - started
                    if elapsed > timeout:
                        proc.kill()
                        proc.wait(timeout=10)
                        raise error(
                            f"`{' '.join(cmd)}` did not finish within {timeout:.0f}s"
                        ) from None
                    done, last = _compiled_since(log_file, start_offset)
                    log(
                        f"  ... {what}: {_minutes(elapsed)} elapsed, {done} packages compiled"
                        + (f" (last: {last})" if last else "")
                    )
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    if proc.returncode != 0:
        raise error(
            f"`{' '.join(cmd)}` failed with exit code {proc.returncode} (log: {log_file}):\n"
            f"{_tail(log_file)}"
        )


def _compiled_since(log_file: Path, offset: int) -> tuple[int, str]:
    try:
        with log_file.open("rb") as handle:
            handle.seek(offset)
            lines = [ln for ln in handle.read().decode(errors="replace").splitlines() if ln]
    except OSError:
        return 0, ""
    packages = [ln for ln in lines if " " not in ln.strip()]
    return len(packages), (packages[-1].strip() if packages else "")


def _minutes(seconds: float) -> str:
    whole = int(seconds)
    return f"{whole // 60}m{whole % 60:02d}s"


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _download(
    module: str, version: str, *, cwd: Path, log_file: Path | None = None
) -> dict[str, Any]:
    """``go mod download -json module@version``: where the module cache keeps it."""
    out = _run_go(["mod", "download", "-json", f"{module}@{version}"], cwd=cwd, log_file=log_file)
    info: dict[str, Any] = json.loads(out)
    if info.get("Error"):
        raise ControlPlaneUnavailable(f"cannot download {module}@{version}: {info['Error']}")
    return info


@contextlib.contextmanager
def file_lock(
    path: Path,
    log: Log,
    error: type[Exception] = ControlPlaneUnavailable,
    wait: float = _LOCK_WAIT_S,
    poll: float = _LOCK_POLL_S,
) -> Iterator[None]:
    """An exclusive ``flock`` on ``path``, so two builders never build into one directory;
    waits at most ``wait`` seconds, then raises ``error``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+") as handle:
        deadline = time.monotonic() + wait
        announced = False
        while True:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise error(f"another build held {path} for more than {wait}s") from None
                if not announced:
                    log(f"waiting for another build to release {path}")
                    announced = True
                time.sleep(poll)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _read_go_mod(path: Path) -> str:
    return path.read_text()


def _go_directive(go_mod: str) -> str:
    match = re.search(r"^go\s+(\S+)\s*$", go_mod, re.MULTILINE)
    return match.group(1) if match else "1.24"


def _godebug_lines(go_mod: str) -> str:
    lines = [ln for ln in go_mod.splitlines() if ln.startswith("godebug ")]
    return ("\n" + "\n".join(lines) + "\n") if lines else ""


def staging_replacements(go_mod: str, kubernetes_version: str) -> list[tuple[str, str]]:
    """Pairs ``(k8s.io/<staging>, v0.X.Y)`` from the ``replace`` block of Kubernetes' go.mod."""
    match = re.fullmatch(r"v1\.(\d+)\.(\d+)(-[0-9A-Za-z.-]+)?", kubernetes_version)
    if not match:
        raise ValueError(f"not a Kubernetes release version: {kubernetes_version}")
    published = f"v0.{match.group(1)}.{match.group(2)}{match.group(3) or ''}"
    pairs: list[tuple[str, str]] = []
    in_block = False
    for line in go_mod.splitlines():
        stripped = line.strip()
        if stripped.startswith("replace ("):
            in_block = True
            continue
        if in_block and stripped == ")":
            in_block = False
            continue
        candidate = stripped[len("replace ") :] if stripped.startswith("replace ") else stripped
        if in_block or stripped.startswith("replace "):
            found = _STAGING_REPLACE.match(candidate)
            if found:
                pairs.append((found.group(1), published))
    if not pairs:
        raise ControlPlaneUnavailable("found no staging replacements in the Kubernetes go.mod")
    return pairs


def _render_go_mod(
    *,
    name: str,
    what: str,
    module: str,
    version: str,
    go_directive: str,
    godebug: str,
    replacements: list[tuple[str, str]],
    tools: list[str],
) -> str:
    template = string.Template(
        resources.files("ungater_devtools.devcluster").joinpath("wrapper_gomod.go.tmpl").read_text()
    )
    replace = ""
    if replacements:
        body = "\n".join(f"\t{mod} => {mod} {ver}" for mod, ver in replacements)
        replace = f"\nreplace (\n{body}\n)\n"
    return template.substitute(
        name=name,
        what=what,
        module=module,
        version=version,
        go_directive=go_directive,
        godebug=godebug,
        replace=replace,
        tools="\n".join(f"\t{t}" for t in tools),
    )


def _write_wrapper(src: Path, go_mod_text: str) -> None:
    src.mkdir(parents=True, exist_ok=True)
    go_mod = src / "go.mod"
    if not go_mod.exists() or go_mod.read_text() != go_mod_text:
        go_mod.write_text(go_mod_text)
        (src / "go.sum").unlink(missing_ok=True)


def _release_date(info: dict[str, Any]) -> str:
    try:
        stamp = json.loads(Path(info["Info"]).read_text())["Time"]
        return str(stamp)
    except (KeyError, OSError, ValueError):
        return "1970-01-01T00:00:00Z"


def _kubernetes_ldflags(version: str, build_date: str) -> str:
    match = re.fullmatch(r"v(\d+)\.(\d+)\..*", version)
    major, minor = (match.group(1), match.group(2)) if match else ("", "")
    values = {
        "gitVersion": version,
        "gitMajor": major,
        "gitMinor": minor,
        "gitTreeState": "clean",
        "gitCommit": "",  # a module zip carries no commit; better empty than "$Format:%H$"
        "buildDate": build_date,
    }
    flags = ["-s", "-w"]
    for package in _VERSION_PACKAGES:
        flags.extend(f"-X {package}.{key}={value}" for key, value in values.items())
    return " ".join(flags)


def _go_build(
    src: Path, package: str, out: Path, ldflags: str, log_file: Path, log: Log = _noop_log
) -> None:
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.unlink(missing_ok=True)
    cmd = [
        _go_executable(),
        "build",
        "-v",
        "-p",
        "2",
        "-trimpath",
        "-tags",
        _BUILD_TAGS,
        "-ldflags",
        ldflags,
        "-o",
        str(tmp),
        package,
    ]
    run_go_with_progress(cmd, cwd=src, env=_go_env(), log_file=log_file, what=out.name, log=log)
    os.replace(tmp, out)


def _build_all(directory: Path, log: Log) -> dict[str, Any]:
    bins = _binaries_in(directory)
    bins.bin_dir.mkdir(parents=True, exist_ok=True)
    log_file = directory / "build.log"
    log(f"building into {bins.bin_dir} (go output: {log_file})")
    timings: dict[str, float] = {}

    started = time.monotonic()
    k8s_src = directory / "src" / "kubernetes"
    k8s_info = _download(
        versions.KUBERNETES_MODULE, versions.KUBERNETES_VERSION, cwd=directory, log_file=log_file
    )
    k8s_go_mod = _read_go_mod(Path(k8s_info["GoMod"]))
    _write_wrapper(
        k8s_src,
        _render_go_mod(
            name="kubernetes",
            what="kube-apiserver and kube-controller-manager",
            module=versions.KUBERNETES_MODULE,
            version=versions.KUBERNETES_VERSION,
            go_directive=_go_directive(k8s_go_mod),
            godebug=_godebug_lines(k8s_go_mod),
            replacements=staging_replacements(k8s_go_mod, versions.KUBERNETES_VERSION),
            tools=[
                f"{versions.KUBERNETES_MODULE}/cmd/kube-apiserver",
                f"{versions.KUBERNETES_MODULE}/cmd/kube-controller-manager",
            ],
        ),
    )
    ldflags = _kubernetes_ldflags(versions.KUBERNETES_VERSION, _release_date(k8s_info))
    for name, out in (
        ("kube-apiserver", bins.kube_apiserver),
        ("kube-controller-manager", bins.kube_controller_manager),
    ):
        step = time.monotonic()
        log(f"go build {name} {versions.KUBERNETES_VERSION} ...")
        _go_build(k8s_src, f"{versions.KUBERNETES_MODULE}/cmd/{name}", out, ldflags, log_file, log)
        timings[name] = round(time.monotonic() - step, 1)
        log(f"  built {out} in {timings[name]}s")

    step = time.monotonic()
    etcd_src = directory / "src" / "etcd"
    etcd_info = _download(
        versions.ETCD_MODULE, versions.ETCD_VERSION, cwd=directory, log_file=log_file
    )
    etcd_go_mod = _read_go_mod(Path(etcd_info["GoMod"]))
    _write_wrapper(
        etcd_src,
        _render_go_mod(
            name="etcd",
            what="etcd",
            module=versions.ETCD_MODULE,
            version=versions.ETCD_VERSION,
            go_directive=_go_directive(etcd_go_mod),
            godebug=_godebug_lines(etcd_go_mod),
            replacements=[],
            tools=[versions.ETCD_MODULE],
        ),
    )
    log(f"go build etcd {versions.ETCD_VERSION} ...")
    etcd_ldflags = f"-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=module-{versions.ETCD_VERSION}"
    _go_build(etcd_src, versions.ETCD_MODULE, bins.etcd, etcd_ldflags, log_file, log)
    timings["etcd"] = round(time.monotonic() - step, 1)
    log(f"  built {bins.etcd} in {timings['etcd']}s")
    timings["total"] = round(time.monotonic() - started, 1)

    go_version = _run_go(["env", "GOVERSION"], cwd=directory).strip()
    stamp = {
        **_expected_stamp(),
        "go": go_version,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": timings,
        "sizes": {
            p.name: p.stat().st_size
            for p in (bins.kube_apiserver, bins.kube_controller_manager, bins.etcd)
        },
    }
    (directory / _STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
    return stamp


def ensure_binaries(*, build: bool = True, log: Log | None = None) -> Binaries:
    """Return the cached binaries, building them first if needed (and ``build`` allows).

    Raises :class:`ControlPlaneUnavailable` when they cannot be had.  Concurrent callers
    (e.g. pytest-xdist workers) serialise on a file lock; the losers reuse the winner's build.
    """
    say = log or _noop_log
    directory = build_dir()
    if _is_complete(directory):
        say(f"reusing {directory / 'bin'}")
        return _binaries_in(directory)
    if not build:
        raise ControlPlaneUnavailable(f"no finished build in {directory}")
    _go_executable()
    with file_lock(directory / "build.lock", say):
        if _is_complete(directory):
            say(f"reusing {directory / 'bin'} (built by another process)")
        else:
            _build_all(directory, say)
    return _binaries_in(directory)


def read_stamp() -> dict[str, Any] | None:
    """What the last finished build recorded (versions, timings, sizes), if any."""
    try:
        data: dict[str, Any] = json.loads((build_dir() / _STAMP).read_text())
    except (OSError, ValueError):
        return None
    return data


def ensure_crds(*, log: Log | None = None) -> list[Path]:
    """Download the pinned CRD modules and return the CRD manifests inside the module cache."""
    say = log or _noop_log
    workdir = cache_root()
    found: list[Path] = []
    for crd in versions.CRD_MODULES:
        info = _download(crd.module, crd.version, cwd=workdir)
        root = Path(info["Dir"])
        for rel in crd.paths:
            path = root / rel
            if not path.is_file():
                raise ControlPlaneUnavailable(f"{crd.module}@{crd.version} has no {rel}")
            say(f"CRD {path}")
            found.append(path)
    return found
