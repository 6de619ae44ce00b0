"""An opt-in trace of each owner's path through the controller, for finding where a wave's
time goes (``logging.trace``; the benchmark reads it back with ``bench/trace.py``).

Each trace point is one line on the logger ``ungater.trace``::

    TRACE <monotonic seconds, 6 decimals> <point> key=<namespace>/<owner uid> [<k>=<v> ...]

The time is ``time.monotonic()``: CLOCK_MONOTONIC is system-wide on Linux, so another process
on the same machine (the benchmark harness) can put the controller's moments beside its own.
Values carry no whitespace or quotes (replaced by ``_``), so a line parses by splitting, in the
text log format and inside the ``msg`` of the JSON one alike.

Off (the default), a trace point costs its caller one attribute check: every call site reads
``if trace.on: trace.point(...)``, so nothing is formatted. On, the trace logger gets its own
level (DEBUG), so its lines are written whatever ``logging.level`` says.
"""

from __future__ import annotations

import logging
import time

__all__ = ["LOGGER", "OFF", "PREFIX", "Tracer"]

LOGGER = "ungater.trace"
PREFIX = "TRACE"
_UNSAFE = str.maketrans({" ": "_", "\t": "_", "\n": "_", "\r": "_", '"': "_", "\\": "_"})


class Tracer:
    """Writes trace points when ``on``; callers check ``on`` first (see the module)."""

    __slots__ = ("_log", "on")

    def __init__(self, on: bool = False) -> None:
        self.on = on
        self._log = logging.getLogger(LOGGER)
        if on:  # its own level: trace lines are written at any `logging.level`
            self._log.setLevel(logging.DEBUG)

    def point(self, point: str, key: object, **fields: object) -> None:
        """One line: ``point`` reached for owner ``key`` (an ``OwnerKey``; None: ``-``)."""
        parts = [PREFIX, f"{time.monotonic():.6f}", point, f"key={_text(key)}"]
        parts.extend(f"{k}={_text(v)}" for k, v in fields.items())
        self._log.debug(" ".join(parts))


def _text(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.6f}"
    return str(value).translate(_UNSAFE) or "-"


#: The tracer of everything made without one: off.
OFF = Tracer()
