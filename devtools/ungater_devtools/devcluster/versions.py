"""The single place that pins every upstream version the local control plane is made of.

Changing a pin here changes the build cache key (binaries live in a directory named after
the Kubernetes and etcd versions), so a bump rebuilds instead of silently reusing old
binaries.  The CRD modules are fetched from the Go module cache at exactly these versions.

Why these pins (checked against the Go module proxy with Go 1.26.8):

* Kubernetes v1.35.4: the newest patch of 1.35 served; it builds with Go 1.26.8.
* etcd v3.6.16: the newest 3.6.x served (the 3.6 line is what Kubernetes 1.35 is tested with).
* Kueue: three selectable pins (:data:`KUEUE_PINS`, chosen by ``--kueue`` or
  ``$UNGATER_KUEUE_VERSION``, :func:`kueue_pin`).  v0.19.2, the current release, is not served
  by the proxy here: it is built from its source archive (upstream tag with ``vendor/``) when
  one is given, else from its module; it is the default (falling back to v0.17.1, see
  ``peerbuild.select_peers``).  v0.17.1 is the newest served, the first with Kueue's own
  ``ElasticJobUngater`` (off unless workload slices are on); the tests that need an elastic
  JobSet or a release past the admitted count ask for it.  v0.17.0, the last Kueue that
  releases every pod of an admitted slice, stays selectable but is no longer built unless
  asked for; its Workload CRD is still the plain control plane's.  All store Workloads as
  v1beta2.
* JobSet v0.12.0: newest served (v0.12.1 and v0.13.0 are refused by the proxy).
* KubeRay ray-operator v1.6.1: newest whose module zip is served (v1.7.0 lists but its zip
  is refused).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = [
    "CRD_MODULES",
    "ETCD_MODULE",
    "ETCD_VERSION",
    "JOBSET_VERSION",
    "KUBERAY_VERSION",
    "KUBERNETES_MODULE",
    "KUBERNETES_VERSION",
    "KUEUE_ALSO_BUILT",
    "KUEUE_CRD_VERSION",
    "KUEUE_PINS",
    "KUEUE_VERSION",
    "KUEUE_VERSION_ENV",
    "PEERS",
    "CrdModule",
    "Peer",
    "SourceArchive",
    "kueue_pin",
    "peers_for",
]

KUBERNETES_MODULE = "k8s.io/kubernetes"
KUBERNETES_VERSION = "v1.35.4"

ETCD_MODULE = "go.etcd.io/etcd/server/v3"
ETCD_VERSION = "v3.6.16"

KUEUE_VERSION = "v0.19.2"  # the default Kueue of the dev cluster, the fixtures and the demo
#: the Workload CRD of the plain control plane (no peers): from a module the proxy serves
KUEUE_CRD_VERSION = "v0.17.0"
KUEUE_VERSION_ENV = "UNGATER_KUEUE_VERSION"
#: built by ``devcluster build`` beside the default: the real-peer tests that need an elastic
#: JobSet or a Kueue releasing past its admitted count ask for it by name
KUEUE_ALSO_BUILT: tuple[str, ...] = ("v0.17.1",)
JOBSET_VERSION = "v0.12.0"
KUBERAY_VERSION = "v1.6.1"


@dataclass(frozen=True)
class CrdModule:
    """A Go module that ships CRD manifests, and the manifest paths inside it."""

    module: str
    version: str
    paths: tuple[str, ...]


CRD_MODULES: tuple[CrdModule, ...] = (
    CrdModule(
        module="sigs.k8s.io/kueue",
        version=KUEUE_CRD_VERSION,
        paths=("config/components/crd/bases/kueue.x-k8s.io_workloads.yaml",),
    ),
    CrdModule(
        module="sigs.k8s.io/jobset",
        version=JOBSET_VERSION,
        paths=("config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml",),
    ),
    CrdModule(
        module="github.com/ray-project/kuberay/ray-operator",
        version=KUBERAY_VERSION,
        paths=("config/crd/bases/ray.io_rayclusters.yaml",),
    ),
)


@dataclass(frozen=True)
class SourceArchive:
    """A peer's source tree as a tarball (with ``vendor/``) that builds with nothing fetched."""

    file: str  # its file name, looked for in the places peerbuild.find_archive names
    sha256: str
    top: str  # the one directory at its top


@dataclass(frozen=True)
class Peer:
    """A controller the tests run beside the control plane, built from its Go module.

    It is built as the main module from a copy of the downloaded module (the way its own
    Dockerfile builds it), so its own ``go.mod`` and ``go.sum`` decide every dependency.
    """

    name: str  # short name: cache directory, binary and process name
    module: str
    version: str
    package: str  # the main package, relative to the module root
    binary: str
    version_ldflags: tuple[str, ...]  # `-X` assignments; {version} and {date} are filled in
    archive: SourceArchive | None = None  # built from this when it is found, else the module
    fallback: str | None = None  # the version to use when neither source gives this one


def _kueue(version: str, archive: SourceArchive | None = None, fallback: str | None = None) -> Peer:
    return Peer(
        name="kueue",
        module="sigs.k8s.io/kueue",
        version=version,
        package="./cmd/kueue",
        binary="kueue-manager",
        version_ldflags=(
            "sigs.k8s.io/kueue/pkg/version.GitVersion={version}",
            "sigs.k8s.io/kueue/pkg/version.BuildDate={date}",
        ),
        archive=archive,
        fallback=fallback,
    )


#: The selectable Kueue builds, newest first.
KUEUE_PINS: dict[str, Peer] = {
    "v0.19.2": _kueue(
        "v0.19.2",
        archive=SourceArchive(
            file="kueue-v0.19.2.tar.gz",
            sha256="da428aa4a4f0c3351e1865bbdafa9830af6b85d235c789ff7f5cf0b4fa868315",
            top="kueue-v0.19.2",
        ),
        fallback="v0.17.1",
    ),
    "v0.17.1": _kueue("v0.17.1"),
    "v0.17.0": _kueue("v0.17.0"),
}


def kueue_pin(version: str | None = None) -> Peer:
    """The Kueue pin for ``version``, else ``$UNGATER_KUEUE_VERSION``, else the default."""
    chosen = version or os.environ.get(KUEUE_VERSION_ENV, "").strip() or KUEUE_VERSION
    if not chosen.startswith("v"):
        chosen = "v" + chosen
    try:
        return KUEUE_PINS[chosen]
    except KeyError:
        known = ", ".join(KUEUE_PINS)
        raise ValueError(f"unknown Kueue version {chosen!r}; known: {known}") from None


PEERS: tuple[Peer, ...] = (
    KUEUE_PINS[KUEUE_VERSION],
    Peer(
        name="kuberay",
        module="github.com/ray-project/kuberay/ray-operator",
        version=KUBERAY_VERSION,
        package=".",
        binary="kuberay-operator",
        version_ldflags=(),
    ),
    Peer(
        name="jobset",
        module="sigs.k8s.io/jobset",
        version=JOBSET_VERSION,
        package=".",
        binary="jobset-manager",
        version_ldflags=("sigs.k8s.io/jobset/pkg/version.GitVersion={version}",),
    ),
)


def peers_for(kueue: Peer | str | None = None) -> tuple[Peer, ...]:
    """:data:`PEERS` with the chosen Kueue (a pin, a version, or None for :func:`kueue_pin`)."""
    pin = kueue if isinstance(kueue, Peer) else kueue_pin(kueue)
    return tuple(pin if p.name == "kueue" else p for p in PEERS)
