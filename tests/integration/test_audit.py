"""Audit mode and ``ungater audit`` on the real API server: the test plays a careless second
releaser (it removes the gate from every pod, as Kueue v0.17.0's job reconciler does); the
controller in audit mode patches nothing and reports the over-release and a stall with the
right pods; the one-shot audit and explain say the same. The chart's RBAC in audit mode has no
pods/patch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from tests.integration.deploy import render
from tests.integration.jobs import index, make_job
from tests.integration.k8s import Kube
from tests.integration.support import (
    admit,
    config_for,
    create_workload,
    events_with,
    observed_controller,
)
from tests.objects import GATE, PODS
from tests.polling import eventually, holds_for
from ungater._cli.audit import audit_cluster
from ungater._cli.explain import explain
from ungater._plugins.registry import PluginRegistry

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


async def release_all(kube: Kube, ns: str, selector: str, indexes: set[int] | None = None) -> None:
    """What a careless releaser does: remove the gate from every (or the given) pod."""
    for p in await kube.list(PODS, ns, selector):
        gates = [g["name"] for g in p["spec"].get("schedulingGates") or []]
        if GATE in gates and (indexes is None or index(p) in indexes):
            i = gates.index(GATE)
            await kube.json_patch(
                PODS,
                ns,
                p["metadata"]["name"],
                [
                    {"op": "test", "path": f"/spec/schedulingGates/{i}/name", "value": GATE},
                    {"op": "remove", "path": f"/spec/schedulingGates/{i}"},
                ],
            )


async def test_audit_mode_reports_another_releasers_over_release_and_a_stall(
    control_plane: Any, kube: Kube, kube_namespace: str, tmp_path: Path
) -> None:
    ns = kube_namespace
    job, sel = await make_job(kube, ns, "train", 4)
    slow, slow_sel = await make_job(kube, ns, "slow", 3)
    await create_workload(kube, job, "job-train-a", {"main": 4})
    await create_workload(kube, slow, "job-slow-a", {"main": 3})
    config = config_for(ns, mode="audit", audit={"stallSeconds": 1.5, "reportAfterSeconds": 0.3})
    async with observed_controller(control_plane.kubeconfig_path, config) as ctl:
        await admit(kube, ns, "job-train-a", {"main": 2})
        await admit(kube, ns, "job-slow-a", {"main": 2})
        await release_all(kube, ns, sel)  # 4 released for an admitted 2
        await release_all(kube, ns, slow_sel, {0})  # 1 of 2: index 1 stalls

        def open_findings() -> dict[str, Any]:
            return {f.finding: f for f in ctl.state.auditor.tracker.findings()}

        await eventually(
            lambda: {"OverRelease", "Stalled"} <= set(open_findings()),
            timeout=15,
            what="an over-release and a stall",
        )
        over, stall = open_findings()["OverRelease"], open_findings()["Stalled"]
        pods = {index(p): p["metadata"]["name"] for p in await kube.list(PODS, ns, sel)}
        slow_pods = {index(p): p["metadata"]["name"] for p in await kube.list(PODS, ns, slow_sel)}
        assert over.workload == "job-train-a" and over.pod_set == "main"
        assert set(over.pods) == set(pods.values())
        assert f"beyond the cap in order: {pods[2]}, {pods[3]}" in over.message
        assert stall.workload == "job-slow-a" and stall.pods == (slow_pods[1],)
        assert ctl.stats.released == 0 and ctl.stats.foreign_releases == 0
        ev = await eventually(lambda: events_with(kube, ns, "OverRelease"), what="an Event")
        assert ev[0]["type"] == "Warning" and ev[0]["involvedObject"]["name"] == "job-train-a"
        assert ctl.metrics is not None
        text = ctl.metrics.render().decode()
        assert 'ungater_audit_findings{finding="OverRelease",kind="Job.batch"} 1.0' in text
        assert 'ungater_audit_findings{finding="Stalled",kind="Job.batch"} 1.0' in text

        # audit never patches: the stalled pod stays gated
        async def still_gated() -> bool:
            p = next(
                p
                for p in await kube.list(PODS, ns, slow_sel)
                if p["metadata"]["name"] == slow_pods[1]
            )
            return GATE in [g["name"] for g in p["spec"]["schedulingGates"]]

        await holds_for(still_gated, 1.0, what="the stalled pod untouched")

        # the one-shot audit and explain, on a fresh read, find the same
        report = await audit_cluster(ctl.client, config, PluginRegistry.discover(), ns)
        assert report["owners"] == 2
        found = {(f["finding"], f["workload"]): f for f in report["findings"]}
        assert set(found[("OverRelease", "job-train-a")]["pods"]) == set(pods.values())
        assert found[("Stalled", "job-slow-a")]["pods"] == [slow_pods[1]]
        shown = await explain(ctl.client, config, ctl.registry, ns, "job-train-a")
        assert shown["mode"] == "audit"
        assert [f["finding"] for f in shown["findings"]] == ["OverRelease"]

        # the command exits 3 on warnings, as a linter does, unless told not to
        cfg = tmp_path / "audit.yaml"
        cfg.write_text(yaml.safe_dump(config.dump()))
        base = [sys.executable, "-m", "ungater", "audit", "-n", ns, "--config", str(cfg)]
        base += ["--kubeconfig", str(control_plane.kubeconfig_path)]
        for extra, code in (([], 3), (["--exit-zero"], 0)):
            proc = await anyio.to_thread.run_sync(
                lambda e=extra: subprocess.run(
                    base + e, capture_output=True, text=True, timeout=60, check=False
                )
            )
            assert proc.returncode == code, proc.stdout + proc.stderr
            assert "OverRelease" in proc.stdout


def test_chart_rbac_has_no_pod_patch_in_audit_mode(helm: Path) -> None:
    def pod_verbs(**values: Any) -> set[str]:
        (role,) = [o for o in render(helm, **values) if o["kind"] == "ClusterRole"]
        rules = [r for r in role["rules"] if "pods" in r["resources"] and r["apiGroups"] == [""]]
        return {v for r in rules for v in r["verbs"]}

    assert pod_verbs() == {"get", "list", "watch", "patch"}
    assert pod_verbs(config={"mode": "audit"}) == {"get", "list", "watch"}
    one_releases = {
        "mode": "audit",
        "kinds": [{"group": "batch", "kind": "Job", "mode": "release"}],
    }
    assert pod_verbs(config=one_releases) == {"get", "list", "watch", "patch"}
    all_audit = {"kinds": [{"group": "batch", "kind": "Job", "mode": "audit"}]}
    assert pod_verbs(config=all_audit) == {"get", "list", "watch"}


async def test_release_mode_stands_down_when_another_releaser_keeps_removing_the_gate(
    control_plane: Any, kube: Kube, kube_namespace: str
) -> None:
    ns = kube_namespace
    job, sel = await make_job(kube, ns, "train", 5)
    await create_workload(kube, job, "job-train-a", {"main": 5})
    config = config_for(
        ns, standDown={"foreignReleases": 2, "windowSeconds": 60}, audit={"reportAfterSeconds": 0}
    )
    async with observed_controller(control_plane.kubeconfig_path, config) as ctl:
        await admit(kube, ns, "job-train-a", {"main": 2})

        async def released() -> list[int]:
            return sorted(
                index(p)
                for p in await kube.list(PODS, ns, sel)
                if GATE not in [g["name"] for g in p["spec"].get("schedulingGates") or []]
            )

        await eventually(lambda: _eq(released(), [0, 1]), what="ungater releases 0 and 1")
        rt = next(rt for k, rt in ctl.state.kinds.items() if str(k) == "Job.batch")
        assert rt.mode == "release"
        await release_all(kube, ns, sel, {3, 4})  # a second releaser at work
        await eventually(lambda: rt.stood_down != "", timeout=15, what="the stand-down")
        assert rt.mode == "audit" and ctl.stats.foreign_releases == 2
        (ev,) = await eventually(lambda: events_with(kube, ns, "StoodDown"), what="StoodDown")
        assert ev["involvedObject"]["name"] == "job-train-a" and "audit" in ev["message"]
        assert any(
            line.startswith("Job.batch: audit") and "STOOD DOWN" in line
            for line in ctl.status_lines()
        )
        assert ctl.metrics is not None
        assert 'ungater_stood_down{kind="Job.batch"} 1.0' in ctl.metrics.render().decode()
        # from now on it only reports: 4 released for an admitted 2, nothing patched
        await eventually(
            lambda: any(f.finding == "OverRelease" for f in ctl.state.auditor.tracker.findings()),
            what="audit reports the over-release",
        )
        await admit(kube, ns, "job-train-a", {"main": 5})  # room for index 2 now
        await holds_for(lambda: _eq(released(), [0, 1, 3, 4]), 1.0, what="no patch after")
        assert ctl.stats.released == 2


async def _eq(value: Any, want: Any) -> bool:
    return bool(await value == want)
