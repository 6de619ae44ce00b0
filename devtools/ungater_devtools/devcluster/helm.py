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

import argparse
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ungater_devtools.devcluster.build import file_lock

__all__ = [
    "HELM_MODULE",
    "HELM_VERSION",
    "PLAIN_FILES",
    "PLAIN_NAMESPACE",
    "PLAIN_RELEASE",
    "PLAIN_VALUES",
    "HelmUnavailable",
    "build_helm",
    "ensure_helm",
    "find_helm",
    "helm_path",
    "kube_version_ldflags",
    "render_plain_manifests",
    "run_helm",
    "split_documents",
    "template",
    "tools_root",
]

Log = Callable[[str], None]

#: The helm module and the pinned release.  v3.21.4: a patch release of the 3.21 line, whose
#: go.mod asks for Go 1.26.0 and carries no ``replace`` directives, so ``go install
#: module/cmd/helm@version`` builds it as published (checked with Go 1.26.8).
HELM_MODULE = "helm.sh/helm/v3"
HELM_VERSION = "v3.21.4"

_STAMP = "stamp.json"
_STAMP_FORMAT = 2  # bump when the build recipe changes, to rebuild
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


def _stamp(version: str) -> dict[str, object]:
    return {"format": _STAMP_FORMAT, "module": HELM_MODULE, "version": version}


def _is_complete(path: Path, version: str) -> bool:
    """A finished build of this recipe: the binary and a stamp that matches."""
    try:
        recorded = json.loads((path.parent / _STAMP).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(recorded, dict):
        return False
    return _usable(path) and all(recorded.get(k) == v for k, v in _stamp(version).items())


def find_helm(version: str = HELM_VERSION) -> Path | None:
    """``$UNGATER_HELM`` if set and executable, else the cached build; never builds."""
    override = os.environ.get("UNGATER_HELM")
    if override:
        path = Path(override).expanduser()
        return path if _usable(path) else None
    path = helm_path(version)
    return path if _is_complete(path, version) else None


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


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _run(cmd: list[str], *, cwd: Path, env: dict[str, str], log_file: Path) -> str:
    """Run ``cmd``; stdout back, stderr to ``log_file``; HelmUnavailable on failure."""
    with log_file.open("a") as err:
        err.write(f"\n$ {' '.join(cmd)}\n")
        err.flush()
        try:
            proc = subprocess.run(
                cmd,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                timeout=_GO_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise HelmUnavailable(f"`{' '.join(cmd)}` took more than {_GO_TIMEOUT_S}s") from exc
    if proc.returncode != 0:
        raise HelmUnavailable(
            f"`{' '.join(cmd)}` failed with exit code {proc.returncode} "
            f"(log: {log_file}):\n{_tail(log_file)}"
        )
    return proc.stdout


def kube_version_ldflags(go_mod: str) -> str:
    """The ``-X`` flags helm's own Makefile sets from its client-go version (v0.36 -> 1.36).

    They are the Kubernetes version ``helm template`` and ``helm lint`` assume when not told
    (``--kube-version``); unset, helm assumes v1.20.
    """
    match = re.search(r"^\s*k8s\.io/client-go\s+v0\.(\d+)\.\d+", go_mod, re.MULTILINE)
    if not match:
        return ""
    minor = match.group(1)
    return " ".join(
        f"-X {HELM_MODULE}/pkg/{pkg}.k8sVersion{part}={value}"
        for pkg in ("lint/rules", "chartutil")
        for part, value in (("Major", "1"), ("Minor", minor))
    )


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
    started = time.monotonic()
    say(f"go install {HELM_MODULE}/cmd/helm@{version} (log: {log_file}) ...")
    with tempfile.TemporaryDirectory(dir=directory, prefix=".gobin-") as gobin:
        env = _go_env(Path(gobin))
        info = json.loads(
            _run(
                [go, "mod", "download", "-json", f"{HELM_MODULE}@{version}"],
                cwd=directory,
                env=env,
                log_file=log_file,
            )
        )
        if info.get("Error"):
            raise HelmUnavailable(f"cannot download {HELM_MODULE}@{version}: {info['Error']}")
        go_mod = Path(info["GoMod"]).read_text()
        ldflags = " ".join(
            f
            for f in (
                "-s -w",
                f"-X {HELM_MODULE}/internal/version.version={version}",
                kube_version_ldflags(go_mod),
            )
            if f
        )
        cmd = [go, "install", "-trimpath", "-ldflags", ldflags, f"{HELM_MODULE}/cmd/helm@{version}"]
        _run(cmd, cwd=directory, env=env, log_file=log_file)
        built = Path(gobin) / "helm"
        if not _usable(built):
            raise HelmUnavailable(f"`{' '.join(cmd)}` left no helm binary in {gobin}")
        os.replace(built, target)
    seconds = round(time.monotonic() - started, 1)
    stamp = {
        **_stamp(version),
        "go": _run([go, "env", "GOVERSION"], cwd=directory, env=env, log_file=log_file).strip(),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": seconds,
    }
    (directory / _STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
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
        with file_lock(
            target.parent / "build.lock", say, HelmUnavailable, _LOCK_WAIT_S, _LOCK_POLL_S
        ):
            if _is_complete(target, version):
                say(f"reusing {target} (built by another process)")
                return target
            return build_helm(version, log=say)
    except (HelmUnavailable, OSError) as exc:
        say(f"helm unavailable: {exc}")
        return None


# -- running helm ------------------------------------------------------------------------------


def _helm_env(home: Path) -> dict[str, str]:
    """helm's cache, config and data dirs in ``home``: template and lint touch nothing else."""
    env = dict(os.environ)
    for var, sub in (("HELM_CACHE_HOME", "cache"), ("HELM_CONFIG_HOME", "config")):
        env[var] = str(home / sub)
    env["HELM_DATA_HOME"] = str(home / "data")
    env.pop("KUBECONFIG", None)  # template and lint never talk to a cluster
    return env


def run_helm(
    helm: Path,
    args: Sequence[str],
    *,
    values: Mapping[str, Any] | None = None,
    timeout: float = 120.0,
) -> subprocess.CompletedProcess[str]:
    """``helm ARGS [-f values.yaml]`` with private helm dirs; the finished process (not checked)."""
    import yaml

    with tempfile.TemporaryDirectory(prefix="ungater-helm-") as tmp:
        extra: list[str] = []
        if values is not None:
            path = Path(tmp) / "values.yaml"
            path.write_text(yaml.safe_dump(dict(values), sort_keys=False))
            extra = ["--values", str(path)]
        return subprocess.run(
            [str(helm), *args, *extra],
            env=_helm_env(Path(tmp)),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


def template(
    helm: Path,
    chart: Path,
    *,
    release: str = "ungater",
    namespace: str = "ungater-system",
    values: Mapping[str, Any] | None = None,
    kube_version: str | None = None,
) -> str:
    """``helm template``: the rendered manifests (a multi-document YAML stream)."""
    args = ["template", release, str(chart), "--namespace", namespace]
    if kube_version:
        args += ["--kube-version", kube_version]
    proc = run_helm(helm, args, values=values)
    if proc.returncode != 0:
        raise HelmUnavailable(f"helm template failed ({proc.returncode}):\n{proc.stderr}")
    return proc.stdout


# -- the plain manifests: `helm template` output, committed ------------------------------------

#: The values the plain manifests in deploy/manifests are rendered with.
PLAIN_VALUES: dict[str, Any] = {"createNamespace": True, "managedBy": "kubectl"}
PLAIN_RELEASE = "ungater"
PLAIN_NAMESPACE = "ungater-system"
#: Which file of deploy/manifests each kind goes to (`kubectl apply -f` reads them in order).
PLAIN_FILES: dict[str, tuple[str, ...]] = {
    "00-namespace.yaml": ("Namespace",),
    "10-rbac.yaml": ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"),
    "20-config.yaml": ("ConfigMap",),
    "30-controller.yaml": ("Deployment", "Service", "PodDisruptionBudget"),
}
_HEADER = (
    "# Generated from deploy/helm/ungater by `python -m ungater_devtools.devcluster.helm render-manifests`:\n"
    "# helm template {release} --namespace {namespace} --set {values}\n"
    "# Do not edit by hand: change the chart and render again. tests/integration/test_deploy.py\n"
    "# checks that these files and the chart agree.\n"
)


def _set_value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def split_documents(stream: str) -> list[str]:
    """The non-empty YAML documents of a ``helm template`` stream, as text."""
    docs = []
    for part in re.split(r"^---[ \t]*$", stream, flags=re.MULTILINE):
        body = part.strip("\n")
        if any(line.strip() and not line.lstrip().startswith("#") for line in body.splitlines()):
            docs.append(body + "\n")
    return docs


def render_plain_manifests(
    helm: Path, chart: Path, kube_version: str | None = None
) -> dict[str, str]:
    """File name -> content of deploy/manifests, rendered from the chart."""
    import yaml

    stream = template(
        helm,
        chart,
        release=PLAIN_RELEASE,
        namespace=PLAIN_NAMESPACE,
        values=PLAIN_VALUES,
        kube_version=kube_version,
    )
    by_kind: dict[str, list[str]] = {}
    for doc in split_documents(stream):
        kind = str((yaml.safe_load(doc) or {}).get("kind", ""))
        by_kind.setdefault(kind, []).append(doc)
    files: dict[str, str] = {}
    placed: set[str] = set()
    header = _HEADER.format(
        release=PLAIN_RELEASE,
        namespace=PLAIN_NAMESPACE,
        values=",".join(f"{k}={_set_value(v)}" for k, v in PLAIN_VALUES.items()),
    )
    for name, kinds in PLAIN_FILES.items():
        docs = [d for k in kinds for d in by_kind.get(k, [])]
        placed.update(kinds)
        if docs:
            files[name] = header + "".join(f"---\n{d}" for d in docs)
    unplaced = sorted(set(by_kind) - placed)
    if unplaced:
        raise HelmUnavailable(f"no file of deploy/manifests takes the kinds {unplaced}")
    return files


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m ungater_devtools.devcluster.helm",
        description="helm built from its Go module; the plain manifests rendered from the chart.",
    )
    p.add_argument(
        "action",
        nargs="?",
        default="build",
        choices=["build", "render-manifests"],
        help="build: build or reuse helm, print its path (default); "
        "render-manifests: rewrite DEPLOY_DIR/manifests from DEPLOY_DIR/helm/ungater",
    )
    p.add_argument("--deploy-dir", type=Path, default=Path("deploy"), help="default: ./deploy")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m ungater_devtools.devcluster.helm [build | render-manifests [--deploy-dir DIR]]``."""
    import sys

    args = parser().parse_args(argv)
    path = ensure_helm(log=lambda m: print(m, file=sys.stderr))
    if path is None:
        return 1
    if args.action == "build":
        print(path)
        return 0
    from ungater_devtools.devcluster.versions import KUBERNETES_VERSION

    files = render_plain_manifests(path, args.deploy_dir / "helm" / "ungater", KUBERNETES_VERSION)
    out = args.deploy_dir / "manifests"
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*.yaml"):
        if stale.name not in files and stale.read_text().startswith(_HEADER[:20]):
            stale.unlink()
    for name, text in files.items():
        (out / name).write_text(text)
        print(out / name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
