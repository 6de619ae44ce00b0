"""Helpers shared by the controller tests grouped by mechanism (the sections of docs/safety.md:
test_our_own_writes.py, test_the_release_fence.py, test_the_view.py, test_the_active_slice.py,
test_the_owners_size*.py, test_leadership.py, test_other_writers.py, and
test_reconcile_outcomes.py): a controller that leads but never starts its workers
(``standby``: only the test calls ``reconcile``), Jobs, slices and pods set up on the fake, and
clients that record or rewrite what the controller reads."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import ungater_plugins.job as job_plugin
import ungater_plugins.raycluster as raycluster_plugin
import ungater_plugins.rayjob as rayjob_plugin
from prometheus_client.parser import text_string_to_metric_families

from tests.clock import ManualClock
from tests.fakekube import FakeKube
from tests.objects import JOBS, WORKLOADS
from tests.polling import eventually
from tests.unit.capcheck import (
    CONFIG_MAPS,
    HandOver,
)
from tests.unit.harness import running
from tests.unit.podfactory import (
    GATE,
    NAMESPACE,
    job,
    job_pod,
    release,
    workload,
)
from ungater._controller.controller import Controller
from ungater._controller.state import KindRuntime
from ungater._decide.indexes import OwnerKey
from ungater._kube.client import EVENTS, PODS, ApiError, Resource
from ungater._model.config import Config
from ungater._model.views import Kind
from ungater._observe.metrics import Metrics

JOB = Kind("batch", "Job")


class Standby:
    """An elector under which this replica leads (patches go out) but never starts its
    workers: the caches run, and only the test calls ``reconcile``."""

    def __init__(self) -> None:
        self.is_leader = True
        self.term = None  # no term's start to compare releases with

    async def run_while_leading(self, fn: Any) -> None:
        await anyio.sleep_forever()


def config(**extra: Any) -> Config:
    return Config.model_validate(
        {
            "mode": "release",  # the test plays Kueue: no other releaser
            "kinds": [{"group": "batch", "kind": "Job"}],
            "expectationsTimeoutSeconds": 30.0,
            "watch": {"backoffInitialSeconds": 0.01, "backoffMaxSeconds": 0.05},
            **extra,
        }
    )


@asynccontextmanager
async def standby(
    fake: FakeKube,
    cfg: Config | None = None,
    clock: ManualClock | None = None,
    client: Any = None,
    plugins: dict[str, Any] | None = None,
) -> AsyncIterator[tuple[Controller, Standby]]:
    """The controller with metrics and real Events, caches synced, no workers; ``client``
    (a wrapper of ``fake``) is what the controller talks to, if given; ``plugins`` replace
    the built-in ones."""
    elector = Standby()
    async with running(
        fake,
        cfg or config(),
        plugins=plugins
        or {"job": job_plugin, "raycluster": raycluster_plugin, "rayjob": rayjob_plugin},
        observed=True,
        client=client,
        elector=elector,
        clock=clock or ManualClock(1000.0),
    ) as ctl:
        with anyio.fail_after(20):
            yield ctl, elector


def setup(
    fake: FakeKube, pods: int, admitted: int, released: int = 0, name: str = "train"
) -> tuple[dict[str, Any], OwnerKey, list[dict[str, Any]]]:
    """An Indexed Job of ``pods`` pods (the first ``released`` already running) whose slice
    admits ``admitted``; its key and its pods by index."""
    j = fake.put(JOBS, job(name, parallelism=pods))
    out = []
    for i in range(pods):
        p = job_pod(j, index=i, created=1 + i)
        out.append(fake.put(PODS, release(p) if i < released else p))
    fake.put(WORKLOADS, workload(j, {"main": pods}, admitted={"main": admitted}))
    return j, OwnerKey(NAMESPACE, j["metadata"]["uid"]), out


def rt_of(ctl: Controller) -> KindRuntime:
    return ctl.state.kinds[JOB]


async def cached(ctl: Controller, key: OwnerKey, fake: FakeKube, pods: int) -> None:
    """Wait until the caches hold the owner's slice and its pods as the fake has them."""

    def synced() -> bool:
        rt = rt_of(ctl)
        want = {p["metadata"]["uid"]: p["metadata"]["resourceVersion"] for p in fake.items(PODS)}
        have = {u: v.resource_version for u, v in rt.pods.by_uid.items()}
        return bool(ctl.state.workloads.for_owner(key.uid)) and have == want and len(have) == pods

    await eventually(synced, timeout=5, what="caches synced with the fake")


def uid(p: dict[str, Any]) -> str:
    return str(p["metadata"]["uid"])


def name(p: dict[str, Any]) -> str:
    return str(p["metadata"]["name"])


def gated(fake: FakeKube, p: dict[str, Any]) -> bool:
    now = fake.read(PODS, NAMESPACE, name(p))
    assert now is not None
    return GATE in [g["name"] for g in now["spec"].get("schedulingGates") or []]


def script(fake: FakeKube, outcomes: dict[str, ApiError]) -> list[str]:
    """Patches of the pods named in ``outcomes`` fail with that error; the rest go through.
    Returns the names of the pods a patch was attempted on, in order."""
    attempted: list[str] = []

    def before_patch(namespace: str, pod_name: str) -> None:
        attempted.append(pod_name)
        if pod_name in outcomes:
            raise outcomes[pod_name]

    fake.before_patch = before_patch
    return attempted


def refused_for_good() -> ApiError:
    body = {"kind": "Status", "message": "gates are managed by the platform team"}
    return ApiError(422, "Unprocessable Entity", json.dumps(body))


def samples(metrics: Metrics | None, metric: str) -> dict[tuple[tuple[str, str], ...], float]:
    assert metrics is not None
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            if s.name == metric:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def events_of(fake: FakeKube, reason: str) -> list[dict[str, Any]]:
    return [e for e in fake.items(EVENTS) if e.get("reason") == reason]


def released_by_someone(fake: FakeKube, p: dict[str, Any], phase: str = "Running") -> None:
    fake.put(PODS, release(fake.read(PODS, NAMESPACE, name(p)) or p, phase=phase))


def gone(fake: FakeKube, p: dict[str, Any]) -> None:
    """Deleted, and its finalizers (the Job controller's tracking one) removed: gone."""
    fake.delete(PODS, NAMESPACE, name(p))
    fake.finalize(PODS, NAMESPACE, name(p))
    assert fake.read(PODS, NAMESPACE, name(p)) is None


class Recording:
    """The fake behind a client that records each ``get``'s Resource and may rewrite what a
    ``get`` of some plural answers (the rest is the fake's)."""

    def __init__(self, inner: FakeKube) -> None:
        self.inner = inner
        self.gets: list[Resource] = []
        self.calls: list[tuple[Resource, str | None, str]] = []
        self.rewrite: dict[str, Any] = {}  # plural -> fn(obj) -> obj

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)

    async def get(self, resource: Resource, namespace: str | None, name: str) -> Any:
        self.gets.append(resource)
        self.calls.append((resource, namespace, name))
        obj = await self.inner.get(resource, namespace, name)
        fn = self.rewrite.get(resource.plural)
        return fn(obj) if fn is not None and obj is not None else obj


def fenced_job(fake: FakeKube) -> tuple[dict[str, Any], OwnerKey, list[dict[str, Any]]]:
    """A Job of 3 pods with 2 admitted: pods 0 and 1 released and running, pod 2 gated."""
    return setup(fake, pods=3, admitted=2, released=2)


async def free_a_slot(ctl: Controller, fake: FakeKube, key: OwnerKey, pod: dict[str, Any]) -> None:
    """The released ``pod`` fails, after the cached owner and slice were last seen: its slot
    is free, and the reconcile must read both fresh before refilling it."""
    released_by_someone(fake, pod, phase="Failed")
    await cached(ctl, key, fake, 3)


async def synced_owner(ctl: Controller, key: OwnerKey) -> None:
    await eventually(lambda: key.uid in ctl.state.owners, timeout=3, what="the cached Job")


async def synced_then_blind(ctl: Controller, fake: FakeKube, key: OwnerKey, plural: str) -> None:
    """The caches hold the fenced Job, its slice and its 3 pods; from now on the ``plural``
    watch shows nothing, so what the fake changes there only a fresh read sees."""
    await cached(ctl, key, fake, 3)
    await synced_owner(ctl, key)
    fake.drop_events = {plural}


async def term_behind_every_cache(fake: FakeKube, elector: HandOver, ctl: Any) -> None:
    """A term that starts at a write none of the caches sees (the Lease's): every owner is
    unproven until a read, or every cache passing that write, shows otherwise."""
    fake.put(CONFIG_MAPS, {"metadata": {"name": "lease", "namespace": NAMESPACE}})
    elector.go.set()
    await eventually(lambda: ctl.state.freshness.term_rv > 0, what="the term")


def _sized(j: dict[str, Any], parallelism: int) -> dict[str, Any]:
    return {**j, "spec": {**j["spec"], "parallelism": parallelism}}
