"""The single place that pins every upstream version the local control plane is made of.

Changing a pin here changes the build cache key (binaries live in a directory named after
the Kubernetes and etcd versions), so a bump rebuilds instead of silently reusing old
binaries.  The CRD modules are fetched from the Go module cache at exactly these versions.

Why these pins (checked against the Go module proxy with Go 1.26.8):

* Kubernetes v1.35.4: the newest patch of 1.35 served; it builds with Go 1.26.8.
* etcd v3.6.16: the newest 3.6.x served (the 3.6 line is what Kubernetes 1.35 is tested with).
* Kueue v0.17.0: newest served; its Workload CRD serves both v1beta2 (storage) and
  v1beta1 (deprecated).  v0.16.x is not served; v0.15.0 serves both too but stores v1beta1.
* JobSet v0.12.0: newest served (v0.12.1 and v0.13.0 are refused by the proxy).
* KubeRay ray-operator v1.6.1: newest whose module zip is served (v1.7.0 lists but its zip
  is refused).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "CRD_MODULES",
    "ETCD_MODULE",
    "ETCD_VERSION",
    "JOBSET_VERSION",
    "KUBERAY_VERSION",
    "KUBERNETES_MODULE",
    "KUBERNETES_VERSION",
    "KUEUE_VERSION",
    "PEERS",
    "CrdModule",
    "Peer",
]

KUBERNETES_MODULE = "k8s.io/kubernetes"
KUBERNETES_VERSION = "v1.35.4"

ETCD_MODULE = "go.etcd.io/etcd/server/v3"
ETCD_VERSION = "v3.6.16"

KUEUE_VERSION = "v0.17.0"
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
        version=KUEUE_VERSION,
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


PEERS: tuple[Peer, ...] = (
    Peer(
        name="kueue",
        module="sigs.k8s.io/kueue",
        version=KUEUE_VERSION,
        package="./cmd/kueue",
        binary="kueue-manager",
        version_ldflags=(
            "sigs.k8s.io/kueue/pkg/version.GitVersion={version}",
            "sigs.k8s.io/kueue/pkg/version.BuildDate={date}",
        ),
    ),
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
