"""The event handlers alone, called as the reflectors call them (no I/O, no reconcile): which pod
updates queue their owner, what an intermediate owner's arrival or departure does, and when an
owner's change restarts the clock of its gated pods' wait. These kill the mutants of
``ungater/_controller/handlers.py`` that the whole-controller tests left alive (docs/testing.md): there,
some other event of the same owner always came along and queued it anyway."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import ungater_plugins.job as job_plugin
import ungater_plugins.jobset as jobset_plugin

from tests.clock import ManualClock
from tests.fakekube import FakeKube
from tests.unit.podfactory import (
    GATE,
    job,
    job_pod,
    jobset,
    jobset_child_job,
    release,
    strip_owner,
    workload,
)
from ungater._controller.controller import Controller
from ungater._controller.handlers import _admission_changed
from ungater._controller.state import KindRuntime
from ungater._decide.indexes import OwnerKey
from ungater._decide.ledger import GONE_REMEMBERED
from ungater._kube.client import PODS, Resource
from ungater._model.config import Config
from ungater._model.views import parse_object, parse_pod, parse_workload
from ungater._plugins.registry import PluginRegistry
from ungater.plugin_api import KindSpec, ResourceSpec, hookimpl

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def controller(clock: ManualClock | None = None) -> Controller:
    config = Config.model_validate(
        {
            "mode": "release",  # the test plays Kueue: no other releaser
            "kinds": [
                {"group": "batch", "kind": "Job"},
                {"group": "jobset.x-k8s.io", "kind": "JobSet"},
            ],
        }
    )
    registry = PluginRegistry.from_modules({"job": job_plugin, "jobset": jobset_plugin})
    return Controller(config, FakeKube(), registry, clock=clock or ManualClock())


def runtime(ctl: Controller, kind: str) -> KindRuntime:
    return next(rt for k, rt in ctl.state.kinds.items() if k.kind == kind)


async def queued(ctl: Controller) -> list[OwnerKey]:
    """Empty the work queue; the keys it held, in order."""
    keys = []
    for _ in range(len(ctl.state.queue)):
        key = await ctl.state.queue.get()
        ctl.state.queue.done(key)
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
    ctl.state.ledger.mine(
        raw["metadata"]["uid"], raw["metadata"]["namespace"], raw["metadata"]["name"]
    )  # a release of ours: no foreign-release noise
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
    assert ctl.state.objects.by_uid[child.uid] == child
    assert ctl.state.owners_of(child.namespace, child.uid) == [key]
    assert await queued(ctl) == [key]
    ctl.handlers.on_object(child, None)
    assert child.uid not in ctl.state.objects.by_uid
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
    assert ctl.state.owners.get(owner["metadata"]["uid"]).facts == first.facts
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
    assert owner["metadata"]["uid"] not in ctl.state.owners
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

    from tests.unit.podfactory import cluster_of, ray_owner

    clock = ManualClock()
    config = Config.model_validate(
        {"mode": "release", "kinds": [{"group": "ray.io", "kind": "RayJob"}]}
    )
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


# -- what is watched ---------------------------------------------------------------------------


def test_every_resource_is_watched_once_per_namespace_with_the_configured_watch_settings() -> None:
    """All four built-in kinds, two namespaces: per namespace the Workloads, each kind's pods by
    that kind's pod label, each owner resource, and the intermediates (a JobSet's child Jobs,
    a RayJob's RayClusters) each once, all with the configured watch timings."""
    import ungater_plugins.raycluster as raycluster_plugin
    import ungater_plugins.rayjob as rayjob_plugin

    config = Config.model_validate(
        {
            "mode": "release",  # the test plays Kueue: no other releaser
            "kinds": [
                {"group": "batch", "kind": "Job"},
                {"group": "jobset.x-k8s.io", "kind": "JobSet"},
                {"group": "ray.io", "kind": "RayCluster"},
                {"group": "ray.io", "kind": "RayJob"},
            ],
            "watch": {
                "timeoutSeconds": 123,
                "silenceSeconds": 45,
                "backoffInitialSeconds": 2,
                "backoffMaxSeconds": 7,
            },
        }
    )
    registry = PluginRegistry.from_modules(
        {
            "job": job_plugin,
            "jobset": jobset_plugin,
            "raycluster": raycluster_plugin,
            "rayjob": rayjob_plugin,
        }
    )
    client = FakeKube()
    ctl = Controller(config, client, registry, clock=ManualClock())
    reflectors = ctl.handlers.reflectors(client, "v1beta2", ["team-a", "team-b"])
    assert all(r.client is client for r in reflectors)
    assert {(r.timeout_seconds, r.silence_seconds, r.backoff_initial, r.backoff_max)
            for r in reflectors} == {(123, 45.0, 2.0, 7.0)}  # fmt: skip
    per_namespace = [
        (Resource("kueue.x-k8s.io", "v1beta2", "workloads", "Workload"), ""),
        (PODS, "batch.kubernetes.io/controller-uid"),
        (PODS, "jobset.sigs.k8s.io/jobset-uid"),
        (PODS, "ray.io/cluster"),  # the RayCluster kind's view
        (PODS, "ray.io/cluster"),  # the RayJob kind's view of the same pods
        (Resource("batch", "v1", "jobs", "Job"), ""),
        (Resource("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet"), ""),
        (Resource("ray.io", "v1", "rayclusters", "RayCluster"), ""),  # the owner
        (Resource("batch", "v1", "jobs", "Job"), "jobset.sigs.k8s.io/jobset-name"),
        (Resource("ray.io", "v1", "rayclusters", "RayCluster"), ""),  # selected through
    ]
    got = sorted(((r.namespace, str(r.resource), r.label_selector) for r in reflectors), key=str)
    want = sorted(
        ((ns, str(res), sel) for ns in ("team-a", "team-b") for res, sel in per_namespace),
        key=str,
    )
    assert got == want


# -- Workloads ---------------------------------------------------------------------------------


def test_workloads_of_a_kind_not_configured_or_of_no_owner_are_not_cached() -> None:
    from tests.unit.podfactory import ray_owner

    ctl = controller()  # Job and JobSet only
    assert ctl.handlers.parse_workload(workload(job("train"), {"main": 1})) is not None
    other = workload(ray_owner("RayCluster", "rc"), {"workers": 1})
    assert ctl.handlers.parse_workload(other) is None
    orphan = workload(job("lost"), {"main": 1})
    orphan["metadata"]["ownerReferences"] = []
    assert ctl.handlers.parse_workload(orphan) is None


def _slice(owner: dict[str, Any], admitted_for: int | None, rv: str) -> Any:
    raw = workload(
        owner, {"main": 4}, admitted=None if admitted_for is None else {"main": admitted_for}
    )
    raw["metadata"]["resourceVersion"] = rv
    return parse_workload(raw)


@pytest.mark.parametrize(
    ("before", "after", "changed"),
    [
        pytest.param("absent", 2, True, id="first-seen-admitted"),
        pytest.param(None, 2, True, id="pending-then-admitted"),
        pytest.param(2, 2, False, id="same-admission"),
        pytest.param(2, 3, True, id="other-counts"),
        pytest.param(2, None, False, id="admission-taken-away"),
        pytest.param("absent", None, False, id="first-seen-pending"),
    ],
)
def test_admission_changed_only_for_a_new_or_different_admission(
    before: Any, after: int | None, changed: bool
) -> None:
    owner = job("train", parallelism=4)
    old = None if before == "absent" else _slice(owner, before, "10")
    assert _admission_changed(old, _slice(owner, after, "11")) is changed


async def test_a_workload_update_with_the_same_admission_keeps_the_wait_clock() -> None:
    clock = ManualClock()
    ctl = controller(clock)
    owner = job("train", parallelism=4)
    key = OwnerKey(owner["metadata"]["namespace"], owner["metadata"]["uid"])
    ctl.state.releasable.pod_seen("uid-p")
    clock.now = 2.0
    first = _slice(owner, 2, "10")
    ctl.handlers.on_workload(None, first)  # admitted: room made at 2.0
    clock.now = 4.0
    ctl.handlers.on_workload(first, _slice(owner, 2, "11"))  # status noise only
    clock.now = 5.0
    assert ctl.state.releasable.waited(key, "uid-p") == 3.0


# -- owners and objects without Workloads or controllers -----------------------------------------


async def test_an_owner_with_no_workload_is_cached_but_not_queued() -> None:
    ctl = controller()
    rt = runtime(ctl, "Job")
    owner = job("no-slice-yet")
    facts = ctl.handlers.owner_parser(rt)(owner)
    ctl.handlers.on_owner(None, facts)
    assert owner["metadata"]["uid"] in ctl.state.owners
    assert await queued(ctl) == []


async def test_objects_and_pods_without_a_controller_reference_queue_nothing() -> None:
    """Labels can be copied; an object or pod with no controller reference names no owner
    (and must not break the handler)."""
    ctl = controller()
    js = jobset("js", {"workers": 1})
    admitted(ctl, js, "workers", 2)
    owner = job("train")
    admitted(ctl, owner, "main", 2)
    await queued(ctl)
    child = jobset_child_job(js, "workers", 0)
    child["metadata"]["ownerReferences"] = []
    ctl.handlers.on_object(None, parse_object(child))
    on_pod = ctl.handlers.pod_handler(runtime(ctl, "Job"))
    on_pod(None, parse_pod(strip_owner(job_pod(owner, index=0))))
    assert await queued(ctl) == []


# -- pods: expectations per view, foreign releases, forgetting, freed slots ---------------------


async def test_only_the_deciding_kinds_view_clears_its_expectation_and_only_once_settled() -> None:
    ctl = controller()
    job_rt, jobset_rt = runtime(ctl, "Job"), runtime(ctl, "JobSet")
    owner = job("train")
    key = admitted(ctl, owner, "main", 2)
    gated = job_pod(owner, index=0)
    uid = gated["metadata"]["uid"]
    for rt in (job_rt, jobset_rt):
        ctl.handlers.pod_handler(rt)(None, parse_pod(gated))
    ctl.state.ledger.mine(uid, gated["metadata"]["namespace"], gated["metadata"]["name"])
    ctl.state.ledger.expectations.expect(key, [uid], job_rt.kind)
    still_gated = copy.deepcopy(gated)
    _relabelled(still_gated)
    ctl.handlers.pod_handler(job_rt)(parse_pod(gated), parse_pod(still_gated))
    assert ctl.state.ledger.expectations.pending(key) == {uid}  # still gated: not settled
    released = release(still_gated)
    ctl.handlers.pod_handler(jobset_rt)(parse_pod(still_gated), parse_pod(released))
    assert ctl.state.ledger.expectations.pending(key) == {uid}  # another kind's view
    ctl.handlers.pod_handler(job_rt)(parse_pod(still_gated), parse_pod(released))
    assert ctl.state.ledger.expectations.pending(key) == frozenset()


async def test_a_gated_pod_changing_otherwise_is_no_foreign_release() -> None:
    ctl = controller()
    owner = job("train")
    admitted(ctl, owner, "main", 2)
    gated = job_pod(owner, index=0)
    relabelled = copy.deepcopy(gated)
    _relabelled(relabelled)
    ctl.handlers.pod_handler(runtime(ctl, "Job"))(parse_pod(gated), parse_pod(relabelled))
    assert ctl.state.stats.foreign_releases == 0
    ctl.handlers.pod_handler(runtime(ctl, "Job"))(parse_pod(relabelled), parse_pod(release(gated)))
    assert ctl.state.stats.foreign_releases == 1  # the check itself is live


async def test_a_pod_is_forgotten_only_when_no_kinds_view_holds_it_any_more() -> None:
    clock = ManualClock()
    ctl = controller(clock)
    job_rt, jobset_rt = runtime(ctl, "Job"), runtime(ctl, "JobSet")
    owner = job("train")
    key = admitted(ctl, owner, "main", 2)
    raw = release(job_pod(owner, index=0))
    uid = raw["metadata"]["uid"]
    view = parse_pod(raw)
    for rt in (job_rt, jobset_rt):
        ctl.handlers.pod_handler(rt)(None, view)
    s = ctl.state
    led = s.ledger
    led.mine(uid, raw["metadata"]["namespace"], raw["metadata"]["name"])
    led.wrote(uid, 7)
    led.foreign(uid)
    ctl.handlers.pod_handler(jobset_rt)(view, None)  # left one selector only
    assert led.is_ours(uid) and led.written(uid) == 7 and uid in led.foreign_pods()
    clock.now = 4.0
    assert s.releasable.waited(key, uid) == 4.0
    ctl.handlers.pod_handler(job_rt)(view, None)
    assert not led.is_ours(uid) and led.written(uid) is None and uid not in led.foreign_pods()
    assert s.releasable.waited(key, uid) is None


async def test_a_lagging_watch_replaying_a_gone_pods_release_is_no_foreign_release() -> None:
    """Our release of a pod, seen by one kind's watch, and the pod's deletion too, before
    another kind's lagging watch even showed the pod: what we kept of the pod went with it.
    That watch then replays the pod's past, gated and then released: old news of a pod that
    is gone, not a release by someone else. A pod never seen gone still reports one."""
    ctl = controller()
    job_rt, jobset_rt = runtime(ctl, "Job"), runtime(ctl, "JobSet")
    owner = job("train")
    admitted(ctl, owner, "main", 2)
    gated = job_pod(owner, index=0)
    uid = gated["metadata"]["uid"]
    s = ctl.state
    ctl.handlers.pod_handler(job_rt)(None, parse_pod(gated))
    s.ledger.mine(uid, gated["metadata"]["namespace"], gated["metadata"]["name"])
    ctl.handlers.pod_handler(job_rt)(parse_pod(gated), parse_pod(release(gated)))
    ctl.handlers.pod_handler(job_rt)(parse_pod(release(gated)), None)  # gone from every view
    assert not s.ledger.is_ours(uid) and s.ledger.is_gone(uid)
    ctl.handlers.pod_handler(jobset_rt)(None, parse_pod(gated))  # the lagging watch's replay
    ctl.handlers.pod_handler(jobset_rt)(parse_pod(gated), parse_pod(release(gated)))
    assert s.stats.foreign_releases == 0
    other = job_pod(owner, index=1)
    ctl.handlers.pod_handler(job_rt)(None, parse_pod(other))
    ctl.handlers.pod_handler(job_rt)(parse_pod(other), parse_pod(release(other)))
    assert s.stats.foreign_releases == 1  # the check itself is live


def test_the_gone_pods_remembered_are_bounded_oldest_first_out() -> None:
    s = controller().state
    for i in range(GONE_REMEMBERED + 2):
        s.forget_pod(f"uid-{i}")
    gone = s.ledger.is_gone
    assert s.ledger.sizes()["gone"] == GONE_REMEMBERED
    assert not gone("uid-0") and not gone("uid-1") and gone("uid-2")
    s.forget_pod("uid-2")  # seen gone again: now the newest
    s.forget_pod("uid-x")
    assert gone("uid-2") and not gone("uid-3")


def _with_rv(raw: dict[str, Any], rv: int) -> dict[str, Any]:
    out = copy.deepcopy(raw)
    out["metadata"]["resourceVersion"] = str(rv)
    return out


class _TrainerPlugin:
    """A third-party kind whose pods are selected through objects of its own (``select_via``)."""

    @hookimpl
    def ungater_kinds(self) -> list[KindSpec]:
        via = ResourceSpec("example.com", "v1", "WorkerGroup", "workergroups", "example.com/x")
        return [KindSpec("example.com", "Trainer", "example.com/trainer", select_via=via)]


def test_the_intermediates_of_several_kinds_are_each_watched_none_lost_to_another() -> None:
    """LeaderWorkerSet brings two intermediates, JobSet one, and a RayJob and a third-party
    kind each select through objects of their own: every one of them is watched, with its
    own selector, beside the owners."""
    import ungater_leaderworkerset as lws_plugin
    import ungater_plugins.raycluster as raycluster_plugin
    import ungater_plugins.rayjob as rayjob_plugin

    config = Config.model_validate(
        {
            "mode": "release",  # the test plays Kueue: no other releaser
            "kinds": [
                {"group": "jobset.x-k8s.io", "kind": "JobSet"},
                {"group": "leaderworkerset.x-k8s.io", "kind": "LeaderWorkerSet"},
                {"group": "ray.io", "kind": "RayJob"},
                {"group": "example.com", "kind": "Trainer"},
            ],
        }
    )
    registry = PluginRegistry.from_modules(
        {
            "jobset": jobset_plugin,
            "lws": lws_plugin,
            "raycluster": raycluster_plugin,
            "rayjob": rayjob_plugin,
            "trainer": _TrainerPlugin(),
        }
    )
    client = FakeKube()
    ctl = Controller(config, client, registry, clock=ManualClock())
    pod_labels = {"jobset.sigs.k8s.io/jobset-uid", "leaderworkerset.sigs.k8s.io/name",
                  "ray.io/cluster", "example.com/trainer"}  # fmt: skip
    others = sorted(
        (r.resource.plural, r.label_selector)
        for r in ctl.handlers.reflectors(client, "v1beta2", ["team-a"])
        if r.resource.plural != "workloads"
        and not (r.resource == PODS and r.label_selector in pod_labels)
    )
    assert others == [
        ("jobs", "jobset.sigs.k8s.io/jobset-name"),
        ("jobsets", ""),
        ("leaderworkersets", ""),
        ("pods", "leaderworkerset.sigs.k8s.io/name,leaderworkerset.sigs.k8s.io/worker-index=0"),
        ("rayclusters", ""),
        ("statefulsets", "leaderworkerset.sigs.k8s.io/name"),
        ("workergroups", "example.com/x"),
    ]


async def test_our_own_release_shown_by_the_watch_queues_nothing_but_anything_else_does() -> None:
    """Our release, once the deciding view shows it, changes no decision (the pod counted in
    flight and now counts as released), so it queues no reconcile: a wave of a thousand pods
    is not decided again a thousand times. The same change with no expectation of ours (another
    writer's release), or with more than our gate gone, still queues the owner."""
    ctl = controller()
    rt = runtime(ctl, "Job")
    owner = job("train")
    key = admitted(ctl, owner, "main", 3)
    pods = [job_pod(owner, index=i) for i in range(3)]
    for p in pods:
        ctl.handlers.pod_handler(rt)(None, parse_pod(p))
        ctl.state.ledger.mine(
            p["metadata"]["uid"], p["metadata"]["namespace"], p["metadata"]["name"]
        )
    ctl.state.ledger.expectations.expect(key, [pods[0]["metadata"]["uid"]], rt.kind)
    ctl.state.ledger.expectations.expect(key, [pods[2]["metadata"]["uid"]], rt.kind)
    await queued(ctl)
    ctl.handlers.pod_handler(rt)(parse_pod(pods[0]), parse_pod(release(pods[0])))
    assert ctl.state.ledger.expectations.pending(key) == {pods[2]["metadata"]["uid"]}
    assert await queued(ctl) == []  # ours, expected: nothing to decide again
    ctl.handlers.pod_handler(rt)(parse_pod(pods[1]), parse_pod(release(pods[1])))
    assert await queued(ctl) == [key]  # not expected: another writer's, decided again
    relabelled = release(pods[2])
    _relabelled(relabelled)
    ctl.handlers.pod_handler(rt)(parse_pod(pods[2]), parse_pod(relabelled))
    assert ctl.state.ledger.expectations.pending(key) == frozenset()
    assert await queued(ctl) == [key]  # expected, but its labels changed too
