"""The manager (``ungater/_controller/controller.py``) around the reconciler: its workers, how each outcome
of a reconcile is counted and retried, how ``run`` starts, waits for the caches and stops.

The reconciler here is a script (each key does what the test says), so each test sees only the
manager's part: what it counts, re-queues, announces and waits for (docs/testing.md).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import pytest
import ungater_plugins.job as job_plugin
from prometheus_client.parser import text_string_to_metric_families

from tests.fakekube import FakeKube
from tests.objects import WORKLOADS, workload
from tests.polling import eventually
from tests.unit.harness import started
from ungater._controller.controller import Controller
from ungater._controller.reconciler import Outcome, Retry
from ungater._decide.indexes import OwnerKey
from ungater._kube.client import EVENTS, ApiError
from ungater._model.config import Config
from ungater._model.errors import StartupError
from ungater._observe.events import EventRecorder
from ungater._observe.metrics import Metrics
from ungater._plugins.registry import PluginError, PluginInfo, PluginRegistry

NS = "team-a"
pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def config(**extra: Any) -> Config:
    return Config.model_validate(
        {
            "mode": "release",  # the test plays Kueue: no other releaser
            "kinds": [{"group": "batch", "kind": "Job"}],
            "watch": {"backoffInitialSeconds": 0.01, "backoffMaxSeconds": 0.05},
            **extra,
        }
    )


Step = Callable[[OwnerKey], Awaitable[Outcome]]


class Script:
    """A reconciler whose ``reconcile(key)`` runs the key's steps in turn, one per call (the
    last one again once they run out); it records each call."""

    def __init__(self, steps: dict[str, list[Step]]) -> None:
        self.steps = steps
        self.calls: list[str] = []

    async def reconcile(self, key: OwnerKey) -> Outcome:
        self.calls.append(key.uid)
        steps = self.steps[key.uid]
        step = steps.pop(0) if len(steps) > 1 else steps[0]
        return await step(key)


async def ok(key: OwnerKey) -> Outcome:
    return Outcome()


def returning(outcome: Outcome) -> Step:
    async def step(key: OwnerKey) -> Outcome:
        return outcome

    return step


def raising(exc: Exception) -> Step:
    async def step(key: OwnerKey) -> Outcome:
        raise exc

    return step


def sleeping(seconds: float, finished: list[str]) -> Step:
    async def step(key: OwnerKey) -> Outcome:
        await anyio.sleep(seconds)
        finished.append(key.uid)
        return Outcome()

    return step


PLUGIN = PluginInfo("acme-jobs", "acme-ungater-jobs", "1.0")


def controller(fake: FakeKube, cfg: Config | None = None, **kw: Any) -> Controller:
    return Controller(cfg or config(), fake, PluginRegistry.from_modules({"job": job_plugin}), **kw)


def samples(metrics: Metrics, metric: str) -> dict[tuple[tuple[str, str], ...], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            if s.name == metric:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def key(uid: str) -> OwnerKey:
    return OwnerKey(NS, uid)


# -- what each outcome of a reconcile does ----------------------------------------------------


async def test_each_reconcile_outcome_is_counted_by_result_and_retried_until_it_succeeds() -> None:
    """Success, a look again later, a retry the reconcile asks for (pods changed, patches
    failed), a plugin error, any other error: each is counted under its result; the failures
    are retried with backoff until they succeed, a success clears the key's backoff, and a
    look again later comes back without one."""
    fake = FakeKube()
    metrics = Metrics()
    ctl = controller(fake, metrics=metrics)
    metrics.bind(ctl)
    script = Script(
        {
            "ok": [ok],
            "conflict": [returning(Outcome(retry=Retry.CHANGED)), ok],
            "failed": [returning(Outcome(retry=Retry.FAILED)), ok],
            "later": [returning(Outcome(after=0.05)), ok],
            "plugin": [
                raising(PluginError(PLUGIN, "ungater_sort_key", "bad key")),
                raising(PluginError(PLUGIN, "ungater_sort_key", "bad key again")),
                ok,
            ],
            "boom": [raising(RuntimeError("API gone")), raising(RuntimeError("again")), ok],
        }
    )
    ctl.reconciler = script  # type: ignore[assignment]
    async with started(ctl):
        for uid in script.steps:
            ctl.state.queue.add(key(uid))
        await eventually(
            lambda: (
                sorted(script.calls)
                == sorted(["ok", *["conflict", "failed", "later"] * 2, *["plugin", "boom"] * 3])
            ),
            timeout=5,
            what="every key retried until it succeeded",
        )
        await eventually(lambda: ctl._busy == 0, timeout=2, what="the workers idle")
    results = {k: v for k, v in samples(metrics, "ungater_reconcile_total").items() if v}
    assert results == {
        (("result", "success"),): 7.0,
        (("result", "conflict"),): 1.0,
        (("result", "plugin_error"),): 2.0,
        (("result", "error"),): 3.0,
    }
    assert (ctl.stats.plugin_errors, ctl.stats.reconcile_errors) == (2, 2)  # raised ones
    assert samples(metrics, "ungater_plugin_errors_total") == {(("plugin", "acme-jobs"),): 2.0}
    assert all(ctl.state.queue.failures(key(uid)) == 0 for uid in script.steps)
    (count,) = samples(metrics, "ungater_reconcile_duration_seconds_count").values()
    (total,) = samples(metrics, "ungater_reconcile_duration_seconds_sum").values()
    assert count == 13.0 and 0.0 <= total < 5.0  # each one's own duration, not a timestamp


async def test_a_plugin_error_is_announced_on_the_owners_slice_with_its_message() -> None:
    fake = FakeKube()
    events = EventRecorder(fake, host="test")
    ctl = controller(fake, events=events)
    owner = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "namespace": NS, "uid": "uid-train"},
    }
    fake.put(WORKLOADS, workload(owner, "train-a", count=1))
    error = PluginError(PLUGIN, "ungater_sort_key", "bad key")
    ctl.reconciler = Script({"uid-train": [raising(error), ok]})  # type: ignore[assignment]
    async with anyio.create_task_group() as tg:
        tg.start_soon(events.run)
        async with started(ctl):
            await eventually(lambda: ctl.state.workloads.has_owner("uid-train"), timeout=3)
            ctl.state.queue.add(key("uid-train"))
            sent = await eventually(
                lambda: [e for e in fake.items(EVENTS, NS) if e["reason"] == "PluginError"],
                timeout=3,
                what="the PluginError Event",
            )
        await events.close(1.0)
        tg.cancel_scope.cancel()
    assert sent[0]["message"] == str(error)
    assert sent[0]["involvedObject"]["name"] == "train-a"


async def test_a_reconcile_cancelled_by_a_lost_term_is_queued_again() -> None:
    """Leadership lost (the workers' scope cancelled) in the middle of a reconcile: the key
    goes back on the queue for the next term."""
    fake = FakeKube()
    ctl = controller(fake)
    started = anyio.Event()

    async def blocks(k: OwnerKey) -> None:
        started.set()
        await anyio.sleep_forever()

    ctl.reconciler = Script({"a": [blocks]})  # type: ignore[assignment]
    ctl.state.queue.add(key("a"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(ctl._worker)
        with anyio.fail_after(3):
            await started.wait()
        tg.cancel_scope.cancel()
    with anyio.fail_after(1):
        assert await ctl.state.queue.get() == key("a")


async def test_a_controller_calls_the_reconciler_for_the_key_it_is_given() -> None:
    ctl = controller(FakeKube())
    script = Script({"a": [ok], "b": [ok]})
    ctl.reconciler = script  # type: ignore[assignment]
    await ctl.reconcile(key("b"))
    assert script.calls == ["b"]


# -- stopping ------------------------------------------------------------------------------------


async def test_stopping_lets_every_reconcile_in_flight_finish() -> None:
    """Two workers, two reconciles in flight when stop comes: both finish before ``run``
    returns (it waits for the last one, not the first)."""
    fake = FakeKube()
    ctl = controller(fake, config(workers=2))
    finished: list[str] = []
    script = Script({"a": [sleeping(0.1, finished)], "b": [sleeping(0.4, finished)]})
    ctl.reconciler = script  # type: ignore[assignment]
    async with started(ctl) as stop:
        ctl.state.queue.add(key("a"))
        ctl.state.queue.add(key("b"))
        await eventually(lambda: ctl._busy == 2, timeout=2, what="both in flight")
        stop.set()
    assert sorted(finished) == ["a", "b"]


async def test_a_reconcile_that_never_ends_holds_the_stop_only_for_the_grace() -> None:
    fake = FakeKube()
    ctl = controller(fake)
    ctl.reconciler = Script({"a": [sleeping(3600, [])]})  # type: ignore[assignment]
    with anyio.fail_after(3):
        async with started(ctl, grace=0.2) as stop:
            ctl.state.queue.add(key("a"))
            await eventually(lambda: ctl._busy == 1, timeout=2, what="in flight")
            stop.set()


class Unlistable:
    """The fake, except that no list ever succeeds: the caches never sync."""

    def __init__(self, inner: FakeKube) -> None:
        self.inner = inner
        self.tries = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def list_pages(self, *a: Any, **kw: Any) -> AsyncIterator[tuple[list[Any], str]]:
        self.tries += 1
        raise ApiError(500, "Internal Server Error", "")
        yield [], ""  # pragma: no cover (makes this an async generator)


async def test_a_stop_before_the_caches_synced_ends_run_without_acting() -> None:
    client = Unlistable(FakeKube())
    ctl = Controller(config(), client, PluginRegistry.from_modules({"job": job_plugin}))
    stop = anyio.Event()
    with anyio.fail_after(3):
        async with anyio.create_task_group() as tg:
            tg.start_soon(ctl.run, stop)
            # a list failed and was tried again: the caches cannot have synced
            await eventually(lambda: client.tries >= 2, what="a list retried")
            assert not ctl.ready.is_set()
            assert ctl.metrics_snapshot().synced is False
            stop.set()
    assert not ctl.ready.is_set()


async def test_a_snapshot_says_synced_once_the_caches_are() -> None:
    ctl = controller(FakeKube())
    assert ctl.metrics_snapshot().synced is False
    async with started(ctl):
        assert ctl.metrics_snapshot().synced is True


# -- starting ------------------------------------------------------------------------------------


async def test_the_workloads_are_watched_at_the_version_the_server_serves() -> None:
    fake = FakeKube(served={"kueue.x-k8s.io": ["v1beta1"]})
    ctl = controller(fake)
    await ctl.start()
    versions = {r.resource.version for r in ctl.reflectors if r.resource.plural == "workloads"}
    assert versions == {"v1beta1"}


@pytest.mark.parametrize(
    ("served", "says"),
    [([], "served: none"), (["v1alpha1", "v1"], "served: v1alpha1, v1")],
)
async def test_no_served_workload_version_is_a_startup_error_naming_both_sides(
    served: list[str], says: str
) -> None:
    fake = FakeKube(served={"kueue.x-k8s.io": served} if served else {})
    ctl = controller(fake)
    with pytest.raises(StartupError) as raised:
        await ctl.start()
    assert str(raised.value) == (
        f"the API server serves no Workload version of v1beta2, v1beta1 ({says}; "
        "is Kueue installed?)"
    )


@pytest.mark.parametrize("interval", [0.0, 0.05])
async def test_the_gate_guard_is_checked_every_interval_and_never_when_turned_off(
    interval: float,
) -> None:
    ctl = controller(FakeKube(), config(policyCheckIntervalSeconds=interval))
    async with started(ctl):
        if interval:
            await eventually(lambda: ctl.state.guard.checks >= 3, timeout=3, what="periodic checks")
        else:
            await anyio.sleep(0.2)
            assert ctl.state.guard.checks == 0
