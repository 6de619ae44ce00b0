"""Command line of the local control plane: ``python -m ungater_devtools.devcluster build|up|down``.

``build`` compiles (or reuses) the control plane's and the peer controllers' binaries and
fetches the CRDs, printing what it did and how long it took (with no ``--kueue``: the default
Kueue and those the tests ask for by name, ``versions.KUEUE_ALSO_BUILT``); ``up``/``down`` start and stop a detached dev cluster for manual work.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def _build(args: argparse.Namespace) -> int:
    from ungater_devtools.devcluster import build

    def say(message: str) -> None:
        print(message, flush=True)

    started = time.monotonic()
    before = build.find_binaries()
    try:
        bins = build.ensure_binaries(build=not args.no_build, log=say)
        crds = build.ensure_crds(log=say)
    except build.ControlPlaneUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    action = "reused" if before is not None else "built"
    versions = f"Kubernetes {bins.kubernetes_version} / etcd {bins.etcd_version}"
    print(f"{action} {versions} in {bins.bin_dir}")
    for path in (bins.kube_apiserver, bins.kube_controller_manager, bins.etcd):
        print(f"  {path.name:<24} {path.stat().st_size / 2**20:7.1f} MiB")
    stamp = build.read_stamp() or {}
    if stamp.get("seconds"):
        recorded = ", ".join(f"{k} {v}s" for k, v in stamp["seconds"].items())
        print(f"  recorded build timings: {recorded} (go {stamp.get('go', '?')})")
    print(f"{len(crds)} CRD manifests in the Go module cache")
    if not args.no_peers:
        from ungater_devtools.devcluster import peerbuild
        from ungater_devtools.devcluster import versions as pins

        try:
            chosen = peerbuild.select_peers(args.kueue, log=say)
            built = list(peerbuild.ensure_peers(chosen, build=not args.no_build, log=say).values())
            # the other Kueues the tests ask for by name, unless one Kueue was asked for
            kueue = next(b.peer.version for b in built if b.peer.name == "kueue")
            for version in () if args.kueue else pins.KUEUE_ALSO_BUILT:
                if version != kueue:
                    pin = [pins.KUEUE_PINS[version]]
                    built += peerbuild.ensure_peers(pin, build=not args.no_build, log=say).values()
        except (peerbuild.PeersUnavailable, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        for peer in built:
            stamp = peerbuild.read_peer_stamp(peer.peer) or {}
            print(
                f"  {peer.path.name:<24} {peer.path.stat().st_size / 2**20:7.1f} MiB"
                f"  {peer.peer.module}@{peer.peer.version}"
                f" (built in {stamp.get('seconds', '?')}s)"
            )
    elapsed = time.monotonic() - started
    print(f"done in {elapsed:.1f}s")
    return 0


def _up(args: argparse.Namespace) -> int:
    from ungater_devtools.devcluster.detached import dev_cluster_up

    return dev_cluster_up(
        args.state_dir,
        peers=not args.no_peers,
        kueue=args.kueue,
        stop_command="python -m ungater_devtools.devcluster down",
    )


def _down(args: argparse.Namespace) -> int:
    from ungater_devtools.devcluster.detached import dev_cluster_down

    return dev_cluster_down(args.state_dir)


def _kueue_option(parser: argparse.ArgumentParser) -> None:
    from ungater_devtools.devcluster import versions

    parser.add_argument(
        "--kueue",
        choices=list(versions.KUEUE_PINS),
        default=None,
        help=f"the Kueue to run (default: ${versions.KUEUE_VERSION_ENV}, else "
        f"{versions.KUEUE_VERSION})",
    )


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ungater_devtools.devcluster",
        description="Local Kubernetes control plane built from Go modules.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_build = sub.add_parser("build", help="build or reuse the binaries, fetch the CRDs")
    p_build.add_argument(
        "--no-build", action="store_true", help="only report; fail if nothing is cached"
    )
    p_build.add_argument(
        "--no-peers",
        action="store_true",
        help="leave out Kueue, the KubeRay operator and the JobSet controller",
    )
    _kueue_option(p_build)
    p_build.set_defaults(func=_build)
    for name, func, text in (
        ("up", _up, "start a detached dev cluster (idempotent)"),
        ("down", _down, "stop the detached dev cluster"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument(
            "--state-dir", type=Path, default=None, help="default ~/.cache/ungater/dev-cluster"
        )
        if name == "up":
            p.add_argument(
                "--no-peers",
                action="store_true",
                help="leave out Kueue, the KubeRay operator and the JobSet controller",
            )
            _kueue_option(p)
        p.set_defaults(func=func)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
