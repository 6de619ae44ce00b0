"""The whole controller on the in-memory API server, as `ungater run` wires it: the real
metrics (bound to the controller) and the real Event recorder, started and stopped with it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import ungater_plugins.job as job_plugin

from tests.fakekube import FakeKube
from ungater._controller.controller import Controller
from ungater._model.config import Config
from ungater._observe.events import EventRecorder
from ungater._observe.metrics import Metrics
from ungater._plugins.registry import PluginRegistry


@asynccontextmanager
async def observed_controller(fake: FakeKube, config: Config) -> AsyncIterator[Controller]:
    """The controller with the Job plugin, ``ctl.metrics`` and Events; ready when yielded."""
    metrics = Metrics()
    events = EventRecorder(fake, host="test")
    registry = PluginRegistry.from_modules({"job": job_plugin})
    ctl = Controller(config, fake, registry, metrics=metrics, events=events)
    metrics.bind(ctl)
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(events.run)
        tg.start_soon(ctl.run, stop)
        with anyio.fail_after(5):
            await ctl.ready.wait()
        try:
            yield ctl
        finally:
            stop.set()
            await events.close(1.0)
