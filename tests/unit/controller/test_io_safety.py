"""Each I/O safety path of the controller, alone, on the honest fake API server.

One test per way the world lets a releaser down: a watch that goes silent, a patch whose
outcome is unknown, a replica that lost its lease between deciding and patching, a pod that
ends while our patch is in flight, a plugin that raises for one owner, an intermediate owner
the caches must hold to prove a pod is ours, and the Events an operator relies on. Each was
checked to fail with its path broken (see docs/testing.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import anyio
import pytest
import ungater_plugins.job as job_plugin
import ungater_plugins.jobset as jobset_plugin

from tests.fakekube import FakeKube
from tests.objects import JOBS, WORKLOADS
from tests.polling import eventually, holds_for
from tests.seen import seen_then_reconciled
from tests.unit.harness import running
from tests.unit.podfactory import (
    GATE,
    NAMESPACE,
    job,
    job_pod,
    jobset,
    jobset_child_job,
    release,
    workload,
)
from ungater._controller.controller import Controller
from ungater._kube.client import PODS, ApiError, Resource
from ungater._kube.leader import LeaderTerm
from ungater._model.config import Config
from ungater._observe.events import FOREIGN_RELEASE, NORMAL, PLUGIN_ERROR, RELEASED, WARNING
from ungater._plugins.registry import PluginError

JOBSETS = Resource("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet")
JOB_KIND = ("batch", "Job")
JOBSET_KIND = ("jobset.x-k8s.io", "JobSet")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def config(*kinds: tuple[str, str], timeout: float = 30.0, silence: float = 60.0) -> Config:
    return Config.model_validate(
        {
            "mode": "release",  # the test plays Kueue: no other releaser
            "kinds": [{"group": g, "kind": k} for g, k in kinds or (JOB_KIND,)],
            "expectationsTimeoutSeconds": timeout,
            "watch": {
                "backoffInitialSeconds": 0.01,
                "backoffMaxSeconds": 0.05,
                "silenceSeconds": silence,
            },
        }
    )


def honest(**kw: Any) -> FakeKube:
    """The fake with its real-server behaviours on: late watches, validation, bookmarks."""
    return FakeKube(**{"seed": 11, "max_delay": 0.01, "strict": True, **kw})


@dataclass
class Recorded:
    kind: str
    name: str
    type_: str
    reason: str
    message: str


class Recorder:
    """Stands in for the EventRecorder: keeps what the controller asked to record."""

    def __init__(self) -> None:
        self.events: list[Recorded] = []

    def record(self, obj: Any, type_: str, reason: str, message: str) -> bool:
        self.events.append(Recorded(obj.kind, obj.name, type_, reason, message))
        return True

    def reasons(self) -> list[str]:
        return [e.reason for e in self.events]


class Elector:
    """A leader elector stand-in whose leadership a test can take away mid-term, the way a
    missed renewal does before the workers are cancelled."""

    def __init__(self) -> None:
        self.is_leader = True
        self.term = LeaderTerm(1, 0.0, anyio.Event())  # no resourceVersion: nothing to compare

    async def run_while_leading(self, fn: Any) -> None:
        await fn(self.term)


PLUGINS = {"job": job_plugin, "jobset": jobset_plugin}


def gated(pod: dict[str, Any]) -> bool:
    return GATE in [g["name"] for g in pod["spec"].get("schedulingGates") or []]


def live(pod: dict[str, Any]) -> bool:
    return pod["status"]["phase"] not in ("Succeeded", "Failed") and not pod["metadata"].get(
        "deletionTimestamp"
    )


def released(fake: FakeKube) -> list[int]:
    """Completion indexes of the live pods without our gate."""
    return sorted(
        int(p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"])
        for p in fake.items(PODS, NAMESPACE)
        if not gated(p) and live(p)
    )


def name_of(fake: FakeKube, index: int) -> str:
    return next(
        p["metadata"]["name"]
        for p in fake.items(PODS, NAMESPACE)
        if p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] == str(index)
    )


def indexed_job(fake: FakeKube, n: int, pods: int | None = None, name: str = "train") -> Any:
    j = fake.put(JOBS, job(name, parallelism=n, completions=n))
    for i in range(n if pods is None else pods):
        fake.put(PODS, job_pod(j, index=i, created=1 + i))
    return j


def pod_reflector(ctl: Controller) -> Any:
    return next(r for r in ctl.reflectors if r.resource.plural == "pods")


@pytest.mark.anyio
async def test_a_silent_watch_is_restarted_and_catches_up() -> None:
    """Bookmarks keep a healthy quiet stream alive; a stream that goes silent (open, but
    nothing arrives) is restarted by the silence timeout and resumes where it was."""
    fake = honest(bookmark_interval=0.1)
    j = indexed_job(fake, 2, pods=1)
    fake.put(WORKLOADS, workload(j, {"main": 2}, admitted={"main": 2}))
    async with running(fake, config(silence=0.5), plugins=PLUGINS) as ctl:
        await eventually(lambda: released(fake) == [0])
        await anyio.sleep(0.8)
        assert pod_reflector(ctl).stats.silent_restarts == 0, "bookmarks are not silence"
        assert fake.stall_watches("pods") == 1
        fake.put(PODS, job_pod(j, index=1, created=9))  # the Job controller's late pod
        await eventually(lambda: released(fake) == [0, 1], timeout=3, what="seen after restart")
        assert pod_reflector(ctl).stats.silent_restarts >= 1
        assert pod_reflector(ctl).stats.lists == 1, "a restart resumes, it does not relist"


@pytest.mark.parametrize("failure", ["503", "timeout"])
@pytest.mark.anyio
async def test_a_patch_with_an_unknown_outcome_keeps_its_expectation(failure: str) -> None:
    """The patch lands but its answer is a 503 or a timeout, and the pod watch lags: the pod
    must keep counting as in flight, or the retry re-patches it (a refused patch read as a
    foreign release) or releases past the cap."""
    fake = honest()
    j = indexed_job(fake, 3)
    fake.put(WORKLOADS, workload(j, {"main": 3}, admitted={"main": 1}))
    answered: list[str] = []

    async def land_then_fail(ns: str, name: str) -> None:
        if answered:
            return
        answered.append(name)
        fake.drop_events = {"pods"}  # the watch will not show it for a while
        pod = fake.read(PODS, ns, name)
        assert pod is not None
        fake.put(PODS, release(pod, phase="Pending"))
        if failure == "503":
            raise ApiError(503, "the server is currently unable to handle the request")
        raise TimeoutError("the answer never came")

    fake.before_patch = land_then_fail
    async with running(fake, config(), plugins=PLUGINS) as ctl:
        await eventually(lambda: answered, what="the first patch")
        await holds_for(lambda: released(fake) == [0], 1.0, what="cap 1 while in flight")
        assert ctl.stats.patch_errors == 1
        assert ctl.stats.patch_conflicts == 0, "the landed pod was patched again"
        assert ctl.stats.foreign_releases == 0
        assert len(ctl.state.ledger.expectations) == 1


@pytest.mark.anyio
async def test_a_replica_that_lost_the_lease_patches_nothing() -> None:
    """Leadership is checked before every patch, not only when the workers start: a replica
    whose lease lapsed while it still runs (its workers not cancelled yet) decides, but does
    not write. When it leads again, it acts."""
    fake = honest()
    j = indexed_job(fake, 2)
    elector = Elector()
    elector.is_leader = False
    async with running(fake, config(), elector=elector, plugins=PLUGINS) as ctl:
        fake.put(WORKLOADS, workload(j, {"main": 2}, admitted={"main": 2}))
        await eventually(lambda: ctl.stats.reconciles >= 1)
        await holds_for(lambda: not fake.patches, 0.4, what="no write without the lease")
        assert released(fake) == []
        elector.is_leader = True
        fake.put(JOBS, {**j, "metadata": {**j["metadata"], "labels": {"touch": "1"}}})
        await eventually(lambda: released(fake) == [0, 1], what="the leader acts")


@pytest.mark.parametrize("end", ["failed", "terminating", "deleted"])
@pytest.mark.anyio
async def test_a_pod_that_ends_clears_its_expectation_at_once(end: str) -> None:
    """Every patch of pod 0 times out (our release, then the fence that would settle it: it
    may land, so pod 0 stays in flight). Then pod 0 fails, starts terminating or goes, still
    gated: it no longer holds a slot, and pod 1 is released on that event."""
    fake = honest()
    j = indexed_job(fake, 2)
    fake.put(WORKLOADS, workload(j, {"main": 2}, admitted={"main": 1}))
    first = name_of(fake, 0)
    tries: list[str] = []

    def time_out(ns: str, name: str) -> None:
        if name == first:
            tries.append(name)
            raise TimeoutError("no answer")

    fake.before_patch = time_out
    async with running(fake, config(timeout=30.0), plugins=PLUGINS) as ctl:
        await eventually(lambda: ctl.stats.patch_errors == 1)
        await eventually(lambda: len(tries) >= 2, what="a fence tried")
        await holds_for(lambda: released(fake) == [], 0.3, what="pod 0 in flight: nothing more")
        assert ctl.state.ledger.uncertain_pods() == {
            fake.read(PODS, NAMESPACE, first)["metadata"]["uid"]
        }
        if end == "failed":
            pod = fake.read(PODS, NAMESPACE, first)
            assert pod is not None and gated(pod)
            pod["status"]["phase"] = "Failed"
            fake.put(PODS, pod)
        elif end == "terminating":
            fake.delete(PODS, NAMESPACE, first)  # the Job's finalizer keeps it, terminating
            assert fake.read(PODS, NAMESPACE, first) is not None
        else:
            fake.finalize(PODS, NAMESPACE, first)
            fake.delete(PODS, NAMESPACE, first)
        await eventually(lambda: released(fake) == [1], timeout=2, what="the slot refilled")
        assert ctl.state.ledger.expectations.expired_total == 0, (
            "cleared by the event, not by expiry"
        )
        await holds_for(lambda: released(fake) == [1], 0.3)


@pytest.mark.anyio
async def test_a_plugin_error_stalls_only_its_owner() -> None:
    """A plugin that raises for one owner: that owner stays as it is, with a Warning Event
    and a backoff (no hot loop); every other owner is served."""
    fake = honest()
    good = indexed_job(fake, 2, name="good")
    bad = indexed_job(fake, 2, name="bad")
    events = Recorder()
    registry_calls: list[str] = []
    async with running(fake, config(), events=events, plugins=PLUGINS) as ctl:
        (rt,) = ctl.state.kinds.values()
        real_selector = rt.handler.pod_selector

        def selector(owner: Any) -> Any:
            if owner.name == "bad":
                registry_calls.append(owner.name)
                raise PluginError(rt.handler.plugin, "ungater_pod_selector", "boom")
            return real_selector(owner)

        rt.handler.pod_selector = selector  # type: ignore[method-assign]
        fake.put(WORKLOADS, workload(bad, {"main": 2}, admitted={"main": 2}))
        fake.put(WORKLOADS, workload(good, {"main": 2}, admitted={"main": 2}))
        await eventually(
            lambda: sum(1 for p in fake.items(PODS, NAMESPACE) if not gated(p)) == 2,
            what="the good owner's pods",
        )
        await anyio.sleep(0.5)
        assert all(gated(p) for p in fake.items(PODS, NAMESPACE) if "bad" in p["metadata"]["name"])
        assert ctl.stats.plugin_errors >= 1
        assert 2 <= len(registry_calls) <= 12, f"{len(registry_calls)} tries in ~0.5 s"
        warnings = [e for e in events.events if e.reason == PLUGIN_ERROR]
        assert warnings and warnings[0].type_ == WARNING
        assert {e.name for e in warnings} == {
            w["metadata"]["name"]
            for w in fake.items(WORKLOADS, NAMESPACE)
            if w["metadata"]["ownerReferences"][0]["name"] == "bad"
        }


@pytest.mark.anyio
async def test_jobset_pods_are_released_only_through_their_cached_child_job() -> None:
    """A JobSet's pods are owned by child Jobs: the intermediate-owner cache proves a pod's
    child Job belongs to the JobSet. A pod whose child Job is another JobSet's, or not known,
    is never released; the JobSet's replicatedJob sizes (owner facts) bound the cap."""
    fake = honest()
    js = fake.put(JOBSETS, jobset("llm", {"workers": 1}))
    js["spec"]["replicatedJobs"][0]["template"]["spec"] = {"parallelism": 3, "completions": 3}
    js = fake.put(JOBSETS, js)
    other = fake.put(JOBSETS, jobset("other", {"workers": 1}))
    child = fake.put(JOBS, jobset_child_job(js, "workers", 0, parallelism=3))
    stranger = jobset_child_job(other, "workers", 0, parallelism=1)
    for i in range(3):
        fake.put(PODS, job_pod(child, index=i, created=1 + i))
    impostor = job_pod(stranger, index=0, created=1, seed="x")
    # it carries the llm JobSet's labels, but its controller is the other JobSet's Job
    impostor["metadata"]["labels"].update(
        {k: v for k, v in child["spec"]["template"]["metadata"]["labels"].items() if "jobset" in k}
    )
    fake.put(JOBS, stranger)
    fake.put(PODS, impostor)
    async with running(fake, config(JOBSET_KIND), plugins=PLUGINS) as ctl:
        fake.put(WORKLOADS, workload(js, {"workers": 5}, admitted={"workers": 5}))
        await eventually(lambda: len(fake.patches) == 3, what="the three child-Job pods")
        await holds_for(lambda: len(fake.patches) == 3, 0.4, what="never the impostor")
        assert gated(fake.read(PODS, NAMESPACE, impostor["metadata"]["name"]) or {})
        assert len(ctl.state.objects) >= 2  # the child Jobs are cached
        d = next(iter(ctl.state.decisions.values()))
        assert d.pod_sets[0].cap == 3, "min(admitted 5, the JobSet's 1 x 3)"


@pytest.mark.anyio
async def test_released_and_foreign_release_events_are_emitted() -> None:
    """A release records a Normal ``Released`` Event on the active slice; a gate removed by
    another writer records one Warning ``ForeignRelease`` Event, once per pod."""
    fake = honest()
    j = indexed_job(fake, 3)
    events = Recorder()
    async with running(fake, config(), events=events, plugins=PLUGINS) as ctl:
        wl = fake.put(WORKLOADS, workload(j, {"main": 3}, admitted={"main": 2}))
        await eventually(lambda: released(fake) == [0, 1])
        rel = [e for e in events.events if e.reason == RELEASED]
        assert [(e.kind, e.name, e.type_) for e in rel] == [
            ("Workload", wl["metadata"]["name"], NORMAL)
        ]
        assert "2" in rel[0].message and "main" in rel[0].message
        third = name_of(fake, 2)

        def sneak(ns: str, name: str) -> None:
            # another writer strips our gate just before our patch of the same pod: our
            # patch is refused (and checked), and the pod watch shows the removal too
            pod = fake.read(PODS, ns, name)
            if name == third and pod is not None and gated(pod):
                fake.put(PODS, release(pod, phase="Pending"))

        fake.before_patch = sneak
        fake.put(WORKLOADS, workload(j, {"main": 3}, admitted={"main": 3}))
        await eventually(lambda: FOREIGN_RELEASE in events.reasons())
        # the removal seen by every pod cache, and a reconcile since: a second report would
        # have been made by now
        await seen_then_reconciled(ctl, j, "pods", fake.items(PODS, j["metadata"]["namespace"]))
        foreign = [e for e in events.events if e.reason == FOREIGN_RELEASE]
        assert len(foreign) == 1 and foreign[0].type_ == WARNING, "once per pod"
        assert third in foreign[0].message
