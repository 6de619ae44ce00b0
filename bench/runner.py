"""One benchmark run: the scenarios in order, per controller config, and the JSON result.

For each client config ("raised": QPS/burst out of the way; "default": the built-in 200/400)
the controller runs as its own process over the namespace while the harness measures release
latency per pod-set size (the largest interleaved with the raw baseline, for the throughput
ratio), freed-slot latency, arrival latency and scale-up churn. Then the scale scenario (its
own controller starts) and the in-process reconcile cost.
"""

from __future__ import annotations

import secrets
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import yaml

from bench import churn, release, slots
from bench.api import BenchApi
from bench.bed import Bed, bed_on_fresh_plane
from bench.controller_proc import ControllerProcess, controller_config
from bench.machine import control_plane_pids, load_average, machine_info, run_span
from bench.observer import PodObserver
from bench.profile import PySpy
from bench.reconcile_cost import owner_size_cost, reconcile_cost
from bench.report import table_rows
from bench.scale import release_all_comparison, scale
from bench.sizes import Sizes
from bench.stats import summarize
from bench.throughput import throughput_run

__all__ = ["Options", "run_all"]

SCENARIOS = (
    "latency",
    "throughput",
    "freed",
    "arrival",
    "churn",
    "scale",
    "reconcile",
    "kueue",
    "kueue-h2h",
    "kueue-wave",
)
#: Scenarios on the plain control plane (no Kueue: the harness plays it); "kueue" (each
#: releaser alone) and "kueue-h2h" (head to head) run on a control plane of their own with the
#: real Kueue (bench/kueue_run.py).
KUEUE = frozenset({"kueue", "kueue-h2h"})
#: "kueue-wave" (bench/kueue_wave.py): a control plane per set of client limits; run only when
#: named (``--only kueue-wave``): it takes the better part of an hour
WAVE = frozenset({"kueue-wave"})
PLAIN = frozenset(SCENARIOS) - KUEUE - WAVE


@dataclass
class Options:
    kubeconfig: Path
    sizes: Sizes
    workdir: Path
    namespace: str = "bench-ns"
    raw_namespace: str = "bench-raw"
    only: frozenset[str] = frozenset(SCENARIOS)
    py_spy: str | None = None
    delete_namespaces: bool = False
    runs: int = 3  # of the throughput case (each: the size's repeats, interleaved)
    workers: int | None = None  # the controller's reconcile workers (None: its default)
    plane_pids: dict[str, int] = field(default_factory=dict)
    #: the bench started the plane: the scale case's raw loop gets a plane of its own too
    fresh_plane: bool = False


def _limits(raised: bool) -> tuple[float, int]:
    return (100000.0, 100000) if raised else (200.0, 400)


async def _kubernetes_version(api: BenchApi) -> str:
    from kubernetes_asyncio import client

    info = await client.VersionApi(api._api).get_code()
    return str(info.git_version)


def _apiserver_port(kubeconfig: Path) -> int:
    config = yaml.safe_load(kubeconfig.read_text())
    server = str(config["clusters"][0]["cluster"]["server"])
    return urlsplit(server).port or 443


async def _with_controller(
    opts: Options, bed: Bed, raw: Bed, label: str, raised: bool
) -> dict[str, Any]:
    """Every scenario that needs the controller running under one client config."""
    out: dict[str, Any] = {}
    proc = ControllerProcess(
        opts.kubeconfig,
        controller_config(opts.namespace, raised, opts.workers),
        opts.workdir,
        label,
    )
    async with anyio.create_task_group() as tg:
        await proc.start(tg)
        try:
            out.update(await _measure(opts, bed, raw, label, raised, proc))
        finally:
            out["controller_exit_code"] = await proc.stop()
            out["controller_warnings"] = proc.count("WARNING")
            out["controller_log"] = str(proc.log_path)
    return out


def _latency_summary(samples: list[release.Release]) -> dict[str, Any]:
    out = summarize([r.seconds for r in samples], "s")
    out["first_pod"] = summarize([r.first_seconds for r in samples], "s")
    out["cpu_cores"] = _cpu_summary(samples)
    return out


def _cpu_summary(samples: list[release.Release]) -> dict[str, float]:
    """Mean cores used per process over the timed intervals that have a reading of it (a
    window without one, the process gone, is not an idle one)."""
    names = sorted({k for r in samples for k in r.cpu})
    return {n: round(statistics.mean(r.cpu[n] for r in samples if n in r.cpu), 3) for n in names}


async def _measure(
    opts: Options, bed: Bed, raw: Bed, label: str, raised: bool, proc: ControllerProcess
) -> dict[str, Any]:
    s = opts.sizes
    out: dict[str, Any] = {}
    pids = {**opts.plane_pids, "controller": proc.pid}
    if opts.only & {"latency", "throughput"}:
        latency: dict[str, Any] = {}
        for pods, repeats in sorted(s.latency_repeats.items()):
            if pods == s.throughput_pods and "throughput" in opts.only:
                samples, out["throughput"] = await _throughput(opts, bed, raw, label, raised, proc)
            elif "latency" in opts.only:
                samples = await release.release_latency(bed, pods, repeats, pids)
            else:
                continue
            latency[str(pods)] = _latency_summary(samples)
        out["release_latency"] = latency
    if "freed" in opts.only:
        freed = await slots.freed_slot_latency(bed, s.freed_cap, s.freed_samples)
        out["freed_slot_latency"] = summarize(freed, "s")
    if "arrival" in opts.only:
        arrival = await slots.arrival_latency(bed, s.arrival_rounds, s.arrival_batch)
        out["arrival_latency"] = summarize(arrival, "s")
    if "churn" in opts.only:
        totals, per = await churn.scaleup_churn(
            bed, s.churn_workloads, s.churn_from, s.churn_to, s.churn_repeats
        )
        out["scaleup_churn"] = {
            "workloads": s.churn_workloads,
            "from": s.churn_from,
            "to": s.churn_to,
            "total": summarize(totals, "s"),
            "per_workload": summarize(per, "s"),
        }
    return out


async def _throughput(
    opts: Options, bed: Bed, raw: Bed, label: str, raised: bool, proc: ControllerProcess
) -> tuple[list[release.Release], dict[str, Any]]:
    """Controller and raw baseline at the same size, interleaved repeat by repeat, in
    ``opts.runs`` runs; each run is summarized on its own (medians, spread, CPU per release)."""
    s = opts.sizes
    pods = s.throughput_pods
    qps, burst = _limits(raised)
    ours: list[release.Release] = []
    theirs: list[release.Release] = []
    watching: list[release.Release] = []
    runs: list[dict[str, Any]] = []
    spies: dict[str, PySpy] = {}
    if opts.py_spy and raised:
        for who in ("controller", "raw"):
            spies[who] = PySpy(opts.py_spy, opts.workdir / f"profile-{who}-{label}.txt")
    pids = {**opts.plane_pids, "controller": proc.pid}
    ctl_spy = (spies["controller"], proc.pid) if spies else None
    async with (  # each baseline one process over every sample: its pool as warm as ours
        release.raw_process(raw, qps, burst) as plain,
        release.raw_process(raw, qps, burst, watch=True) as watcher,
    ):
        for _ in range(opts.runs):
            mark = (len(ours), len(theirs), len(watching))
            for _ in range(s.latency_repeats[pods]):
                ours.extend(await release.release_latency(bed, pods, 1, pids, ctl_spy))
                theirs.append(
                    await release.baseline_release(
                        raw, plain, pods, pids=pids, profile=spies.get("raw")
                    )
                )
                watching.append(await release.baseline_release(raw, watcher, pods, pids=pids))
            runs.append(throughput_run(ours[mark[0] :], theirs[mark[1] :], watching[mark[2] :]))
    out: dict[str, Any] = {
        "pods": pods,
        "qps": qps,
        "burst": burst,
        **throughput_run(ours, theirs, watching),
        "controller_first_pod": summarize([r.first_seconds for r in ours], "s"),
        "baseline_first_pod": summarize([r.first_seconds for r in theirs], "s"),
        "controller_cpu_cores": _cpu_summary(ours),
        "baseline_cpu_cores": _cpu_summary(theirs),
        "runs": runs,
    }
    out["run_ratios"] = summarize([r["ratio"] for r in runs], "ratio")
    out["profiles"] = {who: str(spy.finish()) for who, spy in spies.items()}
    return ours, out


async def run_all(opts: Options) -> dict[str, Any]:
    started = time.time()
    load_before = load_average()
    run = secrets.token_hex(3)
    api = await BenchApi.connect(opts.kubeconfig)
    metrics: dict[str, Any] = {}
    per_config: dict[str, dict[str, Any]] = {}
    try:
        version = await _kubernetes_version(api)
        opts.plane_pids = control_plane_pids(_apiserver_port(opts.kubeconfig))
        for ns in (opts.namespace, opts.raw_namespace):
            await api.ensure_namespace(ns)
            await api.empty_namespace(ns)
        if "reconcile" in opts.only:  # first: the control plane is idle, nothing else runs
            metrics["reconcile_cost"] = _reconcile_summary(
                await reconcile_cost(opts.sizes.reconcile_others, opts.sizes.reconcile_repeats)
            )
            by_size = await owner_size_cost(opts.sizes.owner_sizes, OWNER_SIZE_CALLS)
            metrics["reconcile_cost"]["owner_size"] = _owner_size_summary(by_size)
        async with anyio.create_task_group() as tg:
            bed = Bed(
                api, opts.namespace, opts.kubeconfig, run, PodObserver(api.kube, opts.namespace)
            )
            raw = Bed(
                api,
                opts.raw_namespace,
                opts.kubeconfig,
                run,
                PodObserver(api.kube, opts.raw_namespace),
            )
            for b in (bed, raw):
                tg.start_soon(b.observer.run)
                with anyio.fail_after(30):
                    await b.observer.synced.wait()
            configs = [("raised", True)] + (
                [("default", False)] if opts.sizes.default_config else []
            )
            for label, raised in configs:
                if opts.only & {"latency", "throughput", "freed", "arrival", "churn"}:
                    per_config[label] = await _with_controller(opts, bed, raw, label, raised)
            if "scale" in opts.only:
                metrics["scale"] = await _scale(opts, bed)
            tg.cancel_scope.cancel()
        if opts.delete_namespaces:
            for ns in (opts.namespace, opts.raw_namespace):
                await api.delete_namespace(ns)
    finally:
        await api.close()
    for label, res in per_config.items():
        for key, value in res.items():
            metrics.setdefault(key, {})[label] = value
    result: dict[str, Any] = {
        "meta": {
            "machine": machine_info(version),
            **run_span(started, load_before, time.time(), load_average()),
            "sizes": asdict(opts.sizes),
            "workers": opts.workers,  # None: the controller's default
            "namespace": opts.namespace,
            "control_plane_pids": opts.plane_pids,
        },
        "metrics": metrics,
    }
    result["table"] = table_rows(metrics)
    return result


async def _scale(opts: Options, bed: Bed) -> dict[str, Any]:
    s = opts.sizes
    config = controller_config(opts.namespace, raised=False, workers=opts.workers)

    def start(label: str) -> ControllerProcess:
        return ControllerProcess(opts.kubeconfig, config, opts.workdir, label)

    def fresh() -> Any:
        return bed_on_fresh_plane(opts.namespace, bed.run)

    raw = await scale(
        bed,
        s.scale_workloads,
        s.scale_pods_each,
        s.scale_restarts,
        start,
        _limits(raised=False),
        opts.plane_pids,
        fresh if opts.fresh_plane else None,
    )
    out: dict[str, Any] = {k: v for k, v in raw.items() if not isinstance(v, list)}
    out["config"] = "default"
    out["sync_seconds"] = summarize(raw["sync_seconds"], "s")
    out["ready_seconds"] = summarize(raw["ready_seconds"], "s")
    out["rss_synced_mb"] = summarize(raw["rss_synced_mb"], "MB")
    out["rss_settled_mb"] = summarize(raw["rss_settled_mb"], "MB")
    for key, unit in (("release_all_seconds", "s"), ("peak_rss_mb", "MB")):
        if key in raw:
            out[key] = summarize([raw[key]], unit)
    if "raw" in raw and "release_all_seconds" in raw:
        out["release_all_vs_raw"] = release_all_comparison(raw, raw["raw"])
    return out


#: at each owner size, calls enough for about this many pods decided on (5 at least)
OWNER_SIZE_CALLS = 20_000


def _owner_size_summary(raw: dict[str, Any]) -> dict[str, Any]:
    """Per owner size, each way's microseconds and the median of the memo-less over the memo."""
    out: dict[str, Any] = {}
    for size in raw["reused"]:
        reused = summarize(raw["reused"][size], "us")
        asked = summarize(raw["asked"][size], "us")
        out[size] = {"reused": reused, "asked": asked, "ratio": asked["median"] / reused["median"]}
    return out


def _reconcile_summary(raw: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"bytes_per_cached_pod": raw["bytes_per_cached_pod"]}
    for mode in ("releasing", "idle"):
        out[mode] = {size: summarize(samples, "us") for size, samples in raw[mode].items()}
        out[f"{mode}_ratio"] = _growth(out[mode])
    base = {
        mode: {size: summarize(samples, "us") for size, samples in raw["baseline"][mode].items()}
        for mode in ("releasing", "idle")
    }
    out["baseline"] = {**base, **{f"{mode}_ratio": _growth(base[mode]) for mode in base}}
    return out


def _growth(by_size: dict[str, Any]) -> float:
    """The largest median over the median at the smallest size (sizes in growing order)."""
    medians = [v["median"] for v in by_size.values()]
    return max(medians) / medians[0] if medians else float("nan")
