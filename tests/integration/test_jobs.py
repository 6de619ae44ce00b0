"""batch/v1 Jobs on the real control plane: the real Job controller creates the gated pods, the
test plays Kueue (Workload slices and their status), the controller releases."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests.integration.jobs import count_pods, index, make_job, released_indexes, scale
from tests.integration.k8s import Kube
from tests.integration.monitor import monitoring
from tests.integration.support import (
    admit,
    config_for,
    create_workload,
    evict,
    finish,
    running_controller,
)
from tests.objects import GATE, PODS, WORKLOADS, gates_of
from tests.polling import equals, eventually, holds_for
from ungater._kube.client import Resource
from ungater.testing import owner_ref

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

CONFIGMAPS = Resource("", "v1", "configmaps", "ConfigMap")

OTHER_GATE = "example.com/other-controller"


async def test_admitted_count_releases_lowest_indexes_only(
    kube: Kube, kube_namespace: str, controller: Any
) -> None:
    ns = kube_namespace
    job, sel = await make_job(kube, ns, "train", 4)
    await create_workload(kube, job, "job-train-a", {"main": 4})
    async with monitoring(kube, ns, sel) as mon, controller():
        await admit(kube, ns, "job-train-a", {"main": 2})
        await eventually(lambda: released_indexes(kube, ns, sel), what="a release")
        await eventually(
            lambda: equals(released_indexes(kube, ns, sel), [0, 1]), what="indexes 0, 1"
        )
        await holds_for(lambda: equals(released_indexes(kube, ns, sel), [0, 1]), 1.5)
    assert mon.max_seen == 2


async def test_scale_up_through_replacement_slice_then_scale_down(
    kube: Kube, kube_namespace: str, controller: Any
) -> None:
    ns = kube_namespace
    job, sel = await make_job(kube, ns, "elastic", 4, podset_label=True)
    await create_workload(kube, job, "job-elastic-a", {"main": 4})
    await admit(kube, ns, "job-elastic-a", {"main": 4})
    async with monitoring(kube, ns, sel), controller():
        await eventually(lambda: equals(released_indexes(kube, ns, sel), [0, 1, 2, 3]))
        # scale-up: the Job controller creates 2 gated pods; Kueue creates a replacement slice
        await scale(kube, ns, "elastic", 6)
        await eventually(lambda: count_pods(kube, ns, sel, 6), timeout=30)
        await create_workload(
            kube,
            job,
            "job-elastic-b",
            {"main": 6},
            replaces="job-elastic-a",
            slice_name="job-elastic-a",
        )
        await holds_for(
            lambda: equals(released_indexes(kube, ns, sel), [0, 1, 2, 3]),
            1.0,
            what="new pods wait for the new slice's admission",
        )
        await admit(kube, ns, "job-elastic-b", {"main": 6})
        await finish(kube, ns, "job-elastic-a")
        await eventually(lambda: equals(released_indexes(kube, ns, sel), [0, 1, 2, 3, 4, 5]))
        # scale-down in place: Kueue lowers the spec count; the admitted count still says 6
        wl = await kube.get(WORKLOADS, ns, "job-elastic-b")
        assert wl is not None
        await kube.json_patch(
            WORKLOADS,
            ns,
            "job-elastic-b",
            [{"op": "replace", "path": "/spec/podSets/0/count", "value": 3}],
        )
        await scale(kube, ns, "elastic", 3)
        await eventually(
            lambda: count_pods(kube, ns, sel, 3), timeout=30, what="job controller scale-down"
        )
        await eventually(lambda: equals(released_indexes(kube, ns, sel), [0, 1, 2]))


async def test_finished_pod_frees_a_slot_only_within_the_cap(
    kube: Kube, kube_namespace: str, controller: Any
) -> None:
    ns = kube_namespace
    job, sel = await make_job(kube, ns, "slots", 4)
    await create_workload(kube, job, "job-slots-a", {"main": 4})
    await admit(kube, ns, "job-slots-a", {"main": 2})
    async with monitoring(kube, ns, sel), controller():
        await eventually(lambda: equals(released_indexes(kube, ns, sel), [0, 1]))
        pods = {index(p): p for p in await kube.list(PODS, ns, sel)}
        await kube.merge_patch(
            PODS, ns, pods[0]["metadata"]["name"], {"status": {"phase": "Succeeded"}}, "status"
        )
        await eventually(
            lambda: equals(released_indexes(kube, ns, sel), [1, 2]), what="index 2 takes the slot"
        )
        await holds_for(lambda: equals(released_indexes(kube, ns, sel), [1, 2]), 1.0)


async def test_only_our_gate_is_removed(kube: Kube, kube_namespace: str, controller: Any) -> None:
    ns = kube_namespace
    job, sel = await make_job(kube, ns, "twogates", 2, gates=[OTHER_GATE, GATE])
    await create_workload(kube, job, "job-twogates-a", {"main": 2})
    await admit(kube, ns, "job-twogates-a", {"main": 2})
    async with controller():
        await eventually(
            lambda: _all_gates(kube, ns, sel, [OTHER_GATE]), what="only our gate removed"
        )
        await holds_for(lambda: _all_gates(kube, ns, sel, [OTHER_GATE]), 0.5)


async def _all_gates(kube: Kube, ns: str, sel: str, want: list[str]) -> bool:
    return all(gates_of(p) == want for p in await kube.list(PODS, ns, sel))


async def test_not_admitted_evicted_or_finished_release_nothing(
    kube: Kube, kube_namespace: str, controller: Any
) -> None:
    ns = kube_namespace
    pending, sel_p = await make_job(kube, ns, "pending", 2)
    evicted, sel_e = await make_job(kube, ns, "evicted", 2)
    done, sel_d = await make_job(kube, ns, "done", 2)
    plain, sel_n = await make_job(kube, ns, "notelastic", 2)
    await create_workload(kube, pending, "job-pending-a", {"main": 2})
    for job, name in ((evicted, "job-evicted-a"), (done, "job-done-a")):
        await create_workload(kube, job, name, {"main": 2})
    await create_workload(kube, plain, "job-notelastic-a", {"main": 2}, elastic=False)
    await admit(kube, ns, "job-notelastic-a", {"main": 2})
    await admit(kube, ns, "job-evicted-a", {"main": 2})
    await evict(kube, ns, "job-evicted-a")
    await admit(kube, ns, "job-done-a", {"main": 2})
    await finish(kube, ns, "job-done-a", reason="Succeeded")
    async with controller() as ctl:
        await eventually(lambda: ctl.stats.reconciles >= 3, what="reconciles")
        for sel in (sel_p, sel_e, sel_d, sel_n):
            await holds_for(lambda sel=sel: equals(released_indexes(kube, ns, sel), []), 0.5)
        # QuotaReserved without Admitted (admission checks pending) is not admitted either
        await kube.merge_patch(
            WORKLOADS,
            ns,
            "job-pending-a",
            {
                "status": {
                    "admission": {
                        "clusterQueue": "cq",
                        "podSetAssignments": [{"name": "main", "count": 2}],
                    },
                    "conditions": [_reserved()],
                }
            },
            "status",
        )
        await holds_for(lambda: equals(released_indexes(kube, ns, sel_p), []), 1.0)
    assert not [p for p in ctl.state.decisions.values() if p.releases]


def _reserved() -> dict[str, Any]:
    from tests.objects import condition

    return condition("QuotaReserved", "True", "QuotaReserved")


async def test_foreign_pods_with_copied_labels_are_never_released(
    kube: Kube, kube_namespace: str, controller: Any
) -> None:
    """Two intruders copy the labels of a Job's pod: one is controlled by a ConfigMap (the Job
    controller will not adopt it), one has no ownerReference at all. The real Job controller
    adopts an orphan that matches its selector (it then is the Job's pod, and as a duplicate
    index it is deleted); until it is adopted it must never be released."""
    ns = kube_namespace
    job, sel = await make_job(kube, ns, "victim", 1)
    real = (await kube.list(PODS, ns, sel))[0]
    holder = await kube.create(
        CONFIGMAPS, ns, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "holder"}}
    )

    def intruder(name: str, refs: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "labels": dict(real["metadata"]["labels"]),
                "annotations": dict(real["metadata"].get("annotations") or {}),
                "ownerReferences": refs,
            },
            "spec": {
                "schedulingGates": [{"name": GATE}],
                "containers": [{"name": "x", "image": "x"}],
            },
        }

    await kube.create(PODS, ns, intruder("owned-elsewhere", [owner_ref(holder)]))
    await kube.create(PODS, ns, intruder("orphan", []))
    await create_workload(kube, job, "job-victim-a", {"main": 3})
    async with monitoring(kube, ns, sel) as mon, controller():
        await admit(kube, ns, "job-victim-a", {"main": 3})
        await eventually(lambda: equals(released_indexes(kube, ns, sel), [0]))
        await holds_for(
            lambda: _gated(kube, ns, "owned-elsewhere"), 1.0, what="foreign pod stays gated"
        )
    for name, states in mon.history.items():
        for pod in states:
            refs = [r for r in pod["metadata"].get("ownerReferences") or () if r.get("controller")]
            owned = bool(refs) and refs[0]["uid"] == job["metadata"]["uid"]
            assert owned or GATE in gates_of(pod), f"{name} released while not owned by the Job"


async def _gated(kube: Kube, ns: str, name: str) -> bool:
    pod = await kube.get(PODS, ns, name)
    return pod is not None and GATE in gates_of(pod)


class CrashAfterFirstPatch:
    """Wraps a client: once a patch succeeded, the controller is "killed" (its scope cancelled)."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.patched = anyio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def json_patch(self, *args: Any) -> Any:
        result = await self._client.json_patch(*args)
        self.patched.set()
        return result


async def test_controller_killed_after_patching_restarts_without_exceeding_cap(
    kube: Kube, kube_namespace: str, control_plane: Any
) -> None:
    ns = kube_namespace
    job, sel = await make_job(kube, ns, "crash", 8)
    await create_workload(kube, job, "job-crash-a", {"main": 8})
    config = config_for(ns, client={"patchConcurrency": 2})
    wrapper: list[CrashAfterFirstPatch] = []

    def wrap(client: Any) -> Any:
        wrapper.append(CrashAfterFirstPatch(client))
        return wrapper[-1]

    async with monitoring(kube, ns, sel) as mon:
        with anyio.CancelScope() as scope:
            async with running_controller(control_plane.kubeconfig_path, config, wrap):
                await admit(kube, ns, "job-crash-a", {"main": 5})
                with anyio.fail_after(20):
                    await wrapper[0].patched.wait()
                scope.cancel()  # killed mid-release: no shutdown, in-flight patches abandoned
        first = await released_indexes(kube, ns, sel)
        assert 1 <= len(first) <= 5
        async with running_controller(control_plane.kubeconfig_path, config):
            await eventually(lambda: equals(released_indexes(kube, ns, sel), [0, 1, 2, 3, 4]))
            await holds_for(lambda: equals(released_indexes(kube, ns, sel), [0, 1, 2, 3, 4]), 1.0)
    assert mon.max_seen == 5


async def test_malformed_workloads_are_skipped_and_others_work(
    kube: Kube, kube_namespace: str, controller: Any
) -> None:
    ns = kube_namespace
    bad1, sel1 = await make_job(kube, ns, "bad-unknown-podset", 2)
    bad2, sel2 = await make_job(kube, ns, "bad-nostatus", 2)
    bad3, sel3 = await make_job(kube, ns, "bad-nocount", 2)
    good, sel_g = await make_job(kube, ns, "good", 2)
    await create_workload(kube, bad1, "job-bad1-a", {"main": 2})
    await admit(kube, ns, "job-bad1-a", {"other": 2})  # admission names a pod set the spec lacks
    await create_workload(kube, bad2, "job-bad2-a", {"main": 2})
    await set_admitted_without_admission(kube, ns, "job-bad2-a")
    await create_workload(kube, bad3, "job-bad3-a", {"main": 2})
    await admit(kube, ns, "job-bad3-a", {"main": None})  # no admitted count: the spec count holds
    await create_workload(kube, good, "job-good-a", {"main": 2})
    await admit(kube, ns, "job-good-a", {"main": 1})
    async with controller() as ctl:
        await eventually(lambda: equals(released_indexes(kube, ns, sel_g), [0]))
        await eventually(lambda: equals(released_indexes(kube, ns, sel3), [0, 1]))
        await holds_for(lambda: equals(released_indexes(kube, ns, sel1), []), 0.5)
        await holds_for(lambda: equals(released_indexes(kube, ns, sel2), []), 0.5)
    reports = {d.active_slice: d for d in ctl.state.decisions.values()}
    bad1_report = reports["job-bad1-a"].pod_sets[0]
    assert bad1_report.cap == 0 and "missing from status.admission" in bad1_report.problem
    assert ctl.stats.reconcile_errors == 0


async def set_admitted_without_admission(kube: Kube, ns: str, name: str) -> None:
    from tests.objects import condition

    await kube.merge_patch(
        WORKLOADS,
        ns,
        name,
        {"status": {"conditions": [condition("Admitted", "True", "Admitted")]}},
        "status",
    )
