"""The local cluster tests use: the bare plane started first, then the CRDs installed and the
peers (Kueue, the KubeRay operator, the JobSet controller) started on it, the way envtest's
``Environment`` starts its control plane and then installs CRDs and webhooks.  The plane
knows nothing of this module; this module composes the plane and the peers."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ungater_devtools.devcluster.build import Binaries, ensure_crds
from ungater_devtools.devcluster.crds import install_crds
from ungater_devtools.devcluster.peers.runner import PEER_NAMES, Peers
from ungater_devtools.devcluster.plane.controllermanager import DEFAULT_CONTROLLERS
from ungater_devtools.devcluster.plane.plane import ControlPlane

__all__ = ["LocalControlPlane"]


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
