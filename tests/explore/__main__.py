"""``python -m tests.explore [--depth N] [--scenario NAME ...] [--undo FIX]``: explore deeper
than CI does (``make explore``); print each scenario's counts and, on a violation, the
shortest interleaving that breaks the cap."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys

from tests.explore.reverts import REVERTS
from tests.explore.scenarios import ALL
from tests.explore.search import explore
from tests.explore.world import Bounds


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.explore", description=__doc__)
    parser.add_argument("--depth", type=int, default=11, help="actions per interleaving")
    parser.add_argument("--scenario", action="append", choices=sorted(ALL))
    parser.add_argument("--undo", choices=sorted(REVERTS), help="explore with a fix undone")
    parser.add_argument("--faults", type=int, default=1, help="patches that may time out")
    parser.add_argument("--max-states", type=int, default=200_000)
    args = parser.parse_args(argv)
    logging.getLogger("ungater").setLevel(logging.ERROR)
    bounds = Bounds(faults=args.faults)
    failed = 0
    for name in args.scenario or sorted(ALL):
        undo = REVERTS[args.undo][0]() if args.undo else contextlib.nullcontext()
        with undo:
            report = await explore(ALL[name], args.depth, bounds, args.max_states)
        print(report.line(), flush=True)
        for i, step in enumerate(report.trace, 1):
            print(f"  {i:2}. {step}")
        failed += bool(report.violation)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
