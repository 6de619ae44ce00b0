"""The local cluster tests use: the bare plane started first, then the CRDs installed and the
peers (Kueue, the KubeRay operator, the JobSet controller) started on it, the way envtest's
``Environment`` starts its control plane and then installs CRDs and webhooks.  The plane
knows nothing of this module; this module composes the plane and the peers.  A plane another
process started and left running (a detached dev cluster) is seen through
:class:`AttachedControlPlane`."""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Self

from ungater_devtools.devcluster.build import Binaries, ensure_crds
from ungater_devtools.devcluster.crds import install_crds
from ungater_devtools.devcluster.peers.runner import PEER_NAMES, Peers
from ungater_devtools.devcluster.plane.controllermanager import DEFAULT_CONTROLLERS
from ungater_devtools.devcluster.plane.plane import ControlPlane
from ungater_devtools.devcluster.process import ProcessInfo

__all__ = ["AttachedControlPlane", "LocalControlPlane"]


class LocalControlPlane(ControlPlane):
    """etcd + kube-apiserver (+ kube-controller-manager) on 127.0.0.1, with the CRDs installed
    and, with ``peers``, the named peers running (``True``: all of them; ``peer_options`` go to
    :class:`Peers`).  The peers' processes are the plane's: ``stop()`` ends them too."""

    def __init__(
        self,
        binaries: Binaries | None = None,
        *,
        state_dir: Path | None = None,
        crds: Sequence[Path] | None = None,
        controllers: Sequence[str] | None = DEFAULT_CONTROLLERS,
        startup_timeout: float = 90.0,
        detached: bool = False,
        extra_apiserver_args: Sequence[str] = (),
        peers: Sequence[str] | bool = False,
        peer_options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(
            binaries,
            state_dir=state_dir,
            controllers=controllers,
            startup_timeout=startup_timeout,
            detached=detached,
            extra_apiserver_args=extra_apiserver_args,
        )
        self._crds = list(crds) if crds is not None else None
        self._peer_names: tuple[str, ...] = (
            PEER_NAMES if peers is True else tuple(peers) if peers else ()
        )
        self._peer_options = dict(peer_options or {})
        self.peers: Peers | None = None

    def _install(self) -> None:
        crds = self._crds if self._crds is not None else ensure_crds()
        if self._peer_names:
            self.peers = Peers(self, self._peer_names, **self._peer_options)
            # the peers install these themselves (Kueue's with its conversion webhook)
            theirs = {p.name for p in self.peers.crd_paths()}
            crds = [c for c in crds if c.name not in theirs]
        self.install_crds(crds)
        if self.peers is not None:
            self.peers.start()

    def install_crds(self, paths: Sequence[Path], *, timeout: float | None = None) -> list[str]:
        """Create (or replace) each CRD manifest and wait until all are Established."""
        return install_crds(self, paths, timeout=timeout)


class AttachedControlPlane(LocalControlPlane):
    """A :class:`LocalControlPlane` that another process started and left running, seen from
    this one (:func:`~ungater_devtools.devcluster.detached.attach_dev_cluster` makes it from a
    dev cluster's record): the ports, processes and peers the starter recorded, the
    certificates, kubeconfigs and logs where the starter wrote them in ``state_dir``.

    Its processes stay the starter's: ``start()`` and ``stop()`` do nothing, and
    ``kill_apiserver`` / ``start_apiserver`` raise, since whoever else uses the plane would
    see it break. ``pids`` are the recorded processes that ``alive()`` names."""

    def __init__(
        self,
        state_dir: Path,
        *,
        apiserver_port: int,
        etcd_port: int,
        processes: Mapping[str, tuple[int, list[str], Path]],
        alive: Callable[[], Sequence[str]],
        peers: Sequence[str] = (),
        kueue_version: str | None = None,
    ) -> None:
        super().__init__(
            state_dir=state_dir,
            detached=True,
            peers=peers,
            peer_options={"kueue_version": kueue_version},
        )
        self.apiserver_port = apiserver_port
        self.etcd_port = etcd_port
        self._started = True
        self._recorded = {name: pid for name, (pid, _, _) in processes.items()}
        self._procs = {
            name: ProcessInfo(name=name, args=args, log_path=log)
            for name, (_, args, log) in processes.items()
        }
        self._alive_names = alive
        #: the Kueue the starter recorded running here (``peers.kueue_version`` finds it built)
        self.recorded_kueue_version = kueue_version
        if self._peer_names:
            self.peers = Peers(self, self._peer_names, **self._peer_options)
            self.peers.kubeconfigs = {
                name: self.peers.directory / name / "kubeconfig" for name in self.peers.names
            }

    @property
    def pids(self) -> dict[str, int]:
        alive = set(self._alive_names())
        return {name: pid for name, pid in self._recorded.items() if name in alive}

    def start(self) -> Self:
        return self

    def stop(self) -> None:
        """Nothing: the processes are the starter's (``ungater dev-cluster down`` stops them)."""

    def kill_apiserver(self, sig: signal.Signals = signal.SIGKILL) -> None:
        raise RuntimeError(self._not_ours("kill its API server"))

    def start_apiserver(self) -> None:
        raise RuntimeError(self._not_ours("restart its API server"))

    def _not_ours(self, what: str) -> str:
        return (
            f"the plane in {self.state_dir} was started by another process and may be shared; "
            f"this view does not {what} (start a plane of your own for that)"
        )
