"""The manager: the process composed around the controller (``controller.py``), with leader
election, the probe and metrics endpoint, and the Event recorder. ``ungater run`` is this, plus signal handling.

Start order: HTTP server (so probes answer at once), Event recorder, elector, controller.
Stop order: workers finish their current owner, the Lease is handed back (a standby takes over
at once instead of waiting for expiry), pending Events are flushed, the server stops.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid

import anyio

from ungater._controller.controller import Controller
from ungater._kube.adapter import ApiClientKube
from ungater._kube.client import KubeClient
from ungater._kube.leader import LeaderElector
from ungater._model.config import Config
from ungater._observe.events import EventRecorder
from ungater._observe.metrics import Metrics
from ungater._observe.server import HealthServer
from ungater._plugins.registry import PluginRegistry

__all__ = ["build_elector", "lease_identity", "lease_name", "lease_namespace", "serve"]

log = logging.getLogger("ungater.app")


def lease_namespace(config: Config) -> str:
    """The Lease's namespace: configured, else ``kube-system``. Deliberately not the pod's or
    the service account's: a laptop and the in-cluster Deployment must meet on one Lease."""
    return config.lease_namespace


def lease_name(config: Config) -> str:
    """The Lease's name: configured, else derived from the gates served."""
    return config.lease_name


def lease_identity(config: Config) -> str:
    """Unique per process: a restarted replica is a new holder, never mistaken for the old."""
    if config.leader_election.identity:
        return config.leader_election.identity
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def build_elector(config: Config, client: KubeClient, identity: str) -> LeaderElector | None:
    """The elector ``serve`` runs, or None with leader election off."""
    le = config.leader_election
    if not le.enabled:
        return None
    return LeaderElector(
        client,
        lease_namespace(config),
        lease_name(config),
        identity,
        le.lease_duration_seconds,
        le.renew_deadline_seconds,
        le.retry_period_seconds,
    )


async def serve(
    config: Config,
    client: ApiClientKube,
    registry: PluginRegistry,
    stop: anyio.Event,
    on_ready: anyio.Event | None = None,
) -> Controller:
    """Run everything until ``stop`` is set; return the controller (for its stats)."""
    metrics = Metrics()
    identity = lease_identity(config)
    ev = config.events
    events = (
        EventRecorder(
            client,
            host=identity,
            per_key_interval=ev.per_object_interval_seconds,
            burst=ev.per_object_burst,
            qps=ev.qps,
            global_burst=ev.burst,
            queue_size=ev.queue_size,
            observer=metrics.observe_event,
        )
        if ev.enabled
        else None
    )
    controller = Controller(config, client, registry, metrics=metrics, events=events)
    metrics.bind(controller)
    elector = build_elector(config, client, identity)
    if elector is not None:
        metrics.bind_leader(lambda: elector.is_leader)
        log.info("leader election on: Lease %s/%s as %s", elector.namespace, elector.name, identity)
    else:
        metrics.leader.set(1)
    await controller.start()
    server = None
    if config.server.address:
        server = HealthServer.from_address(
            config.server.address,
            metrics,
            ready=controller.ready.is_set,
            healthy=lambda: True,
            detail=controller.status_lines,
        )
        await server.start()
        log.info("serving /metrics, /healthz, /readyz on %s", server.url)
    if on_ready is not None:
        on_ready.set()
    try:
        async with anyio.create_task_group() as tg:
            if events is not None:
                tg.start_soon(events.run)
            if elector is not None:
                tg.start_soon(elector.run)
            await controller.run(stop, elector)
            with anyio.CancelScope(shield=True):
                if elector is not None:
                    await elector.release()
                if events is not None:
                    await events.close()
            tg.cancel_scope.cancel()
    finally:
        if server is not None:
            with anyio.CancelScope(shield=True):
                await server.stop()
    return controller
