"""Builds the peer controllers (Kueue, the KubeRay operator, the JobSet controller) from their
published Go modules into the control plane's cache, and finds their manifests.

Each peer is built as the *main* module from a copy of its downloaded module, as its own
Dockerfile builds it: its ``go.mod`` and ``go.sum`` pin every dependency, ``-mod=readonly``
keeps them untouched.  (``go install module/cmd@version`` would do for Kueue and KubeRay, but
fails for JobSet here: the module proxy refuses JobSet's version list.)  The binaries land in
``<cache root>/peers/<name>-<version>/bin``, one directory per pin, with a ``stamp.json`` written
last; builds serialise on the control plane's own ``build.lock`` so that two Go builds never
compete for the same two cores.  The copy of the sources is removed after a build; manifests
(CRDs, RBAC, webhooks) are read from the read-only module cache.

A peer pinned with a source archive (Kueue v0.19.2, which the module proxy here does not serve)
is built from that archive when one is found (:func:`find_archive`: ``$UNGATER_PEER_SOURCES``,
``../shared/peers/`` beside the checkout or the working directory, or the copy kept in the
cache), checked against its sha256, with ``-mod=vendor`` and ``GOPROXY=off``; its ``config/``
tree is kept beside the binary for the manifests.  Without an archive it is built from its
module.  :func:`select_peers` falls back to the pin's fallback version (with one line saying
so) when neither gives it and the version was not asked for by name; under ``CI=true`` that is
an error.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import tarfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ungater_devtools.ci import in_ci
from ungater_devtools.devcluster import versions
from ungater_devtools.devcluster.build import (
    ControlPlaneUnavailable,
    build_dir,
    cache_root,
    file_lock,
    run_go_with_progress,
)

__all__ = [
    "PeerBinary",
    "PeersUnavailable",
    "ensure_peers",
    "find_archive",
    "find_peers",
    "manifest_dir",
    "module_dir",
    "peer_dir",
    "read_peer_stamp",
    "select_peers",
    "sources_dir",
]

PEER_SOURCES_ENV = "UNGATER_PEER_SOURCES"

Log = Callable[[str], None]

_STAMP = "stamp.json"
_STAMP_FORMAT = 1  # bump when the recipe (flags) changes, to rebuild
_GO_TIMEOUT_S = 90 * 60  # Kueue cold on 2 cores: ~8 min; generous for a busy machine
_DOWNLOAD_TIMEOUT_S = 15 * 60
_SKIP_COPY = ("site", "docs", "keps", "charts", ".github")


class PeersUnavailable(ControlPlaneUnavailable):
    """A peer controller cannot be built or found here (and why)."""


@dataclass(frozen=True)
class PeerBinary:
    """One built peer: its pin, its executable and its module's directory in the module cache."""

    peer: versions.Peer
    path: Path
    module_dir: Path


def _noop_log(_: str) -> None:
    return None


def peer_dir(peer: versions.Peer) -> Path:
    """``<cache root>/peers/<name>-<version>``: the cache key is the pin."""
    return cache_root() / "peers" / f"{peer.name}-{peer.version}"


def _expected_stamp(peer: versions.Peer) -> dict[str, Any]:
    return {
        "format": _STAMP_FORMAT,
        "module": peer.module,
        "version": peer.version,
        "package": peer.package,
    }


def read_peer_stamp(peer: versions.Peer) -> dict[str, Any] | None:
    try:
        data = json.loads((peer_dir(peer) / _STAMP).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _binary(peer: versions.Peer) -> Path:
    return peer_dir(peer) / "bin" / peer.binary


def _is_complete(peer: versions.Peer) -> bool:
    recorded = read_peer_stamp(peer)
    if recorded is None or any(recorded.get(k) != v for k, v in _expected_stamp(peer).items()):
        return False
    path = _binary(peer)
    return path.is_file() and os.access(path, os.X_OK)


def _go() -> str:
    go = os.environ.get("UNGATER_GO") or shutil.which("go")
    if not go:
        raise PeersUnavailable(
            "the Go toolchain (`go`) is not on PATH; it is needed to build Kueue, the KubeRay "
            "operator and the JobSet controller from Go modules"
        )
    return go


def _env(*, vendored: bool = False) -> dict[str, str]:
    """The Go environment of a peer build; ``vendored``: from its own ``vendor/``, offline."""
    env = dict(os.environ)
    flags = [f for f in env.get("GOFLAGS", "").split() if not f.startswith("-mod=")]
    env.update(
        {
            "CGO_ENABLED": "0",
            "GOTOOLCHAIN": "local",
            "GOWORK": "off",
            "GO111MODULE": "on",
            "GOFLAGS": " ".join(
                [*flags, "-mod=vendor" if vendored else "-mod=readonly", "-buildvcs=false"]
            ),
        }
    )
    if vendored:
        env["GOPROXY"] = "off"
    return env


def sources_dir() -> Path:
    """Where verified source archives are kept, so a later checkout elsewhere finds them."""
    return cache_root() / "sources"


def _archive_candidates(archive: versions.SourceArchive) -> list[Path]:
    places: list[Path] = []
    for entry in os.environ.get(PEER_SOURCES_ENV, "").split(os.pathsep):
        if entry.strip():
            path = Path(entry.strip()).expanduser()
            places.append(path / archive.file if path.is_dir() else path)
    checkout = Path(__file__).resolve().parents[3]
    for root in (checkout, Path.cwd()):
        places.append(root.parent / "shared" / "peers" / archive.file)
    places.append(sources_dir() / archive.file)
    return places


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def find_archive(peer: versions.Peer, log: Log | None = None) -> Path | None:
    """The peer's verified source archive, copied into :func:`sources_dir`; None if none is
    found. A file whose sha256 differs is named and passed over."""
    archive = peer.archive
    if archive is None:
        return None
    say = log or _noop_log
    kept = sources_dir() / archive.file
    seen: set[Path] = set()
    for path in _archive_candidates(archive):
        if not path.is_file() or path.resolve() in seen:
            continue
        seen.add(path.resolve())
        digest = _sha256(path)
        if digest != archive.sha256:
            say(f"ignoring {path}: sha256 {digest}, expected {archive.sha256}")
            continue
        if path.resolve() != kept.resolve():
            kept.parent.mkdir(parents=True, exist_ok=True)
            tmp = kept.with_name(f".{kept.name}.tmp")
            shutil.copyfile(path, tmp)
            os.replace(tmp, kept)
        return kept
    return None


def _module_available(peer: versions.Peer) -> bool:
    try:
        _download(peer.module, peer.version, cache_root())
    except PeersUnavailable:
        return False
    return True


def select_peers(kueue: str | None = None, *, log: Log | None = None) -> tuple[versions.Peer, ...]:
    """The peers with the Kueue asked for (``kueue``, else ``$UNGATER_KUEUE_VERSION``, else the
    default). A default Kueue that is neither built, nor in a source archive, nor served by the
    module proxy gives way to its fallback, with one line saying so (an error under CI=true)."""
    say = log or _noop_log
    explicit = bool(kueue or os.environ.get(versions.KUEUE_VERSION_ENV, "").strip())
    pin = versions.kueue_pin(kueue)
    if (
        _is_complete(pin)
        or find_archive(pin, say) is not None
        or pin.fallback is None
        or _module_available(pin)
    ):
        return versions.peers_for(pin)
    where = f"${PEER_SOURCES_ENV}, ../shared/peers/, {sources_dir()}"
    missing = (
        f"Kueue {pin.version}: no source archive {pin.archive.file if pin.archive else ''} "
        f"({where}) and the module proxy does not serve it"
    )
    if explicit or in_ci():
        raise PeersUnavailable(missing)
    say(f"{missing}; using Kueue {pin.fallback} instead")
    return versions.peers_for(pin.fallback)


def _download(module: str, version: str, cwd: Path) -> dict[str, Any]:
    cwd.mkdir(parents=True, exist_ok=True)
    try:
        proc = subprocess.run(
            [_go(), "mod", "download", "-json", f"{module}@{version}"],
            cwd=cwd,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=_DOWNLOAD_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise PeersUnavailable(f"downloading {module}@{version} took over {exc.timeout}s") from exc
    try:
        info: dict[str, Any] = json.loads(proc.stdout) if proc.stdout.strip() else {}
    except ValueError:
        info = {}
    if proc.returncode != 0 or info.get("Error") or "Dir" not in info:
        raise PeersUnavailable(
            f"cannot download {module}@{version}: {info.get('Error') or proc.stderr.strip()}"
        )
    return info


def module_dir(module: str, version: str) -> Path:
    """The module's read-only directory in the Go module cache (downloaded if need be)."""
    return Path(_download(module, version, cache_root())["Dir"])


def manifest_dir(peer: versions.Peer) -> Path:
    """The tree whose ``config/`` holds the peer's manifests: the one kept from its source
    archive when it was built from one, else its module."""
    kept = peer_dir(peer) / "source"
    if (kept / "config").is_dir():
        return kept
    return module_dir(peer.module, peer.version)


def _release_date(info: dict[str, Any]) -> str:
    try:
        return str(json.loads(Path(info["Info"]).read_text())["Time"])
    except (KeyError, OSError, ValueError):
        return "1970-01-01T00:00:00Z"


def _copy_module(src: Path, dest: Path) -> None:
    """Copy the module (minus its website and docs) to a writable tree for a main-module build."""
    if dest.exists():
        shutil.rmtree(dest)

    def ignore(directory: str, names: list[str]) -> list[str]:
        return [n for n in names if Path(directory) == src and n in _SKIP_COPY]

    shutil.copytree(src, dest, ignore=ignore, symlinks=True)
    for root, dirs, files in os.walk(dest):
        for name in (*dirs, *files):
            path = Path(root) / name
            if not path.is_symlink():
                mode = path.stat().st_mode
                path.chmod(mode | stat.S_IWUSR)
    Path(dest).chmod(Path(dest).stat().st_mode | stat.S_IWUSR)


def _unpack(archive: Path, top: str, dest: Path) -> tuple[Path, str]:
    """Unpack a source archive into ``dest``; its tree and the date of its ``go.mod``."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    with tarfile.open(archive) as tar:
        member = tar.getmember(f"{top}/go.mod")
        date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(member.mtime))
        tar.extractall(dest, filter="data")
    return dest / top, date


def _build_one(peer: versions.Peer, log: Log) -> dict[str, Any]:
    directory = peer_dir(peer)
    bin_dir = directory / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    log_file = directory / "build.log"
    started = time.monotonic()
    src = directory / "src"
    archive = find_archive(peer, log)
    if archive is not None and peer.archive is not None:
        log(f"unpacking {archive} (sha256 verified)")
        tree, date = _unpack(archive, peer.archive.top, src)
        source = f"archive {peer.archive.file} sha256:{peer.archive.sha256}"
    else:
        info = _download(peer.module, peer.version, directory)
        _copy_module(Path(info["Dir"]), src)
        tree, date = src, _release_date(info)
        source = f"module {peer.module}@{peer.version}"
    ldflags = ["-s", "-w"]
    for assignment in peer.version_ldflags:
        ldflags.append("-X " + assignment.format(version=peer.version, date=date))
    target = bin_dir / peer.binary
    tmp = bin_dir / f".{peer.binary}.tmp"
    tmp.unlink(missing_ok=True)
    cmd = [
        _go(),
        "build",
        "-v",
        "-p",
        "2",
        "-trimpath",
        "-ldflags",
        " ".join(ldflags),
        "-o",
        str(tmp),
        peer.package,
    ]
    log(f"go build {source} {peer.package} -> {target} (log: {log_file})")
    try:
        run_go_with_progress(
            cmd,
            cwd=tree,
            env=_env(vendored=archive is not None),
            log_file=log_file,
            what=f"{peer.name} {peer.version}",
            log=log,
            error=PeersUnavailable,
            timeout=_GO_TIMEOUT_S,
        )
        os.replace(tmp, target)
        kept = directory / "source"
        shutil.rmtree(kept, ignore_errors=True)
        if archive is not None:
            kept.mkdir()
            shutil.copytree(tree / "config", kept / "config", symlinks=True)
    finally:
        shutil.rmtree(src, ignore_errors=True)
    seconds = round(time.monotonic() - started, 1)
    go_version = subprocess.run(
        [_go(), "env", "GOVERSION"], capture_output=True, text=True, check=False, env=_env()
    ).stdout.strip()
    stamp = {
        **_expected_stamp(peer),
        "source": source,
        "go": go_version,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": seconds,
        "size": target.stat().st_size,
    }
    (directory / _STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
    log(f"  built {target} in {seconds}s ({target.stat().st_size / 2**20:.1f} MiB)")
    return stamp


def find_peers(peers: Sequence[versions.Peer] = versions.PEERS) -> dict[str, PeerBinary] | None:
    """The cached peer binaries if every one is built; never builds."""
    if not all(_is_complete(p) for p in peers):
        return None
    return {p.name: PeerBinary(p, _binary(p), manifest_dir(p)) for p in peers}


def ensure_peers(
    peers: Sequence[versions.Peer] = versions.PEERS,
    *,
    build: bool = True,
    log: Log | None = None,
) -> dict[str, PeerBinary]:
    """Every peer's binary, building the missing ones (one at a time, under the build lock)."""
    say = log or _noop_log
    missing = [p for p in peers if not _is_complete(p)]
    if missing and not build:
        names = ", ".join(f"{p.name} {p.version}" for p in missing)
        raise PeersUnavailable(f"not built yet: {names}")
    if missing:
        _go()
        with file_lock(build_dir() / "build.lock", say, PeersUnavailable):
            for index, peer in enumerate(missing, 1):
                if _is_complete(peer):
                    say(f"reusing {_binary(peer)} (built by another process)")
                    continue
                say(f"[{index}/{len(missing)}] building {peer.name} {peer.version}")
                _build_one(peer, say)
    found: dict[str, PeerBinary] = {}
    for peer in peers:
        if peer not in missing:
            say(f"reusing {_binary(peer)}")
        found[peer.name] = PeerBinary(peer, _binary(peer), manifest_dir(peer))
    return found
