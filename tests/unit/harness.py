"""The whole controller on the in-memory API server, started and stopped as `ungater run` does:
one helper, so every test starts it the same way and a change to the start-up is made once."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
import ungater_plugins.job as job_plugin

from tests.fakekube import FakeKube
from tests.unit.builders import NS, owner_ref, workload
from ungater._controller.controller import Controller
from ungater._controller.state import State
from ungater._decide.indexes import OwnerKey
from ungater._model.config import Config
from ungater._model.views import parse_workload
from ungater._observe.events import EventRecorder
from ungater._observe.metrics import Metrics
from ungater._plugins.registry import PluginRegistry


@asynccontextmanager
async def running(
    fake: FakeKube,
    config: Config,
    *,
    plugins: Mapping[str, Any] | None = None,
    observed: bool = False,
    events: Any = None,
    client: Any = None,
    elector: Any = None,
    grace: float | None = None,
    clock: Any = None,
) -> AsyncIterator[Controller]:
    """The controller on ``fake``, ready (caches synced) when yielded, stopped and awaited when
    the block ends.

    ``plugins``: name -> plugin module (default: the built-in Job plugin). ``observed``: the real
    metrics (bound to the controller, ``ctl.metrics``) and the real Event recorder on ``fake``,
    run beside it, as `ungater run` wires them; ``events``: a recorder of the test's own
    instead. ``client``: what the controller talks to, when not ``fake`` itself (a wrapper
    that injects faults). ``elector``, ``grace`` and ``clock`` go to the controller as given.
    """
    registry = PluginRegistry.from_modules(dict(plugins or {"job": job_plugin}))
    metrics = Metrics() if observed else None
    recorder = EventRecorder(fake, host="test") if observed else None
    extra: dict[str, Any] = {"clock": clock} if clock is not None else {}
    ctl = Controller(
        config,
        client if client is not None else fake,
        registry,
        metrics=metrics,
        events=recorder if recorder is not None else events,
        **extra,
    )
    if metrics is not None:
        metrics.bind(ctl)
    async with anyio.create_task_group() as tg:
        if recorder is not None:
            tg.start_soon(recorder.run)
        try:
            async with started(ctl, elector=elector, grace=grace):
                yield ctl
        finally:
            if recorder is not None:
                await recorder.close(1.0)


@asynccontextmanager
async def started(
    ctl: Controller, *, elector: Any = None, grace: float | None = None
) -> AsyncIterator[anyio.Event]:
    """``ctl.run`` in the background, ready when yielded, stopped and awaited when the block
    ends; yields the stop event, for a test that stops it mid-block (``running`` without the
    building, for a controller the test built and changed itself)."""
    run_args: tuple[Any, ...] = (elector,) if grace is None else (elector, grace)
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(ctl.run, stop, *run_args)
        with anyio.fail_after(5):
            await ctl.ready.wait()
        try:
            yield stop
        finally:
            stop.set()


def owner_version(ctl: Controller, uid: str) -> int:
    """The resourceVersion at which the controller's cache holds an owner (-1: not held)."""
    held = ctl.state.owners.get(uid)
    rv = held.resource_version if held is not None else ""
    return int(rv) if rv.isdigit() else -1


def owner_facts(ctl: Controller, uid: str) -> Mapping[str, Any] | None:
    """The plugin's facts of an owner, as the controller's cache holds them."""
    held = ctl.state.owners.get(uid)
    return held.facts if held is not None else None


def job_state(plugin: Any = job_plugin) -> State:
    """A Job controller's state on the fake, built as the controller builds it (not started)."""
    cfg = Config.model_validate({"kinds": [{"group": "batch", "kind": "Job"}]})
    return Controller(cfg, FakeKube(), PluginRegistry.from_modules({"jobs": plugin})).state


def sliced(s: State, owner: str, wl_name: str) -> OwnerKey:
    """Cache a slice owned by the Job ``owner``; the owner's key."""
    wl = workload(wl_name, uid=f"uid-{wl_name}")
    wl["metadata"]["ownerReferences"] = [owner_ref(name=owner, uid=f"uid-{owner}")]
    s.workloads.on_change(None, parse_workload(wl))
    return OwnerKey(NS, f"uid-{owner}")
