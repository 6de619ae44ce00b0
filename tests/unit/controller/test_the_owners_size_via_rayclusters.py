"""The owner's size of a ``select_via`` kind (docs/safety.md, "The owner's size"): a RayJob's
pods are found through the RayClusters it controls, whose size and hosts per replica cap each
group; a freed RayJob slot is refilled only after each RayCluster between is read fresh.
"""

from __future__ import annotations

import pytest

from tests.fakekube import FakeKube
from tests.objects import RAYCLUSTERS, WORKLOADS
from tests.polling import eventually
from tests.unit.controller.viewkit import (
    Recording,
    config,
    gated,
    name,
    released_by_someone,
    standby,
)
from tests.unit.podfactory import (
    NAMESPACE,
    cluster_of,
    ray_head_pod,
    ray_owner,
    ray_replica_name,
    ray_worker_pod,
    release,
    workload,
)
from ungater._decide.indexes import OwnerKey
from ungater._kube.client import PODS
from ungater._model.views import Kind

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_rayjobs_pods_are_decided_through_its_rayclusters_size_and_hosts() -> None:
    """A RayJob's pods are found through the RayCluster it controls, whose size caps each
    group (2 workers of 3 admitted) and whose hosts per replica keep a replica missing a host
    gated (a TPU replica of 2 hosts, one created)."""
    fake = FakeKube()
    owner = ray_owner("RayJob", "train")
    rc = fake.put(
        RAYCLUSTERS, cluster_of(owner, "train-raycluster-abcde", {"workers": (2, 1), "tpu": (1, 2)})
    )
    head = fake.put(PODS, ray_head_pod(rc))
    workers = [
        fake.put(PODS, ray_worker_pod(rc, "workers", replica_index=i, created=2 + i, seed=str(i)))
        for i in range(3)
    ]
    tpu_name = ray_replica_name("tpu", "r0")
    tpu = fake.put(
        PODS,
        ray_worker_pod(rc, "tpu", replica_index=0, replica_name=tpu_name, host_index=0, seed="t"),
    )
    fake.put(
        WORKLOADS,
        workload(
            owner,
            {"head": 1, "workers": 3, "tpu": 2},
            admitted={"head": 1, "workers": 3, "tpu": 2},
        ),
    )
    key = OwnerKey(NAMESPACE, owner["metadata"]["uid"])
    cfg = config(kinds=[{"group": "ray.io", "kind": "RayJob"}])
    async with standby(fake, cfg) as (ctl, _):
        rt = ctl.state.kinds[Kind("ray.io", "RayJob")]
        await eventually(
            lambda: (
                len(rt.pods) == 5
                and ctl.state.workloads.has_owner(key.uid)
                and ctl.state.objects.controlled_by(key.uid)
            ),
            timeout=5,
            what="the RayJob's slice, RayCluster and pods cached",
        )
        decision = (await ctl.reconciler.reconcile(key)).decision
        assert decision is not None
        want = [name(head), name(workers[0]), name(workers[1])]
        assert sorted(decision.released_names) == sorted(want)
        assert [gated(fake, p) for p in (head, *workers, tpu)] == [False] * 3 + [True] * 2


@pytest.mark.parametrize("fresh", ["unchanged", "shrunk", "replaced"])
async def test_a_freed_rayjob_slot_is_refilled_only_from_its_raycluster_read_fresh(
    fresh: str,
) -> None:
    """A RayJob's released worker fails after the cached RayCluster was last seen: the fence
    reads that RayCluster (ray.io/v1 rayclusters, by namespace and name) before refilling.
    Unchanged: the slot is refilled. Shrunk to 1 worker meanwhile: the one live worker
    already fills it. Another object under the name: the size is unknown, nothing is
    released."""
    fake = FakeKube()
    client = Recording(fake)
    owner = ray_owner("RayJob", "train")
    rc_name = "train-raycluster-abcde"
    rc = fake.put(RAYCLUSTERS, cluster_of(owner, rc_name, {"workers": (2, 1)}))
    head = fake.put(PODS, release(ray_head_pod(rc)))
    workers = [
        fake.put(PODS, ray_worker_pod(rc, "workers", replica_index=i, created=2 + i, seed=str(i)))
        for i in range(3)
    ]
    for w in workers[:2]:
        released_by_someone(fake, w)
    fake.put(
        WORKLOADS,
        workload(owner, {"head": 1, "workers": 3}, admitted={"head": 1, "workers": 3}),
    )
    key = OwnerKey(NAMESPACE, owner["metadata"]["uid"])
    cfg = config(kinds=[{"group": "ray.io", "kind": "RayJob"}])
    async with standby(fake, cfg, client=client) as (ctl, _):
        rt = ctl.state.kinds[Kind("ray.io", "RayJob")]

        def synced() -> bool:
            want = {
                p["metadata"]["uid"]: p["metadata"]["resourceVersion"] for p in fake.items(PODS)
            }
            have = {u: v.resource_version for u, v in rt.pods.by_uid.items()}
            return have == want and bool(ctl.state.objects.controlled_by(key.uid))

        await eventually(synced, timeout=5, what="the RayJob's RayCluster and pods cached")
        fake.drop_events = {"rayclusters"}
        if fresh == "shrunk":
            fake.put(RAYCLUSTERS, cluster_of(owner, rc_name, {"workers": (1, 1)}))
        elif fresh == "replaced":
            fake.delete(RAYCLUSTERS, NAMESPACE, rc_name)
            other = cluster_of(owner, rc_name, {"workers": (2, 1)})
            other["metadata"]["uid"] = "uid-another-raycluster"
            fake.put(RAYCLUSTERS, other)
        else:
            fake.put(RAYCLUSTERS, fake.read(RAYCLUSTERS, NAMESPACE, rc_name))  # a newer rv
        released_by_someone(fake, workers[0], phase="Failed")
        await eventually(synced, timeout=5, what="the failed worker cached")
        client.calls.clear()
        await ctl.reconciler.reconcile(key)
        reads = [c for c in client.calls if c[0].plural == "rayclusters"]
        assert reads == [(RAYCLUSTERS, NAMESPACE, rc_name)] * 2
        assert gated(fake, workers[2]) == (fresh != "unchanged")
        assert not gated(fake, head)
        assert [v.uid for v in ctl.state.objects.controlled_by(key.uid)] == [rc["metadata"]["uid"]]
