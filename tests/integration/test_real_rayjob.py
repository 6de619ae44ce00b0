"""RayJob and RayService under the real KubeRay operator v1.6.1 and the real Kueue v0.17.0.

Kueue puts the Workload slices on the RayJob (RayService); KubeRay creates a RayCluster with a
generated name and a controller reference to it, and the RayCluster owns the pods. ungater
selects the pods through that RayCluster and proves them by the UID chain Pod -> RayCluster ->
RayJob. Scaling is the RayCluster's (KubeRay disregards later RayJob spec changes; the
autoscaler, played here by a patch, edits the RayCluster, and Kueue's next slice counts its
workers). ungater releases ``UNGATER_GATE`` beside Kueue releasing its own gate (``realpeers``).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import pytest

from tests.integration.k8s import RAYCLUSTERS, Kube
from tests.integration.realpeers import (
    KUEUE_GATE,
    UNGATER_GATE,
    Event,
    SliceWatch,
    controller_uid,
    kueue_pod_set,
    ray_cluster_spec,
)
from tests.integration.support import PatchLog, config_for, running_controller
from tests.objects import PODS, WORKLOADS, gates_of
from tests.polling import eventually
from tests.seen import cache_holds, owner_key, reconciled, waiting
from ungater._controller.controller import Controller
from ungater._kube.client import Resource

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

RAYJOBS = Resource("ray.io", "v1", "rayjobs", "RayJob")
RAYSERVICES = Resource("ray.io", "v1", "rayservices", "RayService")
KINDS = [{"group": "ray.io", "kind": "RayJob"}, {"group": "ray.io", "kind": "RayService"}]


def cluster_spec(replicas: int) -> dict[str, Any]:
    return ray_cluster_spec(replicas, autoscaling=True)


def meta(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "labels": {"kueue.x-k8s.io/queue-name": "user-queue"},
        "annotations": {"kueue.x-k8s.io/elastic-job": "true"},
    }


def ray_job(name: str, replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": meta(name),
        "spec": {
            "entrypoint": "python -c 'print(1)'",
            "submissionMode": "HTTPMode",  # no submitter Job (its pod set would be Kueue's)
            "shutdownAfterJobFinishes": True,
            "rayClusterSpec": cluster_spec(replicas),
        },
    }


def ray_service(name: str, replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": meta(name),
        "spec": {"rayClusterConfig": cluster_spec(replicas)},
    }


def sizes(rc: dict[str, Any]) -> dict[str, int]:
    if rc["spec"].get("suspend"):
        return {"head": 0}
    out = {"head": 1}
    for g in rc["spec"].get("workerGroupSpecs") or ():
        out[g["groupName"].lower()] = int(g.get("replicas", 0)) * int(g.get("numOfHosts", 1))
    return out


@dataclass
class ClusterWatch(SliceWatch):
    """``SliceWatch`` for an owner whose size is its RayCluster's: the Workloads are the
    owner's (``owner_uid``), the owner events and the size the RayCluster's."""

    cluster_uid: str = ""

    def replay(self, gate: str = UNGATER_GATE) -> list[str]:
        saved = self.events
        self.events = [self._as_owner(e) for e in saved]
        try:
            return super().replay(gate)
        finally:
            self.events = saved

    def _as_owner(self, ev: Event) -> Event:
        if ev.resource != "owner" or ev.obj["metadata"]["uid"] != self.cluster_uid:
            return ev
        obj = copy.deepcopy(ev.obj)
        obj["metadata"]["uid"] = self.owner_uid
        return dataclasses.replace(ev, obj=obj)


@asynccontextmanager
async def cluster_watch(
    kube: Kube, ns: str, owner: dict[str, Any], rc: dict[str, Any]
) -> AsyncIterator[ClusterWatch]:
    owner_uid, cluster_uid = owner["metadata"]["uid"], rc["metadata"]["uid"]
    watch = ClusterWatch(
        kube,
        ns,
        RAYCLUSTERS,
        owner_uid,
        sizes,
        kueue_pod_set,
        lambda pod: owner_uid if controller_uid(pod) == cluster_uid else "",
        owner_name=rc["metadata"]["name"],
        cluster_uid=cluster_uid,
    )
    async with anyio.create_task_group() as tg:
        await watch.record(tg)  # returns once each watch has listed
        try:
            yield watch
            await watch.finish()  # the record ends at the server's present (or has a gap)
        finally:
            tg.cancel_scope.cancel()
    for line in watch.replay(KUEUE_GATE):
        print(f"differential: Kueue over its cap: {line}")
    violations = watch.replay(UNGATER_GATE)
    assert not violations, violations


async def cluster_of(kube: Kube, ns: str, owner: dict[str, Any]) -> dict[str, Any]:
    """The RayCluster KubeRay created for ``owner``: found by its controller reference's UID."""
    found: list[dict[str, Any]] = []

    async def created() -> bool:
        found[:] = [
            rc
            for rc in await kube.list(RAYCLUSTERS, ns)
            if controller_uid(rc) == owner["metadata"]["uid"]
        ]
        return bool(found)

    await eventually(created, timeout=30, what=f"the RayCluster of {owner['metadata']['name']}")
    return found[0]


async def live_pods(kube: Kube, ns: str, rc: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        p
        for p in await kube.list(PODS, ns, f"ray.io/cluster={rc['metadata']['name']}")
        if not p["metadata"].get("deletionTimestamp")
    ]


async def n_workers(kube: Kube, ns: str, rc: dict[str, Any], n: int) -> bool:
    pods = await live_pods(kube, ns, rc)
    return sum(1 for p in pods if kueue_pod_set(p) == "workers") == n


async def autoscale(
    kube: Kube, ns: str, rc: dict[str, Any], replicas: int, delete: Sequence[str] = ()
) -> None:
    """What the Ray autoscaler writes: the worker group's replicas and, to shrink, the workers
    to delete (with autoscaling on, KubeRay deletes only those)."""
    ops: list[dict[str, Any]] = [
        {"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": replicas}
    ]
    if delete:
        ops.append(
            {
                "op": "add",
                "path": "/spec/workerGroupSpecs/0/scaleStrategy",
                "value": {"workersToDelete": list(delete)},
            }
        )
    await kube.json_patch(RAYCLUSTERS, ns, rc["metadata"]["name"], ops)


async def kept_gated(
    ctl: Controller, kube: Kube, ns: str, owner: dict[str, Any], rc: dict[str, Any], n: int
) -> None:
    """The controller has seen the RayCluster's pods as they are now, and a decision made after
    that keeps the ``n`` pods still carrying our gate waiting, each with a reason."""
    pods = await live_pods(kube, ns, rc)
    gated = {p["metadata"]["name"] for p in pods if UNGATER_GATE in gates_of(p)}
    assert len(gated) == n, f"gated: {sorted(gated)}"
    await eventually(lambda: cache_holds(ctl, "pods", pods), timeout=30, what="pods cached")
    decision = await reconciled(ctl, owner_key(owner), decided=True, timeout=30)
    kept = waiting(decision)
    assert gated <= set(kept), f"gated {sorted(gated)}, the decision keeps {kept}"


def by_replica_index(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    workers = [p for p in pods if kueue_pod_set(p) == "workers"]
    return sorted(
        workers, key=lambda p: int(p["metadata"]["labels"]["ray.io/worker-group-replica-index"])
    )


@pytest.mark.kueue_quota(cpu=6)
async def test_rayjob_scales_within_the_real_quota_through_its_raycluster(
    kueue_cluster: Any, kueue_kube: Kube, kueue_namespace: str
) -> None:
    ns = kueue_namespace
    cfg = config_for(ns, gate=UNGATER_GATE, kinds=KINDS)
    async with running_controller(kueue_cluster.kubeconfig_path, cfg) as ctl:
        job = await kueue_kube.create(RAYJOBS, ns, ray_job("train", 2))
        assert job["spec"].get("suspend") is True, "Kueue's webhook suspends a queued RayJob"
        rc = await cluster_of(kueue_kube, ns, job)
        ref = next(r for r in rc["metadata"]["ownerReferences"] if r.get("controller"))
        assert (ref["kind"], ref["uid"]) == ("RayJob", job["metadata"]["uid"])
        labels = rc["metadata"]["labels"]
        assert labels["ray.io/originated-from-crd"] == "RayJob"
        assert labels["ray.io/originated-from-cr-name"] == "train"
        async with cluster_watch(kueue_kube, ns, job, rc) as w:
            await w.settle("head + 2 workers", expect={"head": 1, "workers": 2})
            pods = await live_pods(kueue_kube, ns, rc)
            assert not any(
                "ray.io/originated-from-cr-name" in p["metadata"]["labels"] for p in pods
            )
            # Kueue's RayCluster webhook gated the child: KubeRay copied the elastic annotation
            head_template = rc["spec"]["headGroupSpec"]["template"]["spec"]
            assert KUEUE_GATE in [g["name"] for g in head_template["schedulingGates"]]
            await autoscale(kueue_kube, ns, rc, 4)
            await w.settle("4 workers", expect={"head": 1, "workers": 4})
            # 1 + 8 CPUs > 6: the scale-up slice waits; the new workers stay gated
            await autoscale(kueue_kube, ns, rc, 8)
            await eventually(
                lambda: n_workers(kueue_kube, ns, rc, 8), timeout=30, what="8 worker pods"
            )
            await kept_gated(ctl, kueue_kube, ns, job, rc, 4)
            await w.settle("8 workers, beyond quota", expect={"head": 1, "workers": 4})
            # the autoscaler shrinks to 2, naming its victims: two released, four gated
            victims = by_replica_index(await live_pods(kueue_kube, ns, rc))[2:]
            await autoscale(kueue_kube, ns, rc, 2, [p["metadata"]["name"] for p in victims])
            await eventually(
                lambda: n_workers(kueue_kube, ns, rc, 2), timeout=30, what="2 worker pods"
            )
            await w.settle("back to 2 workers", expect={"head": 1, "workers": 2})
        slices = [
            wl
            for wl in await kueue_kube.list(WORKLOADS, ns)
            if controller_uid(wl) == job["metadata"]["uid"]
        ]
        assert len(slices) >= 2, "the scale-up made a new slice, owned by the RayJob"
        assert {ps["name"] for wl in slices for ps in wl["spec"]["podSets"]} == {"head", "workers"}


@pytest.mark.kueue_quota(cpu=6)
async def test_a_pod_under_a_lookalike_raycluster_is_never_released(
    kueue_cluster: Any, kueue_kube: Kube, kueue_namespace: str
) -> None:
    """Labels prove nothing: a pod carrying the name label of the RayJob's RayCluster but
    owned by another RayCluster (a suspended decoy nobody queued) is selected with the real
    ones and stays gated while they go."""
    ns = kueue_namespace
    cfg = config_for(ns, gate=UNGATER_GATE, kinds=KINDS)
    patches = PatchLog()
    async with running_controller(kueue_cluster.kubeconfig_path, cfg, patches.wrap) as ctl:
        job = await kueue_kube.create(RAYJOBS, ns, ray_job("lookalike", 1))
        rc = await cluster_of(kueue_kube, ns, job)
        decoy_spec = {**cluster_spec(0), "suspend": True}
        decoy = await kueue_kube.create(
            RAYCLUSTERS,
            ns,
            {
                "apiVersion": "ray.io/v1",
                "kind": "RayCluster",
                "metadata": {"name": "decoy"},
                "spec": decoy_spec,
            },
        )

        async def created() -> bool:
            return len(await live_pods(kueue_kube, ns, rc)) == 2

        await eventually(created, timeout=30, what="the head and the worker")

        async def released_real() -> bool:
            pods = await live_pods(kueue_kube, ns, rc)
            mine = [p for p in pods if controller_uid(p) == rc["metadata"]["uid"]]
            return len(mine) == 2 and all(UNGATER_GATE not in gates_of(p) for p in mine)

        await eventually(released_real, timeout=60, what="head and worker released")
        worker = by_replica_index(await live_pods(kueue_kube, ns, rc))[0]
        impostor = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "impostor",
                "labels": worker["metadata"]["labels"],  # the same worker, replica index 0
                "ownerReferences": [
                    {
                        "apiVersion": "ray.io/v1",
                        "kind": "RayCluster",
                        "name": "decoy",
                        "uid": decoy["metadata"]["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": {
                "schedulingGates": [{"name": UNGATER_GATE}],
                "containers": [{"name": "ray", "image": "registry.invalid/ray:2"}],
            },
        }
        impostor = await kueue_kube.create(PODS, ns, impostor)
        # room for one more worker: KubeRay (which counts its pods by label) creates none, as
        # the impostor looks like one; Kueue admits the larger slice; the free slot must not
        # go to the impostor
        await autoscale(kueue_kube, ns, rc, 2)

        admitted: list[dict[str, Any]] = []

        async def admitted_two() -> bool:
            for wl in await kueue_kube.list(WORKLOADS, ns):
                counts = {p["name"]: p["count"] for p in wl["spec"]["podSets"]}
                conds = {
                    c["type"]: c["status"] for c in (wl.get("status") or {}).get("conditions") or ()
                }
                if (
                    controller_uid(wl) == job["metadata"]["uid"]
                    and counts.get("workers") == 2
                    and conds.get("Admitted") == "True"
                ):
                    admitted[:] = [wl]
                    return True
            return False

        await eventually(admitted_two, timeout=60, what="the slice for 2 workers admitted")
        # the controller has the admitted slice and the impostor, and decided after that
        await eventually(
            lambda: (
                cache_holds(ctl, "workloads", admitted) and cache_holds(ctl, "pods", [impostor])
            ),
            timeout=30,
            what="the admitted slice and the impostor cached",
        )
        decision = await reconciled(ctl, owner_key(job), decided=True, timeout=30)
        assert "impostor" in waiting(decision), decision
        await patches.answered()  # every release sent so far shows on the API server
        pod = await kueue_kube.get(PODS, ns, "impostor")
        assert pod is not None, "the garbage collector keeps it: its owner exists"
        assert UNGATER_GATE in gates_of(pod), "selected by label, refused by the UID chain"
        assert await released_real(), "the RayJob's own pods stay released"
    # over the controller's whole run, up to its stop, not one release was sent for it
    assert "impostor" not in patches.released, patches.released


@pytest.mark.kueue_quota(cpu=6)
async def test_rayservice_is_admitted_and_released_through_its_raycluster(
    kueue_cluster: Any, kueue_kube: Kube, kueue_namespace: str
) -> None:
    """Kueue v0.17.0 admits a RayService's slice and KubeRay creates its (pending) RayCluster;
    ungater releases head and workers. Kueue reads a scaled worker count only from the
    *active* RayCluster, and with no kubelet here the cluster never serves, so growing it makes
    no new slice: the surplus stays gated."""
    ns = kueue_namespace
    cfg = config_for(ns, gate=UNGATER_GATE, kinds=KINDS)
    async with running_controller(kueue_cluster.kubeconfig_path, cfg) as ctl:
        svc = await kueue_kube.create(RAYSERVICES, ns, ray_service("serve", 2))
        rc = await cluster_of(kueue_kube, ns, svc)
        ref = next(r for r in rc["metadata"]["ownerReferences"] if r.get("controller"))
        assert (ref["kind"], ref["uid"]) == ("RayService", svc["metadata"]["uid"])
        async with cluster_watch(kueue_kube, ns, svc, rc) as w:
            await w.settle("head + 2 workers", expect={"head": 1, "workers": 2})
            await autoscale(kueue_kube, ns, rc, 3)
            await eventually(
                lambda: n_workers(kueue_kube, ns, rc, 3), timeout=30, what="3 worker pods"
            )
            await kept_gated(ctl, kueue_kube, ns, svc, rc, 1)
            await w.settle("3 workers, no new slice", expect={"head": 1, "workers": 2})
        slices = [
            wl
            for wl in await kueue_kube.list(WORKLOADS, ns)
            if controller_uid(wl) == svc["metadata"]["uid"]
        ]
        assert [[ps["count"] for ps in wl["spec"]["podSets"]] for wl in slices] == [[1, 2]]
        svc = await kueue_kube.get(RAYSERVICES, ns, "serve") or {}
        status = svc.get("status") or {}
        assert (status.get("activeServiceStatus") or {}).get("rayClusterName", "") == ""
        assert status["pendingServiceStatus"]["rayClusterName"] == rc["metadata"]["name"]
