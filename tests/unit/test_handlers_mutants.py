"""The event handlers alone, called as the reflectors call them (no I/O, no reconcile): which pod
updates queue their owner, what an intermediate owner's arrival or departure does, and when an
owner's change restarts the clock of its gated pods' wait. These kill the mutants of
``ungater/_handlers.py`` that the whole-controller tests left alive (docs/testing.md): there,
some other event of the same owner always came along and queued it anyway."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import ungater_plugins.job as job_plugin
import ungater_plugins.jobset as jobset_plugin

from tests.clock import ManualClock
from tests.fakekube import FakeKube
from tests.unit.podfactory import GATE, job, job_pod, jobset, jobset_child_job, workload
from ungater._cache import OwnerKey
from ungater._config import Config
from ungater._controller import Controller
from ungater._model import parse_object, parse_pod
from ungater._registry import PluginRegistry
from ungater._state import KindRuntime

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def controller(clock: ManualClock | None = None) -> Controller:
    config = Config.model_validate(
        {
            "kinds": [
                {"group": "batch", "kind": "Job"},
                {"group": "jobset.x-k8s.io", "kind": "JobSet"},
            ]
        }
    )
    registry = PluginRegistry.from_modules({"job": job_plugin, "jobset": jobset_plugin})
    return Controller(config, FakeKube(), registry, clock=clock or ManualClock())


def runtime(ctl: Controller, kind: str) -> KindRuntime:
    return next(rt for k, rt in ctl.kinds.items() if k.kind == kind)


async def queued(ctl: Controller) -> list[OwnerKey]:
    """Empty the work queue; the keys it held, in order."""
    keys = []
    for _ in range(len(ctl.queue)):
        key = await ctl.queue.get()
        ctl.queue.done(key)
        keys.append(key)
    return keys


def admitted(ctl: Controller, owner: dict[str, Any], pod_set: str, n: int) -> OwnerKey:
    view = ctl.handlers.parse_workload(workload(owner, {pod_set: n}, admitted={pod_set: n}))
    assert view is not None
    ctl.handlers.on_workload(None, view)
    return OwnerKey(owner["metadata"]["namespace"], owner["metadata"]["uid"])


# -- which pod updates queue the owner ---------------------------------------------------------


def _released(p: dict[str, Any]) -> None:
    p["spec"]["schedulingGates"] = []


def _relabelled(p: dict[str, Any]) -> None:
    p["metadata"]["labels"]["example.com/team"] = "a"


def _disowned(p: dict[str, Any]) -> None:
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "c", "uid": "uid-c"}
    p["metadata"]["ownerReferences"].append(ref)  # a second, non-controller reference


def _failed(p: dict[str, Any]) -> None:
    p["status"]["phase"] = "Failed"


def _terminating(p: dict[str, Any]) -> None:
    p["metadata"]["deletionTimestamp"] = "2025-01-01T00:10:00Z"


def _annotated(p: dict[str, Any]) -> None:
    p["metadata"]["annotations"]["example.com/note"] = "nothing the decision reads"


def _bumped(p: dict[str, Any]) -> None:
    p["metadata"]["resourceVersion"] = str(int(p["metadata"]["resourceVersion"] or 0) + 1)


@pytest.mark.parametrize(
    ("change", "queues"),
    [
        pytest.param(_released, True, id="gates"),
        pytest.param(_relabelled, True, id="labels-only"),  # the pod set may come from a label
        pytest.param(_disowned, True, id="owner-references-only"),  # ownership proof changed
        pytest.param(_failed, True, id="terminal"),
        pytest.param(_terminating, True, id="deleting"),
        pytest.param(_annotated, False, id="annotations-only"),
        pytest.param(_bumped, False, id="status-noise-only"),
    ],
)
async def test_a_pod_update_queues_its_owner_only_when_the_decision_reads_it(
    change: Any, queues: bool
) -> None:
    ctl = controller()
    owner = job("train", parallelism=2)
    key = admitted(ctl, owner, "main", 2)
    on_pod = ctl.handlers.pod_handler(runtime(ctl, "Job"))
    raw = job_pod(owner, index=0)
    on_pod(None, parse_pod(raw))
    assert await queued(ctl) == [key]
    ctl.state.ours.add(raw["metadata"]["uid"])  # a release of ours: no foreign-release noise
    new = copy.deepcopy(raw)
    change(new)
    _bumped(new)
    on_pod(parse_pod(raw), parse_pod(new))
    assert await queued(ctl) == ([key] if queues else [])


# -- intermediate owners: a JobSet's child Jobs ------------------------------------------------


async def test_a_child_job_cached_after_its_pods_queues_the_jobset_and_its_deletion_too() -> None:
    """The pods came first (ownership unresolved: the chain stops at an uncached Job); the
    Job's arrival is what lets the JobSet's reconcile prove them, so it must queue the
    JobSet. Its deletion forgets it and queues the JobSet again."""
    ctl = controller()
    js = jobset("js", {"workers": 1})
    key = admitted(ctl, js, "workers", 2)
    await queued(ctl)
    child = parse_object(jobset_child_job(js, "workers", 0))
    ctl.handlers.on_object(None, child)
    assert ctl.objects[child.uid] == child
    assert ctl.state.owners_of(child.namespace, child.uid) == [key]
    assert await queued(ctl) == [key]
    ctl.handlers.on_object(child, None)
    assert child.uid not in ctl.objects
    assert ctl.state.owners_of(child.namespace, child.uid) == []
    assert await queued(ctl) == [key]


async def test_an_object_of_nobody_we_know_queues_nothing() -> None:
    ctl = controller()
    js = jobset("js", {"workers": 1})
    other = jobset("other", {"workers": 1})
    admitted(ctl, js, "workers", 2)
    await queued(ctl)
    ctl.handlers.on_object(None, parse_object(jobset_child_job(other, "workers", 0)))
    assert await queued(ctl) == []


# -- owner objects: facts kept, and the clock of the gated pods' wait --------------------------


async def test_an_owner_whose_facts_change_makes_room_and_its_deletion_forgets_it() -> None:
    """``ungater_release_wait_seconds`` counts from when a pod could first go: an owner grown
    (new facts) restarts that clock; the same facts again do not; a deleted owner's facts
    and clock go."""
    clock = ManualClock()
    ctl = controller(clock)
    rt = runtime(ctl, "Job")
    owner = job("train", parallelism=2)
    key = admitted(ctl, owner, "main", 4)
    ctl.handlers.pod_handler(rt)(None, parse_pod(job_pod(owner, index=3)))
    uid = next(iter(rt.pods.by_uid))
    parse = ctl.handlers.owner_parser(rt)
    first = parse(owner)
    clock.now = 5.0
    ctl.handlers.on_owner(None, first)  # first seen: room may have been made
    assert ctl.state.owner_facts[owner["metadata"]["uid"]] == first.facts
    clock.now = 7.0
    assert ctl.state.releasable.waited(key, uid) == 2.0
    same = copy.deepcopy(owner)
    same["metadata"]["resourceVersion"] = "900"
    ctl.handlers.on_owner(first, parse(same))  # nothing the plugin reads changed
    clock.now = 8.0
    assert ctl.state.releasable.waited(key, uid) == 3.0
    grown = copy.deepcopy(same)
    grown["spec"]["parallelism"] = grown["spec"]["completions"] = 4
    grown["metadata"]["resourceVersion"] = "901"
    ctl.handlers.on_owner(parse(same), parse(grown))
    clock.now = 9.0
    assert ctl.state.releasable.waited(key, uid) == 1.0
    await queued(ctl)
    ctl.handlers.on_owner(parse(grown), None)
    assert owner["metadata"]["uid"] not in ctl.state.owner_facts
    assert ctl.state.releasable.waited(key, uid) == 9.0  # back to when the pod was seen
    assert await queued(ctl) == [key]


def test_the_gate_is_the_kinds_own() -> None:
    """Sanity for the tables above: the pods are built with the gate the Job kind owns."""
    ctl = controller()
    assert runtime(ctl, "Job").gate == GATE


async def test_a_raycluster_whose_size_changes_makes_room_for_its_rayjob() -> None:
    """A RayJob's size lives on the RayCluster it is selected through (``select_via``): the
    RayCluster growing restarts the wait clock of the RayJob's gated pods, a new version with
    the same size does not, and either way the RayJob is queued."""
    import ungater_plugins.raycluster as raycluster_plugin
    import ungater_plugins.rayjob as rayjob_plugin

    from tests.unit.test_plugin_rayjob import cluster_of, ray_owner

    clock = ManualClock()
    config = Config.model_validate({"kinds": [{"group": "ray.io", "kind": "RayJob"}]})
    registry = PluginRegistry.from_modules(
        {"raycluster": raycluster_plugin, "rayjob": rayjob_plugin}
    )
    ctl = Controller(config, FakeKube(), registry, clock=clock)
    rt = runtime(ctl, "RayJob")
    owner = ray_owner("RayJob", "train")
    key = admitted(ctl, owner, "workers", 4)
    rc = cluster_of(owner, "train-raycluster-abcde", {"workers": (2, 1)})
    parse = ctl.handlers.via_parser(rt)
    ctl.handlers.on_object(None, parse(rc))
    pod_uid = "uid-of-a-gated-worker"
    ctl.state.releasable.pod_seen(pod_uid)
    clock.now = 3.0
    assert ctl.state.releasable.waited(key, pod_uid) == 3.0
    await queued(ctl)
    same = copy.deepcopy(rc)
    same["metadata"]["resourceVersion"] = "950"
    ctl.handlers.on_object(parse(rc), parse(same))
    clock.now = 4.0
    assert ctl.state.releasable.waited(key, pod_uid) == 4.0  # same size: the clock runs on
    assert await queued(ctl) == [key]
    grown = copy.deepcopy(same)
    grown["spec"]["workerGroupSpecs"][0]["replicas"] = 4
    grown["metadata"]["resourceVersion"] = "951"
    ctl.handlers.on_object(parse(same), parse(grown))
    clock.now = 6.0
    assert ctl.state.releasable.waited(key, pod_uid) == 2.0  # grown: room made at 4.0
    assert await queued(ctl) == [key]
