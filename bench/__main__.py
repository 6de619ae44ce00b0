"""``python -m bench run [--quick] [--out FILE] [--kubeconfig K]``: run the benchmarks.

Without ``--kubeconfig`` the local control plane is started (binaries built or reused from
``~/.cache/ungater``) and stopped at the end; with it, that cluster is used as it is. The
``kueue`` scenario runs on a control plane of its own with the real Kueue (``--kueue V``: a
version of the pin table, else ``$UNGATER_KUEUE_VERSION``, else the default) and KubeRay.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio

from bench.doc_figures import add_parser as add_figures_parser
from bench.doc_figures import command as figures_command
from bench.doc_report import add_parser as add_report_parser
from bench.doc_report import command as report_command
from bench.kueue_run import EACH_ALONE, HEAD_TO_HEAD, kueue_run
from bench.kueue_wave import DEFAULT_PLAN, parse_wave_plan, wave_run
from bench.machine import load_average, run_span
from bench.report import table_rows
from bench.runner import KUEUE, PLAIN, SCENARIOS, WAVE, Options, run_all
from bench.sizes import FULL, PRESETS, QUICK, Sizes, with_kueue_burst, with_scale
from bench.stats import render_table

RESULTS = Path(__file__).resolve().parent / "results"
_now = time.time  # the run's wall clock and load average, replaced in the unit tests
_load = load_average


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the benchmarks; print the table, write JSON")
    run.add_argument("--quick", action="store_true", help="tiny sizes, one repeat (smoke)")
    run.add_argument("--out", type=Path, help="result JSON (default bench/results/...)")
    run.add_argument("--kubeconfig", type=Path, help="use this cluster instead of starting one")
    run.add_argument(
        "--kueue-kubeconfig",
        type=Path,
        help="for --only kueue: a cluster running the real Kueue and KubeRay (default: start "
        "one); give its version with --kueue",
    )
    run.add_argument(
        "--kueue",
        metavar="VERSION",
        help="for --only kueue: the Kueue of the pin table to run (default: "
        "$UNGATER_KUEUE_VERSION, else the dev cluster's default)",
    )
    run.add_argument(
        "--kueue-burst", type=int, metavar="N", help="for --only kueue: Jobs admitted at once"
    )
    run.add_argument("--namespace", default="bench-ns")
    run.add_argument("--raw-namespace", default="bench-raw")
    run.add_argument("--only", help=f"comma-separated subset of: {','.join(SCENARIOS)}")
    run.add_argument("--no-default-config", action="store_true", help="raised limits only")
    run.add_argument(
        "--py-spy",
        nargs="?",
        const="py-spy",
        metavar="PATH",
        help="profile the controller during the throughput runs (raised config)",
    )
    run.add_argument("--runs", type=int, default=3, help="runs of the throughput case (default 3)")
    run.add_argument("--preset", choices=sorted(PRESETS), help="full sizes, larger where named")
    run.add_argument("--scale-pods", type=int, help="pods of the scale case (all Jobs)")
    run.add_argument("--scale-workloads", type=int, help="Jobs (workloads) of the scale case")
    run.add_argument(
        "--workers", type=int, help="the controller's reconcile workers (default: its own)"
    )
    run.add_argument("--delete-namespaces", action="store_true")
    run.add_argument(
        "--controller-src",
        metavar="DIR",
        help="run the controller from the ungater package under DIR (a worktree of another "
        "commit) instead of the installed one; the result's meta names DIR's commit",
    )
    run.add_argument(
        "--trace",
        action="store_true",
        help="for --only kueue: the controller traces each wave (event, decision, reads, "
        "patches); its spans per case are reported",
    )
    run.add_argument(
        "--wave",
        default=DEFAULT_PLAN,
        metavar="PLAN",
        help="for --only kueue-wave: the stories, comma-separated, each under the default "
        "client limits (shipped, raised), or under one as STORY@LIMITS (shipped, raised, "
        f"equal; default: {DEFAULT_PLAN})",
    )
    add_report_parser(sub)
    add_figures_parser(sub)
    return p


def _options(
    args: argparse.Namespace, kubeconfig: Path, sizes: Sizes, workdir: Path, only: frozenset[str]
) -> Options:
    return Options(
        kubeconfig=kubeconfig,
        sizes=sizes,
        workdir=workdir,
        namespace=args.namespace,
        raw_namespace=args.raw_namespace,
        only=only,
        py_spy=shutil.which(args.py_spy) if args.py_spy else None,
        delete_namespaces=args.delete_namespaces,
        runs=args.runs,
        workers=args.workers,
        fresh_plane=args.kubeconfig is None,
    )


@contextmanager
def _cluster(kubeconfig: Path | None) -> Iterator[Path]:
    """The given cluster, or the plain local control plane for the block."""
    if kubeconfig is not None:
        yield kubeconfig
        return
    from ungater_devtools.devcluster.environment import LocalControlPlane

    print("starting the local control plane ...", file=sys.stderr, flush=True)
    plane = LocalControlPlane()
    plane.start()
    try:
        yield plane.kubeconfig_path
    finally:
        plane.stop()


@contextmanager
def _kueue_cluster(
    kubeconfig: Path | None,
    version: str | None,
    kueue_client: tuple[float, int] | None = None,
    pids: dict[str, int] | None = None,
) -> Iterator[tuple[Path, str]]:
    """The given cluster (its Kueue as stated), or a local control plane running the real Kueue
    (``version`` of the pin table; the default's fallback said when taken) and KubeRay;
    ``kueue_client``: Kueue's (qps, burst), else the dev cluster's; ``pids`` gets the plane's
    processes by name."""
    from ungater_devtools.devcluster import versions

    if kubeconfig is not None:
        yield kubeconfig, version or "(given cluster, version not stated)"
        return
    from ungater_devtools.devcluster.environment import LocalControlPlane

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    asked = versions.kueue_pin(version).version
    say(f"starting the local control plane with the real Kueue {asked} and KubeRay ...")
    options: dict[str, Any] = {"kueue_version": version, "log": say}
    if kueue_client is not None:
        options["kueue_client"] = kueue_client
    plane = LocalControlPlane(peers=("kueue", "kuberay"), peer_options=options)
    plane.start()
    try:
        assert plane.peers is not None
        if pids is not None:
            pids.update(plane.pids)
        ran = plane.peers.kueue_version
        if ran != asked:
            say(f"Kueue {asked} could not be had: Kueue {ran} runs instead")
        yield plane.kubeconfig_path, ran
    finally:
        plane.stop()


def _wave(
    args: argparse.Namespace,
    sizes: Sizes,
    workdir: Path,
    plan: dict[str, list[str]],
    result: dict[str, Any] | None,
) -> dict[str, Any]:
    """The big wave: per set of client limits a control plane of its own (Kueue's limits are
    read at its start), its stories on it; the plane stopped before the next starts."""
    from bench.kueue_wave import LIMITS

    wave: dict[str, Any] = {"plan": args.wave, "limits": {}}
    partial = workdir / "kueue-wave.partial.json"
    for limits, stories in plan.items():
        pids: dict[str, int] = {}
        with _kueue_cluster(None, args.kueue, LIMITS[limits]["kueue"], pids) as (kc, version):
            print(f"the big wave, {limits} limits, beside Kueue {version}", file=sys.stderr)
            if result is None:  # the run's metadata, from this cluster
                result = anyio.run(run_all, _options(args, kc, sizes, workdir, frozenset()))
            wave["kueue_version"] = version
            run = time.strftime("%H%M%S")

            def progress(
                got: dict[str, Any], limits: str = limits, meta: Any = result["meta"]
            ) -> None:
                """What is gathered so far, beside the result file (a run cut short keeps it)."""
                wave["limits"][limits] = got
                gathered = {"partial": True, "meta": meta, "kueue_wave": wave}
                partial.write_text(json.dumps(gathered, indent=1))

            wave["limits"][limits] = anyio.run(
                wave_run, kc, pids, limits, stories, workdir, run, version, progress
            )
    assert result is not None
    result["metrics"]["kueue_wave"] = wave
    result["table"] = table_rows(result["metrics"])
    return result


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "report":
        return report_command(args)
    if args.command == "figures":
        return figures_command(args)
    if args.controller_src:
        os.environ["UNGATER_BENCH_CONTROLLER_SRC"] = str(Path(args.controller_src).resolve())
    sizes = PRESETS[args.preset] if args.preset else QUICK if args.quick else FULL
    sizes = with_scale(sizes, args.scale_pods, args.scale_workloads)
    sizes = with_kueue_burst(sizes, args.kueue_burst)
    if args.no_default_config:
        from dataclasses import replace

        sizes = replace(sizes, default_config=False)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out: Path = args.out or RESULTS / f"bench-{'quick-' if args.quick else ''}{stamp}.json"
    workdir = out.parent / f"{out.stem}.d"
    workdir.mkdir(parents=True, exist_ok=True)
    only = frozenset(args.only.split(",")) if args.only else frozenset(SCENARIOS) - WAVE
    unknown = only - set(SCENARIOS)
    if unknown:
        print(f"unknown scenario(s): {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    plan: dict[str, list[str]] = {}
    if only & WAVE:
        try:
            plan = parse_wave_plan(args.wave)
        except ValueError as exc:
            print(exc, file=sys.stderr)
            return 2
        if args.kueue_kubeconfig is not None:  # Kueue's client limits are set at its start
            print("--only kueue-wave starts its own control planes", file=sys.stderr)
            return 2
    py_spy = shutil.which(args.py_spy) if args.py_spy else None
    if args.py_spy and py_spy is None:
        print(f"py-spy not found: {args.py_spy}", file=sys.stderr)
        return 2
    started, load_before = _now(), _load()
    result: dict[str, Any] | None = None
    if only & PLAIN:
        with _cluster(args.kubeconfig) as kubeconfig:
            result = anyio.run(run_all, _options(args, kubeconfig, sizes, workdir, only & PLAIN))
    if only & KUEUE:  # on a control plane of its own: the real Kueue must not see the rest
        with _kueue_cluster(args.kueue_kubeconfig, args.kueue) as (kubeconfig, version):
            print(f"beside Kueue {version}", file=sys.stderr, flush=True)
            if result is None:  # the run's metadata, from this cluster
                result = anyio.run(run_all, _options(args, kubeconfig, sizes, workdir, frozenset()))
            for scenario, mode in (("kueue", EACH_ALONE), ("kueue-h2h", HEAD_TO_HEAD)):
                if scenario in only:
                    run = time.strftime("%H%M%S")
                    result["metrics"][scenario.replace("-", "_")] = anyio.run(
                        kueue_run, kubeconfig, sizes, workdir, run, version, mode, args.trace
                    )
        result["table"] = table_rows(result["metrics"])
    if only & WAVE:
        result = _wave(args, sizes, workdir, plan, result)
    assert result is not None
    result["meta"].update(run_span(started, load_before, _now(), _load()))
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(render_table(result["table"]))
    for key in ("kueue", "kueue_h2h"):
        if key in result["metrics"]:
            k = result["metrics"][key]
            print(f"\n{k['mode']} ran against Kueue {k['kueue_version']}")
    print(
        f"\nresults: {out}  (load average before/after: "
        f"{result['meta']['load_average_before']} / {result['meta']['load_average_after']})"
    )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
