"""Each built-in kind as the explorer's stories write it: the owner (and the objects between it
and its pods), its pods, its size, and its slices.

A story says "the owner shrinks to 2" or "pod 3 created"; the kind says which object that
writes (a Job's parallelism, a JobSet's replicated Job, a RayCluster's worker replicas, a
RayJob's RayCluster) and how its pods look and go (a Job's pods carry the tracking finalizer, so
a delete first shows a deletion timestamp; a RayCluster's go in one DELETED event). The oracle
reads the owner's true size from the same objects through the kind's plugin.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ungater_plugins.job as job_plugin
import ungater_plugins.jobset as jobset_plugin
import ungater_plugins.raycluster as raycluster_plugin
import ungater_plugins.rayjob as rayjob_plugin

from tests.objects import JOBS, RAYCLUSTERS, WORKLOADS
from tests.unit.podfactory import (
    NAMESPACE,
    cluster_of,
    job,
    job_pod,
    jobset,
    jobset_child_job,
    ray_owner,
    ray_worker_pod,
    raycluster,
    workload,
)
from ungater._kube.client import PODS, Resource

JOBSETS = Resource("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet")
RAYJOBS = Resource("ray.io", "v1", "rayjobs", "RayJob")
RAY_WORKERS = "workers"
GATE = "kueue.x-k8s.io/elastic-job"


@dataclass(frozen=True)
class Kind:
    """How one built-in kind's objects are written (``owner``: the object the slices belong
    to; ``sized``: the object whose spec holds the size; ``parent``: the pods' controller)."""

    name: str
    group: str
    kind: str
    resource: Resource  # the owner's
    pod_set: str
    module: Any
    build: Callable[[Any, str, int], None]  # (world, owner name, size): writes the objects
    sized: Callable[[str], tuple[Resource, str]]  # owner name -> the object holding the size
    set_size: Callable[[dict[str, Any], int], None]
    pod: Callable[[dict[str, Any], int, str], dict[str, Any]]  # (parent, index, seed)
    parent: Callable[[str], tuple[Resource, str]]  # owner name -> the pods' controller
    finalizers: bool  # its pods carry a finalizer (a delete shows a deletion timestamp first)

    def config(self) -> dict[str, str]:
        return {"group": self.group, "kind": self.kind}


# -- Job ------------------------------------------------------------------------------------------


def _job_build(world: Any, name: str, size: int) -> None:
    world.fake.put(JOBS, job(name, parallelism=size, completions=8))


def _job_size(obj: dict[str, Any], size: int) -> None:
    obj["spec"]["parallelism"] = size


def _job_pod(parent: dict[str, Any], index: int, seed: str) -> dict[str, Any]:
    return job_pod(parent, index=index, created=1 + index, seed=seed)


JOB = Kind(
    "Job",
    "batch",
    "Job",
    JOBS,
    "main",
    job_plugin,
    _job_build,
    lambda name: (JOBS, name),
    _job_size,
    _job_pod,
    lambda name: (JOBS, name),
    finalizers=True,
)

# -- JobSet: one replicated Job, sized by its template's parallelism ------------------------------


def _child(name: str) -> str:
    return f"{name}-{RAY_WORKERS}-0"


def _jobset_build(world: Any, name: str, size: int) -> None:
    js = jobset(name, {RAY_WORKERS: 1})
    js["spec"]["replicatedJobs"][0]["template"]["spec"] = {"parallelism": size, "completions": 8}
    js = world.fake.put(JOBSETS, js)
    world.fake.put(JOBS, jobset_child_job(js, RAY_WORKERS, 0, parallelism=size))


def _jobset_size(obj: dict[str, Any], size: int) -> None:
    obj["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"] = size


JOBSET = Kind(
    "JobSet",
    "jobset.x-k8s.io",
    "JobSet",
    JOBSETS,
    RAY_WORKERS,
    jobset_plugin,
    _jobset_build,
    lambda name: (JOBSETS, name),
    _jobset_size,
    _job_pod,
    lambda name: (JOBS, _child(name)),
    finalizers=True,
)

# -- RayCluster: one worker group of single-host replicas ----------------------------------------


def _rc_build(world: Any, name: str, size: int) -> None:
    world.fake.put(RAYCLUSTERS, raycluster(name, {RAY_WORKERS: (size, 1)}))


def _rc_size(obj: dict[str, Any], size: int) -> None:
    obj["spec"]["workerGroupSpecs"][0]["replicas"] = size


def _ray_pod(parent: dict[str, Any], index: int, seed: str) -> dict[str, Any]:
    return ray_worker_pod(parent, RAY_WORKERS, replica_index=index, created=2 + index, seed=seed)


RAYCLUSTER = Kind(
    "RayCluster",
    "ray.io",
    "RayCluster",
    RAYCLUSTERS,
    RAY_WORKERS,
    raycluster_plugin,
    _rc_build,
    lambda name: (RAYCLUSTERS, name),
    _rc_size,
    _ray_pod,
    lambda name: (RAYCLUSTERS, name),
    finalizers=False,
)

# -- RayJob: slices on the RayJob, size and pods through the RayCluster it created (select_via) --


def _cluster(name: str) -> str:
    return f"{name}-raycluster-x7k2p"


def _rayjob_build(world: Any, name: str, size: int) -> None:
    rj = world.fake.put(RAYJOBS, ray_owner("RayJob", name, workers=size))
    world.fake.put(RAYCLUSTERS, cluster_of(rj, _cluster(name), {RAY_WORKERS: (size, 1)}))


RAYJOB = Kind(
    "RayJob",
    "ray.io",
    "RayJob",
    RAYJOBS,
    RAY_WORKERS,
    rayjob_plugin,
    _rayjob_build,
    lambda name: (RAYCLUSTERS, _cluster(name)),
    _rc_size,
    _ray_pod,
    lambda name: (RAYCLUSTERS, _cluster(name)),
    finalizers=False,
)

KINDS: dict[str, Kind] = {k.name: k for k in (JOB, JOBSET, RAYCLUSTER, RAYJOB)}


# -- what stories write, through a kind ----------------------------------------------------------


def owner_object(world: Any, name: str) -> dict[str, Any]:
    obj = world.fake.read(world.kind.resource, NAMESPACE, name)
    assert obj is not None, name
    return obj


def status_written(world: Any, name: str) -> None:
    """The owner's controller writes the sized object's status (its pods counted): the object
    is then newer than its pods."""
    res, obj_name = world.kind.sized(name)
    obj = world.fake.read(res, NAMESPACE, obj_name)
    obj.setdefault("status", {})["observedPods"] = len(pods_of(world, name))
    world.fake.put(res, obj)


def owner_uid_or_none(world: Any, name: str) -> str | None:
    res = world.kind.resource
    obj = world.fake.objects.get((res.group, res.plural, NAMESPACE, name))
    return None if obj is None else str(obj["metadata"]["uid"])


def resize(world: Any, name: str, size: int) -> None:
    res, obj_name = world.kind.sized(name)
    obj = world.fake.read(res, NAMESPACE, obj_name)
    world.kind.set_size(obj, size)
    world.fake.put(res, obj)
    if world.kind is JOBSET:  # the JobSet controller resizes its child Job too
        child = world.fake.read(JOBS, NAMESPACE, _child(name))
        child["spec"]["parallelism"] = size
        world.fake.put(JOBS, child)


def pod(
    world: Any, owner: str, index: int, *, released: bool = False, seed: str = "", gates: Any = None
) -> None:
    res, parent_name = world.kind.parent(owner)
    parent = world.fake.read(res, NAMESPACE, parent_name)
    p = world.kind.pod(parent, index, seed)
    if released:
        p["spec"]["schedulingGates"] = []
        p["status"] = {"phase": "Running"}
    if gates is not None:
        p["spec"]["schedulingGates"] = [{"name": g} for g in gates]
    keep = world.scenario.finalizers
    if keep is None:
        keep = world.kind.finalizers
    _slim(p)
    if not keep:
        p["metadata"].pop("finalizers", None)
    elif not p["metadata"].get("finalizers"):
        p["metadata"]["finalizers"] = ["example.com/keep"]
    world.fake.put(PODS, p)


def _slim(p: dict[str, Any]) -> None:
    """Only what the controller and its plugins read (labels, annotations, owners, gates,
    phase, deletion): every write of the fake copies the pod, and the search makes many."""
    spec = p["spec"]
    for field in ("tolerations", "containers", "enableServiceLinks", "priority"):
        spec.pop(field, None)
    p["status"] = {"phase": p["status"].get("phase", "Pending")}


def pods_of(world: Any, owner: str) -> list[dict[str, Any]]:
    """The owner's pods on the server, read in place (callers copy before writing)."""
    res, parent_name = world.kind.parent(owner)
    parent = world.fake.objects.get((res.group, res.plural, NAMESPACE, parent_name))
    if parent is None:
        return []
    uid = parent["metadata"]["uid"]
    return [
        p
        for key, p in world.fake.objects.items()
        if key[:2] == (PODS.group, PODS.plural)
        and any(r.get("uid") == uid for r in p["metadata"].get("ownerReferences") or [])
    ]


def index_of(world: Any, p: dict[str, Any]) -> int:
    labels = p["metadata"].get("labels") or {}
    for key in ("batch.kubernetes.io/job-completion-index", "ray.io/worker-group-replica-index"):
        if key in labels:
            return int(labels[key])
    raise ValueError(p["metadata"]["name"])


def delete_pods(world: Any, owner: str, indexes: range) -> None:
    """Delete as the owner's controller does: a pod with a finalizer becomes terminating (one
    MODIFIED event); one without goes at once (one DELETED event)."""
    for p in pods_of(world, owner):
        if index_of(world, p) in indexes:
            world.fake.delete(PODS, NAMESPACE, p["metadata"]["name"])


def finalize_pods(world: Any, owner: str) -> None:
    """The owner's controller removes its finalizer from terminating pods: they go."""
    for p in pods_of(world, owner):
        if p["metadata"].get("deletionTimestamp"):
            world.fake.finalize(PODS, NAMESPACE, p["metadata"]["name"])


def slice_name(world: Any, owner: str, seed: str) -> str:
    o = owner_object(world, owner)
    return str(workload(o, {world.kind.pod_set: 1}, seed=seed)["metadata"]["name"])


def new_slice(
    world: Any,
    owner: str,
    count: int,
    seed: str,
    *,
    admitted: bool,
    after: str | None = None,
    at: float = 0,
) -> None:
    o = owner_object(world, owner)
    replaced = f"{NAMESPACE}/{slice_name(world, owner, after)}" if after is not None else None
    ps = world.kind.pod_set
    wl = workload(
        o,
        {ps: count},
        admitted={ps: count} if admitted else None,
        created=at,
        seed=seed,
        replacement_for=replaced,
    )
    world.fake.put(WORKLOADS, wl)


def _slice(world: Any, owner: str, seed: str) -> dict[str, Any]:
    wl = world.fake.read(WORKLOADS, NAMESPACE, slice_name(world, owner, seed))
    assert wl is not None
    return wl


def admit(world: Any, owner: str, seed: str) -> None:
    """Kueue admits a pending slice at its spec count."""
    wl = _slice(world, owner, seed)
    count = wl["spec"]["podSets"][0]["count"]
    fresh = workload(owner_object(world, owner), {world.kind.pod_set: count}, admitted={})
    wl["status"]["admission"] = {
        "clusterQueue": "cluster-queue",
        "podSetAssignments": [
            {"name": world.kind.pod_set, "count": count, "flavors": {"cpu": "default-flavor"}}
        ],
    }
    wl["status"]["conditions"] = fresh["status"]["conditions"]
    world.fake.put(WORKLOADS, wl)


def finish(world: Any, owner: str, seed: str) -> None:
    wl = _slice(world, owner, seed)
    wl["status"]["conditions"].append(
        {"type": "Finished", "status": "True", "reason": "WorkloadSliceReplaced"}
    )
    world.fake.put(WORKLOADS, wl)


def lower(world: Any, owner: str, seed: str, count: int) -> None:
    """Kueue lowers a slice in place after its owner shrank and the victims went."""
    wl = _slice(world, owner, seed)
    wl["spec"]["podSets"][0]["count"] = count
    wl["status"]["admission"]["podSetAssignments"][0]["count"] = count
    world.fake.put(WORKLOADS, wl)


def touch(world: Any, owner: str, seed: str) -> None:
    wl = _slice(world, owner, seed)
    wl["metadata"].setdefault("labels", {})["touched"] = "yes"
    world.fake.put(WORKLOADS, wl)
