"""Head to head with Kueue v0.19.2's in-tree ElasticJobUngater, on one elastic Indexed Job.

Kueue's webhook gives the Job its gate (``kueue.x-k8s.io/elastic-job``), released by Kueue's
``ElasticJobUngater``; the template also carries ``UNGATER_GATE``, released by ungater
(``mode: release``). Each releaser counts only its own gate, so each one's choices show on its
own gate of the same pods, under the same real slices.

The partial wave: 7 admitted (the whole quota), the Job scaled to 13, so the scale-up slice
waits and indexes 7..12 stay gated for both; the pod of index 0 succeeds, freeing one slot
under the admitted 7. ungater releases the lowest completion index (7). Kueue sorts its gated
candidates by pod name (``strings.Compare`` in ``podsToUngate``,
``pkg/controller/elasticjobs/elastic_job_ungater.go``), and ``h2h-10-…`` sorts before
``h2h-7-…``: it releases index 10. An audit of Kueue's gate (the controller in ``mode: audit``
and ``ungater audit``) reports that pick as ``OutOfOrder``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from tests.integration.audits import Reports, one_shot
from tests.integration.jobs import index, scale
from tests.integration.k8s import Kube
from tests.integration.realjobs import pending_slice, pods_of, set_phase, watch
from tests.integration.realpeers import KUEUE_GATE, UNGATER_GATE, is_live
from tests.integration.support import config_for, observed_controller, running_controller
from tests.objects import JOBS, gates_of
from tests.polling import eventually
from tests.seen import cache_holds, owner_key, reconciled, waiting
from ungater._controller.controller import Controller
from ungater._decide.findings import FOREIGN_GATES, OUT_OF_ORDER
from ungater._model.config import Config
from ungater_devtools.kueue_objects import queued_job

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

# Kueue's UpdatesBatchPeriod, a timer of the real Kueue's own: its ElasticJobUngater queues a
# Workload a second after its informer delivers a pod event (AddAfter). Where Kueue must be seen
# to release nothing more, the test waits that timer out (plus a margin for the informer): a
# reconcile that releases nothing writes nothing, and its log line ("Reconcile
# ElasticJobUngater") does not say which pod events Kueue had seen by then, so no event, object
# or log line can stand in for it.
BATCH = 1.0


async def released(kube: Kube, ns: str, job: dict[str, Any], gate: str) -> list[int]:
    """The completion indexes of the live pods without ``gate``."""
    pods = await pods_of(kube, ns, job)
    return sorted(index(p) for p in pods if is_live(p) and gate not in gates_of(p))


async def both_are(kube: Kube, ns: str, job: dict[str, Any], ours: list[int], kueues: int) -> bool:
    return (
        await released(kube, ns, job, UNGATER_GATE) == ours
        and len(await released(kube, ns, job, KUEUE_GATE)) == kueues
    )


async def kept_waiting(ctl: Controller, kube: Kube, ns: str, job: dict[str, Any]) -> None:
    """ungater has the Job's live pods as they are now, and a decision it made after that keeps
    each one still carrying its gate waiting: it saw them and chose to release nothing more."""
    pods = [p for p in await pods_of(kube, ns, job) if is_live(p)]
    await eventually(lambda: cache_holds(ctl, "pods", pods), timeout=30, what="pods cached")
    decision = await reconciled(ctl, owner_key(job), decided=True, timeout=30)
    gated = {p["metadata"]["name"] for p in pods if UNGATER_GATE in gates_of(p)}
    assert gated <= set(waiting(decision)), f"gated {sorted(gated)}, decided {decision}"


def audit_config(ns: str) -> Config:
    """Audit Kueue's own gate on Jobs: what ``mode: audit`` makes of Kueue's releases."""
    return Config.model_validate(
        {
            "namespaces": [ns],
            "mode": "audit",
            "kinds": [{"group": "batch", "kind": "Job"}],
            "audit": {"reportAfterSeconds": 1.5},
            "watch": {"backoffInitialSeconds": 0.05, "backoffMaxSeconds": 1},
        }
    )


@pytest.mark.kueue_quota(cpu=7)
async def test_one_free_slot_ungater_takes_the_lowest_index_kueue_the_lowest_name(
    kueue_cluster: Any, kueue_kube: Kube, kueue_namespace: str, tmp_path: Path
) -> None:
    ns, kube = kueue_namespace, kueue_kube
    kubeconfig = kueue_cluster.kubeconfig_path
    audit = audit_config(ns)
    assert audit.gate == KUEUE_GATE
    audit_file = tmp_path / "audit.yaml"
    audit_file.write_text(yaml.safe_dump(audit.dump()))
    async with (
        running_controller(kubeconfig, config_for(ns, gate=UNGATER_GATE)) as ctl,
        observed_controller(kubeconfig, audit) as auditing,
    ):
        reports = Reports(auditing.state.auditor)
        job = await kube.create(JOBS, ns, queued_job("h2h", 7, gate=UNGATER_GATE))
        gates = [g["name"] for g in job["spec"]["template"]["spec"]["schedulingGates"]]
        assert gates == [UNGATER_GATE, KUEUE_GATE], "Kueue's webhook adds its gate"
        async with watch(kube, ns, job) as w:  # ungater never past the cap, at every event
            await w.settle("admitted 7", expect={"main": 7})
            await eventually(
                lambda: both_are(kube, ns, job, list(range(7)), 7), timeout=30, what="0..6"
            )
            assert await released(kube, ns, job, KUEUE_GATE) == list(range(7))

            # beyond the quota: the scale-up slice waits, indexes 7..12 stay gated for both
            await scale(kube, ns, "h2h", 13)
            await eventually(lambda: pending_slice(kube, ns), timeout=30, what="pending slice")
            await eventually(lambda: _live(kube, ns, job, 13), timeout=30, what="13 pods")
            await w.settle("scaled to 13, beyond the quota", expect={"main": 7})
            await kept_waiting(ctl, kube, ns, job)
            await anyio.sleep(BATCH + 0.5)  # Kueue's timer: it had its batch on the new pods
            assert await released(kube, ns, job, KUEUE_GATE) == list(range(7))
            assert await released(kube, ns, job, UNGATER_GATE) == list(range(7))

            # one free slot: the pod of index 0 succeeds
            gated = {
                index(p): p["metadata"]["name"]
                for p in await pods_of(kube, ns, job)
                if KUEUE_GATE in gates_of(p)
            }
            assert sorted(gated) == list(range(7, 13))
            first = next(p for p in await pods_of(kube, ns, job) if index(p) == 0)
            await set_phase(kube, ns, first, "Succeeded")
            await eventually(
                lambda: both_are(kube, ns, job, list(range(1, 8)), 7),
                timeout=30,
                what="each releaser's pick",
            )
            kueues = await released(kube, ns, job, KUEUE_GATE)
            (pick,) = set(kueues) - set(range(1, 7))
            print(f"one free slot over gated {sorted(gated)}: ungater released 7, Kueue {pick}")
            # Kueue's pick is the gated pod first in name order, which is not the first index
            assert gated[pick] == min(gated.values()), (pick, gated)
            assert pick == 10, f"Kueue released index {pick} ({gated[pick]})"
            # and neither releaser adds more: ungater decided so on what it saw, Kueue once
            # its batch has passed (its timer, BATCH)
            await kept_waiting(ctl, kube, ns, job)
            await anyio.sleep(BATCH + 0.5)
            assert await released(kube, ns, job, UNGATER_GATE) == list(range(1, 8))
            assert await released(kube, ns, job, KUEUE_GATE) == [1, 2, 3, 4, 5, 6, 10]

            # the audit of Kueue's gate: index 10 released while 7, 8, 9 wait
            out_of_order = await eventually(
                lambda: reports.of(OUT_OF_ORDER), timeout=15, what="OutOfOrder reported"
            )
            assert [f.pods for _, f in out_of_order] == [(gated[10],)]
            lower = ", ".join(gated[i] for i in (7, 8, 9))
            assert f"while earlier {lower} wait(s) gated" in out_of_order[0][1].message
            report = await anyio.to_thread.run_sync(lambda: one_shot(kubeconfig, audit_file, ns))
            found = {f["finding"]: f["pods"] for f in report["findings"]}
            # index 10 is Kueue's, still held by ungater's gate: a foreign gate, truly
            assert found == {OUT_OF_ORDER: [gated[10]], FOREIGN_GATES: [gated[10]]}, report
        assert ctl.stats.foreign_releases == 0, "nobody else touched ungater's gate"
    # over the whole run the audit reported Kueue's order (and the foreign gate) only
    assert {f.finding for _, f in reports.seen} <= {OUT_OF_ORDER, FOREIGN_GATES}, reports.seen


async def _live(kube: Kube, ns: str, job: dict[str, Any], n: int) -> bool:
    return sum(1 for p in await pods_of(kube, ns, job) if is_live(p)) == n
