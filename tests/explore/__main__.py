"""``python -m tests.explore [--depth N] [--scenario NAME ...] [--kind KIND ...] [--against REV]``:
explore deeper than CI does (``make explore``); print each scenario's and kind's counts and, on
a violation, the shortest interleaving that breaks an oracle.

``--against REV`` runs the same explorer (this tree's ``tests/``) against another commit's
``ungater/`` and ``plugins/``: a temporary ``git worktree`` of REV, put first on the path of a
child process, removed afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.explore.kinds import KINDS
from tests.explore.oracles import Rules
from tests.explore.scenarios import ALL, CI_DEPTHS
from tests.explore.search import explore
from tests.explore.world import Bounds

RULES = ("handover-window", "unknowable")
#: not rules of the promise: the old design's open item, to tell its other failures apart
EXTRA = ("owner-lag",)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.explore", description=__doc__)
    parser.add_argument("--depth", type=int, default=6, help="actions per interleaving")
    parser.add_argument("--scenario", action="append", choices=sorted(ALL))
    parser.add_argument("--kind", action="append", choices=sorted(KINDS))
    parser.add_argument("--against", metavar="REV", help="run against REV's ungater/, plugins/")
    parser.add_argument("--faults", type=int, default=1, help="requests that may fail")
    parser.add_argument("--max-states", type=int, default=200_000)
    parser.add_argument("--no-hash", action="store_true", help="merge no states (slow)")
    parser.add_argument(
        "--keep-going", action="store_true", help="explore the whole bound past a violation"
    )
    parser.add_argument(
        "--ci", action="store_true", help="each scenario to its CI depth (test_explore.py)"
    )
    parser.add_argument("--no-liveness", action="store_true", help="skip the liveness oracle")
    parser.add_argument("--no-reports", action="store_true", help="skip the report oracle")
    parser.add_argument("--excuse-off", action="append", choices=RULES, default=[])
    parser.add_argument(
        "--excuse",
        action="append",
        choices=EXTRA,
        default=[],
        help="also excuse an owner shrink the sender's owner cache had not shown (the old "
        "design's open item; never in CI)",
    )
    return parser.parse_args(argv)


async def main(argv: list[str]) -> int:
    args = parse(argv)
    if args.against:
        return against(args.against, [a for a in argv if a != "--against" and a != args.against])
    logging.getLogger("ungater").setLevel(logging.CRITICAL)
    import ungater

    print(f"controller: {Path(ungater.__file__).parent}", flush=True)
    bounds = Bounds(faults=args.faults, hashing=not args.no_hash, liveness=not args.no_liveness)
    rules = Rules(
        handover_window="handover-window" not in args.excuse_off,
        unknowable="unknowable" not in args.excuse_off,
        reports=not args.no_reports,
        owner_lag="owner-lag" in args.excuse,
    )
    failed = 0
    for name in args.scenario or list(ALL):
        scenario = ALL[name]
        for kind in args.kind or scenario.kinds:
            if kind not in scenario.kinds:
                continue
            depth = CI_DEPTHS[name] if args.ci else args.depth
            report = await explore(
                scenario, kind, depth, bounds, args.max_states, rules, args.keep_going
            )
            print(report.line(), flush=True)
            for i, step in enumerate(report.trace, 1):
                print(f"  {i:2}. {step}", flush=True)
            failed += bool(report.violation)
    return 1 if failed else 0


def against(rev: str, argv: list[str]) -> int:
    """Run this explorer on ``rev``'s controller: a temporary worktree of it, and a directory
    of links (``ungater``, ``ungater_plugins``, and this tree's ``tests``) that the child
    process starts in, so those come first on its path."""
    root = Path(__file__).resolve().parents[2]
    scratch = Path(tempfile.mkdtemp(prefix="explore-against-"))
    tree, links = scratch / "tree", scratch / "links"
    subprocess.run(
        ["git", "-C", str(root), "worktree", "add", "--detach", str(tree), rev],
        check=True,
        capture_output=True,
    )
    try:
        links.mkdir()
        (links / "ungater").symlink_to(tree / "ungater")
        (links / "ungater_plugins").symlink_to(tree / "plugins")
        (links / "tests").symlink_to(root / "tests")
        env = {**os.environ, "PYTHONPATH": str(links)}
        head = subprocess.run(
            ["git", "-C", str(tree), "log", "-1", "--format=%h %s"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        print(f"against {head}", flush=True)
        return subprocess.run(
            [sys.executable, "-m", "tests.explore", *argv], cwd=links, env=env
        ).returncode
    finally:
        subprocess.run(
            ["git", "-C", str(root), "worktree", "remove", "--force", str(tree)],
            capture_output=True,
        )
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
