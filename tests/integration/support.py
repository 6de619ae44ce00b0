"""Helpers of the integration tests: the controller in-process on the real API server (bare, or
wired with metrics and Events as ``ungater run`` wires it, or with its patches logged),
Kueue's part on Workloads played by hand, and the Events the controller wrote. Fixtures stay in
conftest.py."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio

from tests.integration.k8s import Kube
from tests.objects import WORKLOADS, condition
from tests.polling import eventually
from ungater._controller.controller import Controller
from ungater._kube.adapter import connect
from ungater._kube.client import Resource
from ungater._model.config import Config
from ungater._observe.events import EventRecorder
from ungater._observe.metrics import Metrics
from ungater._plugins.registry import PluginRegistry
from ungater.testing import owner_ref

# -- the controller in-process ---------------------------------------------------------------


def config_for(namespace: str, **overrides: Any) -> Config:
    raw: dict[str, Any] = {
        "namespaces": [namespace],
        # these tests play Kueue (or run it with a gate of ungater's own): ungater is the only
        # releaser, and the default auto would only audit Kueue's gate without the policy
        "mode": "release",
        "expectationsTimeoutSeconds": 5,
        "watch": {"backoffInitialSeconds": 0.05, "backoffMaxSeconds": 1, "silenceSeconds": 30},
    }
    raw.update(overrides)
    return Config.model_validate(raw)


@asynccontextmanager
async def running_controller(
    kubeconfig: Any, config: Config, wrap: Callable[[Any], Any] | None = None
) -> AsyncIterator[Controller]:
    """The controller in-process, stopped (and awaited) on exit."""
    client = await connect(kubeconfig, qps=config.client.qps, burst=config.client.burst)
    ctl = Controller(config, wrap(client) if wrap else client, PluginRegistry.discover())
    stop = anyio.Event()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(ctl.run, stop)
            with anyio.fail_after(30):
                await ctl.ready.wait()
            try:
                yield ctl
            finally:
                stop.set()
    finally:
        await client.close()


@asynccontextmanager
async def observed_controller(kubeconfig: Any, config: Config) -> AsyncIterator[Controller]:
    """The controller with metrics and an Event recorder, as ``ungater run`` wires it."""
    client = await connect(kubeconfig, qps=config.client.qps, burst=config.client.burst)
    metrics = Metrics()
    events = EventRecorder(client, host="test", observer=metrics.observe_event)
    ctl = Controller(config, client, PluginRegistry.discover(), metrics=metrics, events=events)
    metrics.bind(ctl)
    stop = anyio.Event()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(events.run)
            tg.start_soon(ctl.run, stop)
            with anyio.fail_after(30):
                await ctl.ready.wait()
            try:
                yield ctl
            finally:
                stop.set()
                await events.close(2.0)
    finally:
        await client.close()


class PatchLog:
    """The controller's client, wrapped (``running_controller(..., PatchLog().wrap)``): every
    JSON patch the controller sends passes here, held ``delay`` seconds first if asked (so
    that a real peer releasing the same pods gets there first). It keeps the name of each pod
    a release patch (one removing a scheduling gate) was sent for, whatever the answer, and
    counts the patches still waiting for theirs.

    A reconcile awaits its patches, so once ``tests.seen.reconciled`` returns none of that
    reconcile's is in flight; ``answered`` checks it rather than trusting it. After it, every
    release the controller has sent shows on the API server, and a check there that nothing
    more was released needs no fixed wait for a late one."""

    _client: Any = None  # set by ``wrap``; read before that only through ``__getattr__``

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.released: list[str] = []  # pod names, in the order the releases were sent
        self.in_flight = 0

    def wrap(self, client: Any) -> PatchLog:
        self._client = client
        return self

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def json_patch(self, res: Resource, ns: str | None, name: str, ops: Any) -> Any:
        if any(op.get("op") == "remove" and "/schedulingGates/" in op["path"] for op in ops):
            self.released.append(name)
        self.in_flight += 1
        try:
            if self.delay:
                await anyio.sleep(self.delay)
            return await self._client.json_patch(res, ns, name, ops)
        finally:
            self.in_flight -= 1

    async def answered(self, timeout: float = 30.0) -> None:
        """Wait until every patch sent so far has had its answer (or failed)."""
        await eventually(
            lambda: self.in_flight == 0, timeout=timeout, what="an answer to every patch sent"
        )


# -- playing Kueue ---------------------------------------------------------------------------


async def create_workload(
    kube: Kube,
    owner: dict[str, Any],
    name: str,
    pod_sets: dict[str, int],
    *,
    replaces: str | None = None,
    slice_name: str | None = None,
    elastic: bool = True,
) -> dict[str, Any]:
    ns = owner["metadata"]["namespace"]
    annotations = {"kueue.x-k8s.io/workload-slice-name": slice_name or name}
    if elastic:
        annotations["kueue.x-k8s.io/elastic-job"] = "true"
    if replaces:
        annotations["kueue.x-k8s.io/workload-slice-replacement-for"] = f"{ns}/{replaces}"
    body = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": name,
            "annotations": annotations,
            "labels": {"kueue.x-k8s.io/job-uid": owner["metadata"]["uid"]},
            "ownerReferences": [owner_ref(owner)],
        },
        "spec": {
            "queueName": "user-queue",
            "podSets": [
                {
                    "name": ps,
                    "count": n,
                    "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}},
                }
                for ps, n in pod_sets.items()
            ],
        },
    }
    return await kube.create(WORKLOADS, ns, body)


async def admit(kube: Kube, ns: str, name: str, counts: dict[str, int | None]) -> dict[str, Any]:
    """Write status as Kueue's scheduler does on admission (QuotaReserved, then Admitted)."""
    assignments = []
    for ps, n in counts.items():
        a: dict[str, Any] = {"name": ps, "flavors": {"cpu": "default"}}
        if n is not None:
            a["count"] = n
        assignments.append(a)
    status = {
        "admission": {"clusterQueue": "cluster-queue", "podSetAssignments": assignments},
        "conditions": [
            condition("QuotaReserved", "True", "QuotaReserved"),
            condition("Admitted", "True", "Admitted"),
        ],
    }
    return await kube.merge_patch(WORKLOADS, ns, name, {"status": status}, "status")


async def set_conditions(kube: Kube, ns: str, name: str, *conds: dict[str, Any]) -> dict[str, Any]:
    wl = await kube.get(WORKLOADS, ns, name)
    assert wl is not None
    existing = {c["type"]: c for c in (wl.get("status") or {}).get("conditions") or []}
    existing.update({c["type"]: c for c in conds})
    return await kube.merge_patch(
        WORKLOADS, ns, name, {"status": {"conditions": list(existing.values())}}, "status"
    )


async def finish(
    kube: Kube, ns: str, name: str, reason: str = "WorkloadSliceReplaced"
) -> dict[str, Any]:
    return await set_conditions(kube, ns, name, condition("Finished", "True", reason))


async def evict(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    return await set_conditions(kube, ns, name, condition("Evicted", "True", "Preempted"))


# -- what the controller said ---------------------------------------------------------------


EVENTS = Resource("", "v1", "events", "Event")


async def events_with(kube: Kube, ns: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in await kube.list(EVENTS, ns) if e.get("reason") == reason]
