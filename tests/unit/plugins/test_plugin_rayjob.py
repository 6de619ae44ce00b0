"""RayJob and RayService: slices on the RayJob, pods on the RayCluster it created.

The pods are found through the RayClusters the owner controls (by UID), proven by the chain
Pod -> RayCluster -> RayJob, and capped by the RayClusters' own size, which is where KubeRay and
Kueue keep it. Written with the plugin-author kit (``ungater.testing``) and, for the wiring,
the whole controller on the in-memory API server.
"""

from __future__ import annotations

import copy

import pytest
import ungater_plugins.raycluster as raycluster_plugin
import ungater_plugins.rayjob as rayjob_plugin

from tests.fakekube import FakeKube
from tests.lagging import Lagging
from tests.objects import RAYCLUSTERS, WORKLOADS
from tests.polling import eventually, holds_for
from tests.unit.harness import running
from tests.unit.podfactory import (
    GATE,
    NAMESPACE,
    cluster_of,
    names,
    ray_head_pod,
    ray_owner,
    ray_replica_name,
    ray_worker_pod,
    release,
    workload,
)
from ungater._kube.client import PODS
from ungater._model.config import Config
from ungater.plugin_api import VIA_FACTS, KindSpec, ReleaseGroup
from ungater.testing import PluginUnderTest, new_uid, owner_ref

RAYJOB = ("ray.io", "RayJob")
RAYSERVICE = ("ray.io", "RayService")


def kit(kind: tuple[str, str] = RAYJOB) -> PluginUnderTest:
    return PluginUnderTest.from_module(rayjob_plugin, kind, name="rayjob")


# -- the kinds ---------------------------------------------------------------------------------


def test_serves_rayjob_and_rayservice_through_their_rayclusters() -> None:
    specs = rayjob_plugin.ungater_kinds()
    assert [(s.group, s.kind) for s in specs] == [RAYJOB, RAYSERVICE]
    for spec in specs:
        assert spec == KindSpec(
            group="ray.io",
            kind=spec.kind,
            pod_label="ray.io/cluster",
            select_via=raycluster_plugin.RAYCLUSTERS,
        )


def test_the_installed_plugin_is_the_built_in_one() -> None:
    plugin = PluginUnderTest.installed("rayjob", RAYJOB)
    assert plugin.distribution == "ungater"
    assert plugin.spec.select_via == raycluster_plugin.RAYCLUSTERS


# -- selecting through the RayCluster ------------------------------------------------------------


def test_pods_are_selected_through_each_raycluster_the_owner_controls_by_uid() -> None:
    job = ray_owner("RayJob", "train")
    mine = cluster_of(job, "train-raycluster-abcde", {"workers": (2, 1)})
    other_job = ray_owner("RayJob", "other")
    theirs = cluster_of(other_job, "other-raycluster-fghij", {"workers": (2, 1)})
    # same owner name, but a reference that is not the controller's proves nothing
    loose = cluster_of(job, "loose-raycluster", {"workers": (1, 1)})
    loose["metadata"]["ownerReferences"][0]["controller"] = False
    # a RayCluster naming the RayJob but with another UID (a deleted and recreated RayJob)
    stale = cluster_of(job, "stale-raycluster", {"workers": (1, 1)})
    stale["metadata"]["ownerReferences"][0]["uid"] = new_uid("an", "earlier", "train")
    selectors = kit().pod_selectors(job, [mine, theirs, loose, stale])
    assert selectors == [{"ray.io/cluster": "train-raycluster-abcde"}]
    assert kit().pod_selectors(job, []) == [], "no RayCluster cached yet: no candidates"


# -- ownership -----------------------------------------------------------------------------------


def test_ownership_is_the_uid_chain_pod_raycluster_rayjob() -> None:
    job = ray_owner("RayJob", "train")
    rc = cluster_of(job, "train-raycluster-abcde", {"workers": (2, 1)})
    other = cluster_of(ray_owner("RayJob", "other"), "train-raycluster-abcde", {})
    other["metadata"]["uid"] = new_uid("RayCluster", "impostor")
    head = ray_head_pod(rc)
    impostor = ray_head_pod(other)  # the same ray.io/cluster label, another RayCluster
    direct = copy.deepcopy(head)  # owned by the RayJob itself, skipping the RayCluster
    direct["metadata"]["uid"] = new_uid("direct")
    direct["metadata"]["ownerReferences"] = [owner_ref(job)]
    assert kit().ownership(job, [head, impostor, direct], [rc, other]) == [
        "proven",
        "foreign",
        "foreign",
    ]
    assert kit().ownership(job, [head], []) == ["unresolved"], "the RayCluster is not cached"
    service = ray_owner("RayService", "serve")
    assert kit(RAYSERVICE).ownership(service, [head], [rc]) == ["foreign"], "the RayJob's pod"


def test_a_raycluster_that_only_claims_the_owner_proves_nothing() -> None:
    job = ray_owner("RayJob", "train")
    rc = cluster_of(job, "train-raycluster-abcde", {"workers": (1, 1)})
    rc["metadata"]["ownerReferences"][0]["controller"] = False
    assert kit().ownership(job, [ray_head_pod(rc)], [rc]) == ["foreign"]


# -- the owner's size lives in its RayClusters ---------------------------------------------------


def test_desired_counts_come_from_the_raycluster_not_the_rayjob_spec() -> None:
    # KubeRay disregards later changes of the RayJob's rayClusterSpec; the autoscaler (or an
    # operator) scales the RayCluster, and Kueue's next slice counts its workers
    job = ray_owner("RayJob", "train", workers=2)
    rc = cluster_of(job, "train-raycluster-abcde", {"workers": (5, 1), "TPU": (2, 4)})
    assert kit().desired_counts(job, [rc]) == {"head": 1, "workers": 5, "tpu": 8}
    rc["spec"]["suspend"] = True
    assert kit().desired_counts(job, [rc]) == {"head": 0, "workers": 0, "tpu": 0}
    assert kit().desired_counts(job, []) is None, "no RayCluster cached: no owner bound"


def test_a_rayservice_upgrade_counts_both_rayclusters_against_one_slice() -> None:
    service = ray_owner("RayService", "serve")
    active = cluster_of(service, "serve-raycluster-old01", {"workers": (2, 1)})
    pending = cluster_of(service, "serve-raycluster-new02", {"workers": (2, 1)})
    plugin = kit(RAYSERVICE)
    assert plugin.desired_counts(service, [active, pending]) == {"head": 2, "workers": 4}
    old = [release(ray_head_pod(active))] + [
        release(ray_worker_pod(active, "workers", replica_index=i, seed=f"o{i}")) for i in (0, 1)
    ]
    new = [ray_head_pod(pending, created=10)] + [
        ray_worker_pod(pending, "workers", replica_index=i, created=11, seed=f"n{i}")
        for i in (0, 1)
    ]
    slices = [workload(service, {"head": 1, "workers": 2}, admitted={"head": 1, "workers": 2})]
    outcome = plugin.decide(service, old + new, slices, [active, pending])
    assert outcome.caps == {"head": 1, "workers": 2}
    assert outcome.released == [], "the slice admitted one cluster's worth, and it is in use"
    # the old cluster goes (KubeRay deletes it once the new one serves): its slots pass over
    outcome = plugin.decide(service, new, slices, [pending])
    assert outcome.released == names(new)


# -- order and multi-host replicas, as the RayCluster plugin has them --------------------------


def test_head_first_then_workers_by_replica_index_within_the_admitted_count() -> None:
    job = ray_owner("RayJob", "train")
    rc = cluster_of(job, "train-raycluster-abcde", {"workers": (4, 1)})
    workers = [
        ray_worker_pod(rc, "workers", replica_index=i, created=2 + (3 - i), seed=str(i))
        for i in range(4)
    ]
    head = ray_head_pod(rc, created=9)
    slices = [workload(job, {"head": 1, "workers": 4}, admitted={"head": 1, "workers": 3})]
    outcome = kit().decide(job, [*workers, head], slices, [rc])
    assert outcome.released == names([head, *workers[:3]])
    assert outcome.caps == {"head": 1, "workers": 3}


def test_multi_host_replicas_are_released_whole_with_hosts_from_their_raycluster() -> None:
    job = ray_owner("RayJob", "train")
    rc = cluster_of(job, "train-raycluster-abcde", {"tpu": (2, 2)})
    replicas = []
    for r in range(2):
        name = ray_replica_name("tpu", f"r{r}")
        replicas.append(
            [
                ray_worker_pod(
                    rc, "tpu", replica_index=r, replica_name=name, host_index=h, seed=f"{r}{h}"
                )
                for h in range(2)
            ]
        )
    incomplete = replicas[1][:1]  # its second host is not created yet
    group = kit().release_group(job, replicas[0][0], [rc])
    assert group == ReleaseGroup(f"train-raycluster-abcde/{ray_replica_name('tpu', 'r0')}", 2)
    slices = [workload(job, {"head": 1, "tpu": 4}, admitted={"head": 1, "tpu": 3})]
    outcome = kit().decide(job, [*replicas[0], *incomplete], slices, [rc])
    assert outcome.released == names(replicas[0]), "a replica missing a host waits"
    outcome = kit().decide(job, [*replicas[0], *replicas[1]], slices, [rc])
    assert outcome.released == names(replicas[0]), "3 admitted: the second replica (2) waits"


def test_owner_facts_reach_the_hooks_under_the_via_key() -> None:
    job = ray_owner("RayJob", "train")
    rc = cluster_of(job, "train-raycluster-abcde", {"tpu": (1, 4)})
    facts = {VIA_FACTS: {"train-raycluster-abcde": rayjob_plugin.ungater_owner_facts(rc)}}
    assert rayjob_plugin.ungater_desired_counts(facts) == {"head": 1, "tpu": 4}
    assert rayjob_plugin.ungater_desired_counts({}) is None


# -- the whole controller on the in-memory API server -------------------------------------------


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def config(*kinds: tuple[str, str]) -> Config:
    return Config.model_validate(
        {
            "mode": "release",  # the test plays Kueue: no other releaser
            "kinds": [{"group": g, "kind": k} for g, k in kinds],
            "expectationsTimeoutSeconds": 30,
            "watch": {"backoffInitialSeconds": 0.01, "backoffMaxSeconds": 0.05},
        }
    )


PLUGINS = {"raycluster": raycluster_plugin, "rayjob": rayjob_plugin}


def released_names(fake: FakeKube) -> set[str]:
    return {
        p["metadata"]["name"]
        for p in fake.items(PODS, NAMESPACE)
        if GATE not in [g["name"] for g in p["spec"].get("schedulingGates") or []]
    }


@pytest.mark.anyio
async def test_controller_releases_a_rayjobs_pods_through_its_raycluster() -> None:
    """The RayJob's slice releases its RayCluster's pods, head first, up to the admitted
    count and the RayCluster's size; a pod with the same ``ray.io/cluster`` label under
    another RayCluster is never released; the RayCluster growing (the autoscaler) lets the
    next slice's pods go."""
    fake = FakeKube(seed=3, max_delay=0.01, strict=True)
    job = ray_owner("RayJob", "train")
    rc = fake.put(RAYCLUSTERS, cluster_of(job, "train-raycluster-abcde", {"workers": (2, 1)}))
    head = fake.put(PODS, ray_head_pod(rc))
    workers = [
        fake.put(PODS, ray_worker_pod(rc, "workers", replica_index=i, created=2 + i, seed=str(i)))
        for i in range(3)  # one more than the RayCluster wants: KubeRay is deleting it
    ]
    foreign_rc = cluster_of(ray_owner("RayJob", "other"), "train-raycluster-abcde", {})
    foreign_rc["metadata"]["uid"] = new_uid("RayCluster", "someone else's")
    impostor = fake.put(PODS, ray_head_pod(foreign_rc, created=0))
    async with running(fake, config(("ray.io", "RayCluster"), RAYJOB), plugins=PLUGINS):
        fake.put(
            WORKLOADS, workload(job, {"head": 1, "workers": 3}, admitted={"head": 1, "workers": 3})
        )
        expected = {head["metadata"]["name"], *(w["metadata"]["name"] for w in workers[:2])}
        await eventually(lambda: released_names(fake) == expected, what="head + 2 workers")
        await holds_for(
            lambda: released_names(fake) == expected, 0.3, what="capped at the RayCluster's 2"
        )
        assert impostor["metadata"]["name"] not in released_names(fake)
        # the autoscaler grows the RayCluster to 3: the third worker fits the admitted 3
        rc["spec"]["workerGroupSpecs"][0]["replicas"] = 3
        fake.put(RAYCLUSTERS, rc)
        expected.add(workers[2]["metadata"]["name"])
        await eventually(lambda: released_names(fake) == expected, what="the third worker")


def live_released_workers(fake: FakeKube) -> int:
    return sum(
        1
        for p in fake.items(PODS, NAMESPACE)
        if p["metadata"]["labels"].get("ray.io/node-type") == "worker"
        and GATE not in [g["name"] for g in p["spec"].get("schedulingGates") or []]
        and not p["metadata"].get("deletionTimestamp")
    )


@pytest.mark.anyio
async def test_a_slot_freed_before_the_raycluster_shrink_is_seen_is_not_refilled() -> None:
    """The autoscaler shrinks the RayJob's RayCluster 5 -> 2 and KubeRay deletes a released
    worker; the RayCluster watch lags, so the cache still says 5 when the deletion arrives. The
    controller reads the RayCluster (the size of a RayJob) before refilling and releases
    nothing beyond 2; grown back to 5, the freed slot is refilled up to the admitted 3."""
    fake = FakeKube()
    client = Lagging(fake)
    job = ray_owner("RayJob", "train")
    rc = fake.put(RAYCLUSTERS, cluster_of(job, "train-raycluster-abcde", {"workers": (5, 1)}))
    fake.put(PODS, release(ray_head_pod(rc)))
    workers = []
    for i in range(5):
        pod = ray_worker_pod(rc, "workers", replica_index=i, created=2 + i, seed=str(i))
        workers.append(fake.put(PODS, release(pod) if i < 3 else pod))
    fake.put(
        WORKLOADS, workload(job, {"head": 1, "workers": 5}, admitted={"head": 1, "workers": 3})
    )
    async with running(client, config(RAYJOB), plugins=PLUGINS):
        await holds_for(lambda: live_released_workers(fake) == 3, 0.2, what="cap 3 reached")
        held = client.hold("rayclusters")
        small = copy.deepcopy(rc)
        small["spec"]["workerGroupSpecs"][0]["replicas"] = 2
        fake.put(RAYCLUSTERS, small)
        fake.delete(PODS, NAMESPACE, workers[0]["metadata"]["name"])
        await holds_for(lambda: live_released_workers(fake) <= 2, 0.5, what="fresh RayCluster")
        held.set()
        await holds_for(lambda: live_released_workers(fake) <= 2, 0.2, what="after the watch")
        grown = copy.deepcopy(small)
        grown["spec"]["workerGroupSpecs"][0]["replicas"] = 5
        fake.put(RAYCLUSTERS, grown)
        await eventually(lambda: live_released_workers(fake) == 3, what="refilled to cap 3")
