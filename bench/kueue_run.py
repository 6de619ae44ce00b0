"""The Kueue benchmark's two runs, on one control plane with the real Kueue and KubeRay.

- **Each releaser alone** (the headline, ``--only kueue``): every pod carries Kueue's gate only.
  In one set of namespaces Kueue releases it, as it does out of the box; in another, identical,
  set ungater releases it (``mode: auto``, as shipped) behind the shipped admission policy,
  bound to those namespaces (``bench.kueue_policy``), which keeps Kueue's hands off the gate.
  The same stories run on both, their repeats interleaved (the order flipped every repeat), so
  neither releaser's patches or CPU slow the other's samples, and a drift of the machine falls
  on both.
- **Head to head** (``--only kueue-h2h``): ungater's own gate beside Kueue's on the same pods,
  each the sole releaser of its gate: which pod each lets go first in a partial wave.

Per case and releaser: median, p95, n, stalls and missing samples, the ratio Kueue / ungater;
per story and releaser, releases past min(spec, admitted, owner size) judged from the server's
events (``bench.kueue_overcap``), with how many releases were judged, or no judgement when a
watch missed history (``over_cap_history_gaps``, ``over_cap_gaps``); every wave (trigger seen, sample's end) for the spans.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import anyio

from bench import kueue as kq
from bench import kueue_setup as ks
from bench.api import BenchApi
from bench.controller_proc import ControllerProcess
from bench.gapwatch import Gap
from bench.kueue_overcap import releases_past_cap
from bench.kueue_policy import KUEUE_USER, RELEASER_LABEL, guarded_policy, remove_policy
from bench.objects import JOBS, PODS
from bench.sizes import Sizes
from bench.timeline import Timeline
from bench.trace import measure_floor, read_trace, summarize_waves, wave_spans

__all__ = ["EACH_ALONE", "HEAD_TO_HEAD", "kueue_run", "merged_summary"]

EACH_ALONE, HEAD_TO_HEAD = "each-alone", "head-to-head"


def merged_summary(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One case's summaries of several sides as one: per label its samples' summary, stalls
    and missing samples; the ratio Kueue / ungater at the median and at p95."""
    out: dict[str, Any] = {"stalls": {}, "missing": {}}
    for part in parts:
        for key, value in part.items():
            if key in ("stalls", "missing"):
                out[key].update(value)
            elif not key.startswith("ratio"):
                out[key] = value
    k, u = out.get("kueue"), out.get("ungater")
    if k and u and k["n"] and u["n"]:
        out["ratio_median"] = k["median"] / u["median"] if u["median"] else math.nan
        out["ratio_p95"] = k["p95"] / u["p95"] if u["p95"] else math.nan
    return out


class _Stage:
    """Namespaces and ClusterQueues of one side: a lifecycle, a burst, the pending repeats."""

    def __init__(self, side: kq.Side, tag: str, sizes: Sizes) -> None:
        self.side = side
        self.life, self.burst = f"kq-{tag}-life", f"kq-{tag}-burst"
        self.pend = [f"kq-{tag}-pend{i}" for i in range(sizes.kueue_pending_repeats)]
        self.shrink = [f"kq-{tag}-shrink{i}" for i in range(sizes.kueue_pending_repeats)]
        self.every = (self.life, self.burst, *self.pend, *self.shrink)
        self.queues: dict[str, str] = {}
        self.timelines: dict[str, Timeline] = {}

    async def create(self, api: BenchApi, sizes: Sizes, releaser: str | None) -> None:
        labels = {RELEASER_LABEL: releaser} if releaser else None
        for ns in self.every:
            await api.ensure_namespace(ns, labels)
        p = sizes.kueue_pods
        self.queues[self.life] = await ks.create_queues(api, self.life, 4 * p * sizes.kueue_repeats)
        self.queues[self.burst] = await ks.create_queues(api, self.burst, 0)
        for ns in self.pend:
            self.queues[ns] = await ks.create_queues(api, ns, sizes.kueue_pending_pods)
        for ns in self.shrink:
            self.queues[ns] = await ks.create_queues(api, ns, sizes.kueue_shrink[2])
        for ns in self.every:
            self.timelines[ns] = Timeline(api.kube, ns, (JOBS, ks.RAYCLUSTERS))

    async def delete(self, api: BenchApi) -> None:
        for ns in self.every:
            await api.delete_namespace(ns)
        for cq in self.queues.values():
            await ks.delete_queues(api, cq)

    def gaps(self) -> list[Gap]:
        return [g for tl in self.timelines.values() for g in tl.gaps]

    def over_cap(self) -> dict[str, dict[str, Any]]:
        """Per story and releaser, the releases past the cap of those judged; no judgement
        at all (the gaps instead) when any watch of the stage missed history."""
        events = [e for tl in self.timelines.values() for e in tl.events]
        out = {}
        for story, owners in self.side.owners.items():
            mine = [e for e in events if e.owner in owners]
            found = releases_past_cap(mine, self.side.gates, self.gaps())
            out[story] = {label: oc.summary() for label, oc in found.items()}
        return out


async def _stories(api: BenchApi, stages: list[_Stage], sizes: Sizes) -> dict[str, Any]:
    """Every story on every stage, repeat by repeat, the stages' order flipped each repeat."""

    def turn(i: int) -> list[_Stage]:
        return stages if i % 2 == 0 else stages[::-1]

    p = sizes.kueue_pods
    for i in range(sizes.kueue_repeats):
        for st in turn(i):
            await kq.lifecycle(api, st.timelines[st.life], st.side, i, p)
        for st in turn(i):
            await kq.raycluster(api, st.timelines[st.life], st.side, i, p)
    for i in range(sizes.kueue_pending_repeats):
        for st in turn(i):
            await kq.freed_pending(api, st.timelines[st.pend[i]], st.side, sizes)
    for i in range(sizes.kueue_pending_repeats):
        for st in turn(i):
            await kq.shrink(api, st.timelines[st.shrink[i]], st.side, sizes)
    totals: dict[str, Any] = {}  # per side: from the quota change to its last admission, ...
    n, size = sizes.kueue_workloads, sizes.kueue_workload_pods
    for st in stages:
        cq = st.queues[st.burst]
        totals[st.side.label] = await kq.burst(api, st.timelines[st.burst], st.side, cq, n, size)
    return totals


async def _pod_floor(api: BenchApi, ns: str) -> dict[str, Any]:
    """One quorum GET and one guarded PATCH of a gated pod, each alone: a pod's update passes
    the admission a release does (Kueue's pod webhook, the policy). The pod has no owner, so
    the controller, which watches the namespace, has nothing to do with it."""
    pod = {
        "metadata": {"name": "bench-floor"},
        "spec": {
            "schedulingGates": [{"name": ks.KUEUE_GATE}],
            "containers": [{"name": "c", "image": "registry.invalid/floor:1"}],
        },
    }
    await api.kube.create(PODS, ns, pod)
    try:
        return await measure_floor(api, ns, "bench-floor", resource=PODS)
    finally:
        await api.kube.delete(PODS, ns, "bench-floor")


def _spans(log: Path, side: kq.Side) -> dict[str, Any]:
    """Per case, where ungater's waves went (``bench.trace``): each wave from the harness's
    trigger to the sample's end; a wave whose trace is not found is counted missing."""
    points = read_trace(log)
    by_case: dict[str, list[Any]] = {}
    for w in side.waves:
        end = w.end.get("ungater")
        spans = None
        if end is not None:
            spans = wave_spans(points, w.owner, w.since["ungater"], end, pod=w.pod["ungater"])
        by_case.setdefault(w.case, []).append(spans)
    out: dict[str, Any] = {}
    for case, waves in by_case.items():
        out[case] = summarize_waves(waves)
        out[case]["each"] = [w.as_dict() if w is not None else None for w in waves]
    return out


async def kueue_run(
    kubeconfig: Path,
    sizes: Sizes,
    workdir: Path,
    run_id: str,
    kueue_version: str,
    mode: str = EACH_ALONE,
    trace: bool = False,
) -> dict[str, Any]:
    """The run ``mode`` names; per case and releaser the waits, per story the releases past
    the cap, the partial wave's order, every wave."""
    started = time.monotonic()
    stall = sizes.kueue_stall_s
    if mode == EACH_ALONE:
        alone = {"kueue": ks.KUEUE_GATE}, {"ungater": ks.KUEUE_GATE}
        stages = [
            _Stage(kq.Side("kueue", alone[0], None, stall), f"k{run_id}", sizes),
            _Stage(kq.Side("ungater", alone[1], None, stall), f"u{run_id}", sizes),
        ]
        gate = ks.KUEUE_GATE
    else:
        both = {"kueue": ks.KUEUE_GATE, "ungater": ks.UNGATER_GATE}
        stages = [_Stage(kq.Side("both", both, ks.UNGATER_GATE, stall), f"h{run_id}", sizes)]
        gate = ks.UNGATER_GATE
    ours = stages[-1]  # the namespaces ungater watches
    # each namespace's timeline holds 4 watches open (pods, Workloads, Jobs, RayClusters), each
    # a pooled connection of its own; the stories' requests need room beside them
    watches = 4 * sum(len(st.every) for st in stages)
    api = await BenchApi.connect(kubeconfig, pool_size=watches + 64)
    kueue_api = await BenchApi.connect(kubeconfig, pool_size=2, as_user=KUEUE_USER)
    policy: list[dict[str, Any]] = []
    out: dict[str, Any] = {"kueue_version": kueue_version, "mode": mode}
    try:
        for st in stages:
            releaser = st.side.label if mode == EACH_ALONE else None
            await st.create(api, sizes, releaser)
        if mode == EACH_ALONE:
            policy = await guarded_policy(api, kueue_api, ks.KUEUE_GATE, ours.life, stages[0].life)
        config = ks.kueue_controller_config(list(ours.timelines), gate)
        if trace:
            config.setdefault("logging", {})["trace"] = True
        proc = ControllerProcess(kubeconfig, config, workdir, "kueue")
        async with anyio.create_task_group() as tg:
            for st in stages:
                for tl in st.timelines.values():
                    tg.start_soon(tl.run)
                    with anyio.fail_after(30):
                        await tl.synced.wait()
            await proc.start(tg)
            try:
                out["burst_totals"] = await _stories(api, stages, sizes)
                # the server's floor, on the same server, right after the waves it bounds
                out["floor"] = await _pod_floor(api, ours.life)
            finally:
                out["controller_exit_code"] = await proc.stop()
                out["controller_log"] = str(proc.log_path)
                tg.cancel_scope.cancel()
        out["over_cap"] = {}
        for st in stages:
            for story, found in st.over_cap().items():
                out["over_cap"].setdefault(story, {}).update(found)
        # history the judge did not see (0 for a complete one; else no story was judged)
        gaps = [g for st in stages for g in st.gaps()]
        out["over_cap_history_gaps"] = len(gaps)
        out["over_cap_gaps"] = [g.line() for g in gaps]
    finally:
        if policy:
            await remove_policy(api, policy)
        for st in stages:
            await st.delete(api)
        await kueue_api.close()
        await api.close()
    sides = [st.side for st in stages]
    out["cases"] = {c: merged_summary([s.cases[c].summary() for s in sides]) for c in kq.CASES}
    out["order"] = {}
    for s in sides:
        for case, waves in s.order.items():
            out["order"].setdefault(case, []).extend(waves)
    out["waves"] = {s.label: [asdict(w) for w in s.waves] for s in sides}
    if trace and "controller_log" in out:
        out["spans"] = _spans(Path(out["controller_log"]), ours.side)
    out["duration_seconds"] = round(time.monotonic() - started, 1)
    out["sizes"] = {
        "pods": sizes.kueue_pods,
        "repeats": sizes.kueue_repeats,
        "pending_repeats": sizes.kueue_pending_repeats,
        "pending_pods": sizes.kueue_pending_pods,
        "pending_gated": sizes.kueue_pending_gated,
        "shrink": list(sizes.kueue_shrink),
        "workloads": sizes.kueue_workloads,
        "workload_pods": sizes.kueue_workload_pods,
        "stall_seconds": sizes.kueue_stall_s,
    }
    return out
