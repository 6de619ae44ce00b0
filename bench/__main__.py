"""``python -m bench run [--quick] [--out FILE] [--kubeconfig K]``: run the benchmarks.

Without ``--kubeconfig`` the local control plane is started (binaries built or reused from
``~/.cache/ungater``) and stopped at the end; with it, that cluster is used as it is.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import anyio

from bench.runner import SCENARIOS, Options, run_all
from bench.sizes import FULL, QUICK
from bench.stats import render_table

RESULTS = Path(__file__).resolve().parent / "results"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the benchmarks; print the table, write JSON")
    run.add_argument("--quick", action="store_true", help="tiny sizes, one repeat (smoke)")
    run.add_argument("--out", type=Path, help="result JSON (default bench/results/...)")
    run.add_argument("--kubeconfig", type=Path, help="use this cluster instead of starting one")
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
    run.add_argument("--delete-namespaces", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    sizes = QUICK if args.quick else FULL
    if args.no_default_config:
        from dataclasses import replace

        sizes = replace(sizes, default_config=False)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out: Path = args.out or RESULTS / f"bench-{'quick-' if args.quick else ''}{stamp}.json"
    workdir = out.parent / f"{out.stem}.d"
    workdir.mkdir(parents=True, exist_ok=True)
    only = frozenset(args.only.split(",")) if args.only else frozenset(SCENARIOS)
    unknown = only - set(SCENARIOS)
    if unknown:
        print(f"unknown scenario(s): {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    py_spy = shutil.which(args.py_spy) if args.py_spy else None
    if args.py_spy and py_spy is None:
        print(f"py-spy not found: {args.py_spy}", file=sys.stderr)
        return 2
    plane = None
    kubeconfig = args.kubeconfig
    if kubeconfig is None:
        from ungater_devtools.devcluster.cluster import LocalControlPlane

        print("starting the local control plane ...", file=sys.stderr, flush=True)
        plane = LocalControlPlane().start()
        kubeconfig = plane.kubeconfig_path
    try:
        opts = Options(
            kubeconfig=kubeconfig,
            sizes=sizes,
            workdir=workdir,
            namespace=args.namespace,
            raw_namespace=args.raw_namespace,
            only=only,
            py_spy=py_spy,
            delete_namespaces=args.delete_namespaces,
        )
        result = anyio.run(run_all, opts)
    finally:
        if plane is not None:
            plane.stop()
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(render_table(result["table"]))
    print(
        f"\nresults: {out}  (load average before/after: "
        f"{result['meta']['load_average_before']} / {result['meta']['load_average_after']})"
    )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
