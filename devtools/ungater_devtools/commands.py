"""``ungater dev-cluster`` and ``ungater demo``: the commands the dev tools add to the CLI.

The runtime's command line (``ungater/_cli/main.py``) finds them through the ``ungater.commands``
entry point group: each is an object with ``help``, ``add_arguments(parser)`` and
``run(args) -> int``. Importing this module is cheap (the CLI does it on every start); the
control plane is imported only when a command runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["DEMO", "DEV_CLUSTER"]

_STATE_HELP = "where the cluster keeps its state; default: ~/.cache/ungater/dev-cluster"


class DevCluster:
    help = "a local kube-apiserver, etcd, Job controller and the real Kueue, KubeRay, JobSet"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "action",
            choices=["up", "down", "build"],
            help="up: start (detached); down: stop; build: build or reuse the binaries",
        )
        parser.add_argument("--state-dir", type=Path, default=None, help=_STATE_HELP)
        parser.add_argument(
            "--no-peers",
            action="store_true",
            help="up, build: leave out Kueue, the KubeRay operator and the JobSet controller",
        )
        from ungater_devtools.devcluster import versions

        parser.add_argument(
            "--kueue",
            choices=list(versions.KUEUE_PINS),
            default=None,
            help=f"up, build: the Kueue to run (default: ${versions.KUEUE_VERSION_ENV}, else "
            f"{versions.KUEUE_VERSION})",
        )

    def run(self, args: argparse.Namespace) -> int:
        from ungater_devtools.devcluster import detached

        if args.action == "up":
            return detached.dev_cluster_up(
                args.state_dir, peers=not args.no_peers, kueue=args.kueue
            )
        if args.action == "down":
            return detached.dev_cluster_down(args.state_dir)
        from ungater_devtools.devcluster.__main__ import main as dev_main

        kueue = ["--kueue", args.kueue] if args.kueue else []
        return dev_main(["build", *(["--no-peers"] if args.no_peers else []), *kueue])


class Demo:
    help = "a narrated elastic-job scenario under the real Kueue on a local control plane"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--state-dir",
            type=Path,
            default=None,
            help="where the cluster keeps its state (kept); default: a temporary directory, removed",
        )
        parser.add_argument("--fast", action="store_true", help="no pauses between steps")

    def run(self, args: argparse.Namespace) -> int:
        from ungater_devtools.demo import run_demo

        return run_demo(args.state_dir, fast=args.fast)


DEV_CLUSTER = DevCluster()
DEMO = Demo()
