"""The programming errors that tests/unit/suite/test_logged_bugs.py plants in the controller, one
coroutine per place a bug can surface (a patch inside the task group, a reconcile, a watch's
event handler, a plugin hook). Its inner pytest sessions import them from here."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import ungater_plugins.job as job_plugin

from tests.fakekube import FakeKube
from tests.objects import JOBS, WORKLOADS
from tests.polling import eventually
from tests.unit.harness import running
from tests.unit.podfactory import job, job_pod, workload
from ungater._kube.client import PODS
from ungater._kube.reflector import Reflector
from ungater._model.config import Config
from ungater.plugin_api import hookimpl


def config() -> Config:
    return Config.model_validate(
        {
            "mode": "release",  # the test plays Kueue: no other releaser on its gate
            "kinds": [{"group": "batch", "kind": "Job"}],
            "watch": {"backoffInitialSeconds": 0.01, "backoffMaxSeconds": 0.05},
        }
    )


def admitted_job(fake: FakeKube, name: str = "train") -> None:
    j = fake.put(JOBS, job(name, parallelism=1, completions=1))
    fake.put(PODS, job_pod(j, index=0, created=1))
    fake.put(WORKLOADS, workload(j, {"main": 1}, admitted={"main": 1}))


class PatchRaises(FakeKube):
    """A client whose pod patch has a bug: it raises inside the patcher's task group."""

    error: BaseException = TypeError("'NoneType' object is not subscriptable")

    async def json_patch(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        raise self.error


async def patch_bug_in_task_group(error: BaseException) -> None:
    fake = PatchRaises()
    fake.error = error
    admitted_job(fake)
    async with running(fake, config(), observed=True) as ctl:
        await eventually(lambda: ctl.stats.reconcile_errors >= 1, what="a failed reconcile")


async def reconcile_raises(error: BaseException) -> None:
    """The worker's own catch: the reconcile itself raises (not inside a task group)."""
    fake = FakeKube()
    admitted_job(fake)
    async with running(fake, config(), observed=True) as ctl:

        async def reconcile(key: Any) -> None:
            raise error

        ctl.reconciler.reconcile = reconcile  # type: ignore[method-assign]
        ctl.state.queue.add(next(iter(ctl.state.workloads.owner_keys())))
        await eventually(lambda: ctl.stats.reconcile_errors >= 1, what="a failed reconcile")


class OneEvent:
    """A client whose first watch delivers one ADDED pod; later watches stay open and quiet."""

    def __init__(self) -> None:
        self.watches = 0

    async def list_pages(self, *args: Any) -> AsyncIterator[tuple[list[dict[str, Any]], str]]:
        yield [], "1"

    async def watch(self, *args: Any) -> AsyncIterator[dict[str, Any]]:
        self.watches += 1
        if self.watches == 1:
            meta = {"name": "train-1", "uid": "u1", "resourceVersion": "2"}
            yield {"type": "ADDED", "object": {"metadata": meta}}
        await anyio.sleep_forever()


async def handler_bug(error: BaseException) -> None:
    """A watch event whose handler raises: the reflector logs it and watches again."""

    def on_change(old: Any, new: Any) -> None:
        raise error

    client = OneEvent()
    reflector: Reflector[Any] = Reflector(
        client,  # type: ignore[arg-type]
        PODS,
        "team-a",
        dict,
        on_change,
        backoff_initial=0.01,
        backoff_max=0.05,
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(reflector.run)
        await eventually(lambda: client.watches >= 2, what="a second watch")
        assert reflector.resource_version == "2"  # the event's bookkeeping is lost
        tg.cancel_scope.cancel()


class SelectorRaises:
    """The Job plugin with a bug in its pod selector hook (the registry wraps it)."""

    error: BaseException = KeyError("controller-uid")
    ungater_kinds = staticmethod(job_plugin.ungater_kinds)
    ungater_owns_pod = staticmethod(job_plugin.ungater_owns_pod)
    ungater_pod_set = staticmethod(job_plugin.ungater_pod_set)
    ungater_owner_facts = staticmethod(job_plugin.ungater_owner_facts)
    ungater_desired_counts = staticmethod(job_plugin.ungater_desired_counts)

    @staticmethod
    @hookimpl
    def ungater_pod_selector(owner: Any) -> Any:
        raise SelectorRaises.error


async def plugin_bug(error: BaseException) -> None:
    SelectorRaises.error = error
    fake = FakeKube()
    admitted_job(fake)
    async with running(fake, config(), plugins={"job": SelectorRaises}) as ctl:
        await eventually(lambda: ctl.stats.plugin_errors >= 1, what="a plugin error")


SCENARIOS: dict[str, Callable[[BaseException], Awaitable[None]]] = {
    "patch_bug_in_task_group": patch_bug_in_task_group,
    "reconcile_raises": reconcile_raises,
    "handler_bug": handler_bug,
    "plugin_bug": plugin_bug,
}
