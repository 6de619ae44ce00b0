"""Whether this process runs under CI: one reading of ``$CI`` for every check in the tree.

CI systems spell it differently (``true``, ``True``, ``1``, ``yes``); a check that compared
with ``"true"`` alone let ``CI=1`` skip what CI must fail on, so every check asks here.
"""

from __future__ import annotations

import os

__all__ = ["CI_VALUES", "in_ci"]

CI_VALUES = frozenset({"true", "1", "yes"})


def in_ci() -> bool:
    """True when ``$CI`` says so, in any case and with surrounding spaces."""
    return os.environ.get("CI", "").strip().lower() in CI_VALUES
