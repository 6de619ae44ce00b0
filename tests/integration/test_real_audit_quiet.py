"""Audit beside Kueue v0.19.2's count-aware ElasticJobUngater: a whole story, no finding.

ungater audits Kueue's own gate on an elastic Indexed Job (``mode: audit`` in-process, and
``ungater audit`` as an operator runs it at each steady point) while Kueue releases it through
a whole story: initial admission, a scale-up, a scale-up past the quota that waits, a pod that
succeeds and one that is deleted (each freeing a slot under the admitted count), a scale-down,
and the Job's end. Kueue keeps within the cap throughout, and its name order agrees with the
index order here (single-digit indexes), so any finding would be a false one. That the story
happened is checked step by step: which indexes Kueue released, the slices, the Job's end.
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
from tests.integration.realjobs import job_size, pending_slice, pods_of, set_phase
from tests.integration.realpeers import KUEUE_GATE, SliceWatch, controller_uid, is_live
from tests.integration.support import observed_controller
from tests.objects import JOBS, PODS, WORKLOADS, gates_of
from tests.polling import eventually
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


async def kueues(kube: Kube, ns: str, job: dict[str, Any]) -> list[int]:
    """The completion indexes of the live pods without Kueue's gate."""
    pods = await pods_of(kube, ns, job)
    return sorted(index(p) for p in pods if is_live(p) and KUEUE_GATE not in gates_of(p))


async def _is(kube: Kube, ns: str, job: dict[str, Any], want: list[int], live: int) -> bool:
    pods = [p for p in await pods_of(kube, ns, job) if is_live(p)]
    return len(pods) == live and await kueues(kube, ns, job) == want


class Audits:
    """Every owner audit the controller ran, and every finding it saw (reported or still too
    young to be), so that a quiet audit is known to have looked."""

    def __init__(self, auditor: Any) -> None:
        self.runs = 0
        self.raw: list[str] = []
        observe, update = auditor.observe, auditor.tracker.update

        def observe_spy(*args: Any, **kwargs: Any) -> Any:
            self.runs += 1
            return observe(*args, **kwargs)

        def update_spy(key: object, findings: Any, now: float) -> Any:
            found = list(findings)
            self.raw.extend(f"{f.finding} {f.workload} {sorted(f.pods)}" for f in found)
            return update(key, found, now)

        setattr(auditor, "observe", observe_spy)  # noqa: B010
        setattr(auditor.tracker, "update", update_spy)  # noqa: B010


@pytest.mark.kueue_quota(cpu=4)
async def test_audit_finds_nothing_over_a_whole_story_beside_kueue_v0_19(
    kueue_cluster: Any, kueue_kube: Kube, kueue_namespace: str, tmp_path: Path
) -> None:
    ns, kube = kueue_namespace, kueue_kube
    # the shipped audit thresholds, so that what is quiet here is quiet for a user
    config = Config.model_validate(
        {
            "namespaces": [ns],
            "mode": "audit",
            "kinds": [{"group": "batch", "kind": "Job"}],
            "watch": {"backoffInitialSeconds": 0.05, "backoffMaxSeconds": 1},
        }
    )
    assert config.gate == KUEUE_GATE
    config_file = tmp_path / "audit.yaml"
    config_file.write_text(yaml.safe_dump(config.dump()))
    kubeconfig = kueue_cluster.kubeconfig_path
    one_shots: list[dict[str, Any]] = []

    async def steady(step: str, want: list[int], live: int) -> None:
        """Kueue released ``want`` of ``live`` pods, still so after its batch period; then the
        one-shot audit reads the cluster."""
        try:
            await eventually(lambda: _is(kube, ns, job, want, live), timeout=60, what=step)
        except AssertionError:
            pods = await pods_of(kube, ns, job)
            raise AssertionError(
                f"{step}: want {want} of {live}; pods "
                + ", ".join(f"{index(p)} {gates_of(p)} {is_live(p)}" for p in pods)
            ) from None
        await anyio.sleep(BATCH + 0.5)  # Kueue's timer: no signal says it looked and did nothing
        assert await _is(kube, ns, job, want, live), f"{step}: Kueue released more"
        report = await anyio.to_thread.run_sync(lambda: one_shot(kubeconfig, config_file, ns))
        assert report["owners"] == 1, report
        one_shots.append(report)
        assert report["findings"] == [], f"{step}: {report}"

    async with observed_controller(kubeconfig, config) as ctl:
        reports, audits = Reports(ctl.state.auditor), Audits(ctl.state.auditor)
        job = await kube.create(JOBS, ns, queued_job("story", 2))
        uid = job["metadata"]["uid"]
        watch = SliceWatch(
            kube, ns, JOBS, uid, job_size, lambda p: "main", controller_uid, owner_name="story"
        )
        async with anyio.create_task_group() as tg:
            await watch.record(tg)  # returns once each watch has listed
            await steady("initial admission", [0, 1], 2)
            await scale(kube, ns, "story", 4)
            await steady("scaled to 4", [0, 1, 2, 3], 4)
            # past the quota of 4: the scale-up slice waits, 4 and 5 stay gated
            await scale(kube, ns, "story", 6)
            await eventually(lambda: pending_slice(kube, ns), timeout=30, what="pending slice")
            await steady("scaled to 6, waiting", [0, 1, 2, 3], 6)
            # index 0 succeeds: one slot under the admitted 4, for index 4 (before 5)
            first = next(p for p in await pods_of(kube, ns, job) if index(p) == 0)
            await set_phase(kube, ns, first, "Succeeded")
            await steady("index 0 succeeded", [1, 2, 3, 4], 5)
            # index 1 deleted: the Job controller counts it failed and makes it again after
            # its backoff (10 s); the freed slot goes at once to the pod waiting, index 5,
            # and the new index 1 stays gated (it came after that release: not out of order)
            victim = next(p for p in await pods_of(kube, ns, job) if index(p) == 1)
            await kube.delete(PODS, ns, victim["metadata"]["name"])
            await eventually(
                lambda: _recreated(kube, ns, job, victim), timeout=60, what="index 1 again"
            )
            await steady("index 1 deleted and recreated", [2, 3, 4, 5], 5)
            # down to 3 completions: 0 is done, 1 and 2 remain; 3, 4, 5 go, and the slice
            # for 3 has room for the new index 1
            await scale(kube, ns, "story", 3)
            await steady("scaled down to 3", [1, 2], 2)
            assert not await pending_slice(kube, ns)
            for p in await pods_of(kube, ns, job):
                if is_live(p):
                    await set_phase(kube, ns, p, "Succeeded")
            await eventually(lambda: _job_complete(kube, ns), timeout=30, what="Job complete")
            await eventually(lambda: _all_finished(kube, ns, uid), timeout=30, what="finished")
            report = await anyio.to_thread.run_sync(lambda: one_shot(kubeconfig, config_file, ns))
            assert report["findings"] == [], report
            # the record ends with everything written so far (the replay below judges it)
            await eventually(watch.caught_up, timeout=30, what="the recorder caught up")
            tg.cancel_scope.cancel()
        assert ctl.stats.released == 0, "audit mode patches nothing"
    for line in audits.raw:
        print(f"raw finding (never reported unless it lasted): {line}")
    print(f"{audits.runs} owner audits, {len(one_shots) + 1} one-shot audits")
    # the story happened: slices for 2, 4 and 3 pods were admitted, one after the other
    admitted = {
        (e.obj["metadata"]["name"], e.obj["spec"]["podSets"][0]["count"])
        for e in watch.events
        if e.resource == "workload" and controller_uid(e.obj) == uid and _admitted(e.obj)
    }
    assert {2, 4, 3} <= {n for _, n in admitted}, admitted
    assert audits.runs >= 10, "the controller audited the owner along the story"
    # and Kueue never went past the cap at any event (resourceVersion order)
    assert not watch.replay(KUEUE_GATE), watch.replay(KUEUE_GATE)
    assert reports.seen == [], [f for _, f in reports.seen]


def _admitted(wl: dict[str, Any]) -> bool:
    conds = (wl.get("status") or {}).get("conditions") or ()
    return any(c["type"] == "Admitted" and c["status"] == "True" for c in conds)


async def _recreated(kube: Kube, ns: str, job: dict[str, Any], old: dict[str, Any]) -> bool:
    return any(
        index(p) == index(old) and p["metadata"]["uid"] != old["metadata"]["uid"]
        for p in await pods_of(kube, ns, job)
    )


async def _job_complete(kube: Kube, ns: str) -> bool:
    job = await kube.get(JOBS, ns, "story")
    conds = (job or {}).get("status", {}).get("conditions") or ()
    return any(c["type"] == "Complete" and c["status"] == "True" for c in conds)


async def _all_finished(kube: Kube, ns: str, uid: str) -> bool:
    slices = [w for w in await kube.list(WORKLOADS, ns) if controller_uid(w) == uid]
    return bool(slices) and all(
        any(
            c["type"] == "Finished" and c["status"] == "True"
            for c in (w.get("status") or {}).get("conditions") or ()
        )
        for w in slices
    )
