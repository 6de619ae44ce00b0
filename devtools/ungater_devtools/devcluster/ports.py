"""Loopback ports for the dev cluster's processes, and telling a start that lost its port."""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["PORT_ATTEMPTS", "free_port", "lost_port_race"]

#: Ports this process has handed out, never handed out twice.
_HANDED_OUT: set[int] = set()
_PORT_PICKS = 200
#: How often a process that lost its port to someone else is started again on new ports.
PORT_ATTEMPTS = 3
_PORT_TAKEN = "address already in use"


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listened on a moment ago.

    Picked below the kernel's ephemeral range, at random: a port from ``bind(0)`` lies in the
    range every outgoing connection and every other ``bind(0)`` draws from, so between this
    pick and the peer's own bind it is easily taken (seen: Kueue beside a second plane).  A
    start that still loses the race is retried on new ports (:data:`PORT_ATTEMPTS`).
    """
    low, _ = _ephemeral_range()
    rng = random.SystemRandom()
    for _ in range(_PORT_PICKS):
        port = rng.randrange(10000, max(10001, low))
        if port in _HANDED_OUT:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        picked: int = sock.getsockname()[1]
    _HANDED_OUT.add(picked)
    return picked


def lost_port_race(log_path: Path) -> bool:
    """Whether the last start logged in ``log_path`` failed because its port was taken."""
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return False
    return _PORT_TAKEN in text.rsplit("\n==== ", 1)[-1].lower()
