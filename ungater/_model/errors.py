"""The one error that stops a start: the command line prints its message and exits 2."""

from __future__ import annotations

__all__ = ["StartupError"]


class StartupError(Exception):
    """ungater cannot start as configured; the message says what to fix."""
