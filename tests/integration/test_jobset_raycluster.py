"""JobSet and RayCluster on the real control plane. Their operators are not running: the test
creates the objects they would create (child Jobs; Ray pods) with the same labels and
ownerReferences. For JobSet the real Job controller then creates the pods from the child Jobs."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.jobs import count_pods
from tests.integration.k8s import JOBSETS, RAYCLUSTERS, Kube
from tests.integration.monitor import (
    JOBSET_OWNERS,
    RAYCLUSTER_OWNERS,
    jobset_uid,
    live_released,
    monitoring,
    ray_pod_set,
)
from tests.integration.raypods import CONTAINER, ray_pod
from tests.integration.support import admit, create_workload
from tests.objects import GATE, JOBS, PODS, gates_of
from tests.polling import equals, eventually, holds_for
from ungater.testing import owner_ref

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


def _template(parallelism: int) -> dict[str, Any]:
    return {
        "spec": {
            "parallelism": parallelism,
            "completions": parallelism,
            "completionMode": "Indexed",
            "template": {"spec": {"restartPolicy": "Never", "containers": [CONTAINER]}},
        }
    }


async def make_jobset(
    kube: Kube, ns: str, name: str, rjobs: dict[str, tuple[int, int]]
) -> dict[str, Any]:
    """A JobSet and, as the JobSet controller would, its child Jobs (replicas x parallelism)."""
    js = await kube.create(
        JOBSETS,
        ns,
        {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": {"name": name, "annotations": {"kueue.x-k8s.io/elastic-job": "true"}},
            "spec": {
                "replicatedJobs": [
                    {"name": rj, "replicas": replicas, "template": _template(par)}
                    for rj, (replicas, par) in rjobs.items()
                ]
            },
        },
    )
    uid = js["metadata"]["uid"]
    for rj, (replicas, par) in rjobs.items():
        for idx in range(replicas):
            labels = {
                "jobset.sigs.k8s.io/jobset-name": name,
                "jobset.sigs.k8s.io/jobset-uid": uid,
                "jobset.sigs.k8s.io/replicatedjob-name": rj,
                "jobset.sigs.k8s.io/replicatedjob-replicas": str(replicas),
                "jobset.sigs.k8s.io/job-index": str(idx),
                "kueue.x-k8s.io/podset": rj,
            }
            body = _template(par)
            body["spec"]["template"]["metadata"] = {"labels": labels, "annotations": dict(labels)}
            body["spec"]["template"]["spec"]["schedulingGates"] = [{"name": GATE}]
            await kube.create(
                JOBS,
                ns,
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "metadata": {
                        "name": f"{name}-{rj}-{idx}",
                        "labels": labels,
                        "annotations": dict(labels),
                        "ownerReferences": [owner_ref(js)],
                    },
                    **body,
                },
            )
    return js


def _js_key(p: dict[str, Any]) -> tuple[str, int, int]:
    ann = p["metadata"]["annotations"]
    return (
        p["metadata"]["labels"]["jobset.sigs.k8s.io/replicatedjob-name"],
        int(ann["jobset.sigs.k8s.io/job-index"]),
        int(ann["batch.kubernetes.io/job-completion-index"]),
    )


async def test_jobset_pod_sets_have_their_own_caps_and_order(
    kube: Kube, kube_namespace: str, controller: Any
) -> None:
    ns = kube_namespace
    js = await make_jobset(kube, ns, "train", {"driver": (1, 1), "workers": (2, 2)})
    sel = f"jobset.sigs.k8s.io/jobset-uid={js['metadata']['uid']}"
    await eventually(
        lambda: count_pods(kube, ns, sel, 5), timeout=30, what="5 pods from the Job controller"
    )
    await create_workload(kube, js, "jobset-train-a", {"driver": 1, "workers": 4})

    async def released() -> list[tuple[str, int, int]]:
        return sorted(_js_key(p) for p in live_released(await kube.list(PODS, ns, sel)))

    want = [("driver", 0, 0), ("workers", 0, 0), ("workers", 0, 1), ("workers", 1, 0)]
    # the Workload is the JobSet's: its pods are judged under it, each in its replicated Job
    by_jobset = {"owners": JOBSET_OWNERS, "owner_of": jobset_uid}
    async with monitoring(kube, ns, sel, **by_jobset), controller() as ctl:
        await admit(kube, ns, "jobset-train-a", {"driver": 1, "workers": 3})
        await eventually(lambda: equals(released(), want), what="driver + 3 workers in index order")
        await holds_for(lambda: equals(released(), want), 1.0)
    decision = next(d for d in ctl.state.decisions.values() if d.active_slice == "jobset-train-a")
    caps = {r.name: r.cap for r in decision.pod_sets}
    assert caps == {"driver": 1, "workers": 3}


async def test_raycluster_head_first_and_whole_multi_host_replicas(
    kube: Kube, kube_namespace: str, controller: Any
) -> None:
    ns = kube_namespace
    rc = await kube.create(
        RAYCLUSTERS,
        ns,
        {
            "apiVersion": "ray.io/v1",
            "kind": "RayCluster",
            "metadata": {"name": "ray", "annotations": {"kueue.x-k8s.io/elastic-job": "true"}},
            "spec": {
                "headGroupSpec": {
                    "rayStartParams": {},
                    "template": {"spec": {"containers": [CONTAINER]}},
                },
                "workerGroupSpecs": [
                    {
                        "groupName": "tpu",
                        "replicas": 2,
                        "minReplicas": 0,
                        "maxReplicas": 4,
                        "numOfHosts": 2,
                        "rayStartParams": {},
                        "template": {"spec": {"containers": [CONTAINER]}},
                    }
                ],
            },
        },
    )
    await kube.create(
        PODS,
        ns,
        ray_pod(rc, "ray-head-x7k2p", {"ray.io/node-type": "head", "ray.io/group": "headgroup"}),
    )
    for replica, rname in enumerate(("ray-tpu-worker-abcde", "ray-tpu-worker-fghij")):
        for host in range(2):
            await kube.create(
                PODS,
                ns,
                ray_pod(
                    rc,
                    f"{rname}-{host}",
                    {
                        "ray.io/node-type": "worker",
                        "ray.io/group": "tpu",
                        "ray.io/worker-group-replica-index": str(replica),
                        "ray.io/worker-group-replica-name": rname,
                        "ray.io/replica-host-index": str(host),
                    },
                ),
            )
    await kube.create(
        PODS,
        ns,
        ray_pod(
            rc,
            "orphan-with-ray-labels",
            {
                "ray.io/node-type": "worker",
                "ray.io/group": "tpu",
                "ray.io/worker-group-replica-index": "0",
                "ray.io/worker-group-replica-name": "fake",
                "ray.io/replica-host-index": "0",
            },
            owned=False,
        ),
    )
    sel = "ray.io/cluster=ray"
    await create_workload(kube, rc, "raycluster-ray-a", {"head": 1, "tpu": 4})

    async def released() -> list[str]:
        return sorted(p["metadata"]["name"] for p in live_released(await kube.list(PODS, ns, sel)))

    want = ["ray-head-x7k2p", "ray-tpu-worker-abcde-0", "ray-tpu-worker-abcde-1"]
    by_cluster = {"owners": RAYCLUSTER_OWNERS, "pod_set_of": ray_pod_set}
    async with monitoring(kube, ns, sel, **by_cluster), controller():
        await admit(kube, ns, "raycluster-ray-a", {"head": 1, "tpu": 3})  # 3 of 4: one replica fits
        await eventually(lambda: equals(released(), want), what="head and one whole replica")
        await holds_for(lambda: equals(released(), want), 1.0)
        orphan = await kube.get(PODS, ns, "orphan-with-ray-labels")
        assert orphan is not None and GATE in gates_of(orphan)
