"""The dev cluster's ports: picked where outgoing connections never draw from, and a process
that lost its port to someone else anyway is started again on new ports, once per loss."""

from __future__ import annotations

import itertools
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ungater_devtools.devcluster import ports as port_picks
from ungater_devtools.devcluster.plane.plane import ControlPlane
from ungater_devtools.devcluster.ports import free_port, lost_port_race
from ungater_devtools.devcluster.process import ControlPlaneStartError

#: Listens on the port given as its argument until killed.
_LISTENER = (
    "import socket, sys, time\n"
    "s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen()\n"
    "print('listening', flush=True)\n"
    "time.sleep(60)\n"
)


def test_free_ports_lie_below_the_ephemeral_range_and_are_never_handed_out_twice() -> None:
    low, _ = port_picks._ephemeral_range()
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert all(10000 <= p < low for p in ports)
    for port in ports[:5]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # free when handed out


def test_a_port_someone_listens_on_is_never_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        scripted = _Scripted(itertools.chain([taken, taken], _spare_ports(taken)))
        monkeypatch.setattr(port_picks.random, "SystemRandom", lambda: scripted)
        monkeypatch.setattr(port_picks, "_ephemeral_range", lambda: (65536, 65536))
        picked = free_port()
    assert picked != taken
    assert scripted.drawn[:2] == [taken, taken]


def test_a_port_handed_out_once_is_not_handed_out_again(monkeypatch: pytest.MonkeyPatch) -> None:
    first = free_port()
    scripted = _Scripted(itertools.chain([first], _spare_ports(first)))
    monkeypatch.setattr(port_picks.random, "SystemRandom", lambda: scripted)
    again = free_port()
    assert again != first
    assert scripted.drawn[0] == first


def _spare_ports(avoid: int) -> Iterator[int]:
    """Further picks once the scripted ones are used up: any of them may be busy on a loaded
    machine (a full run has a control plane's connections open), so there are many."""
    return (port for port in range(20000, 30000) if port != avoid)


class _Scripted:
    def __init__(self, picks: Iterator[int]) -> None:
        self._picks = picks
        self.drawn: list[int] = []

    def randrange(self, low: int, high: int) -> int:
        self.drawn.append(next(self._picks))
        return self.drawn[-1]


def test_only_the_last_start_in_a_log_counts(tmp_path: Path) -> None:
    log = tmp_path / "kueue.log"
    log.write_text(
        "\n==== 10:00:00 kueue\nlisten tcp 127.0.0.1:1: bind: address already in use\n"
        "\n==== 10:00:05 kueue\nstarting manager\n"
    )
    assert not lost_port_race(log)
    log.write_text(log.read_text() + "\n==== 10:00:09 kueue\nOSError: Address already in use\n")
    assert lost_port_race(log)
    assert not lost_port_race(tmp_path / "missing.log")


def plane_in(tmp_path: Path) -> ControlPlane:
    plane = ControlPlane(state_dir=tmp_path, startup_timeout=20)
    plane.logs_dir.mkdir(parents=True, exist_ok=True)
    return plane


def test_a_process_that_lost_its_port_starts_again_on_a_new_one(tmp_path: Path) -> None:
    plane = plane_in(tmp_path)
    tried: list[int] = []
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = [held.getsockname()[1]]

        def start() -> None:
            tried.append(port[0])
            plane.spawn("listener", [sys.executable, "-c", _LISTENER, str(port[0])])
            plane.wait_for("listener", lambda: _said_listening(plane), "the listener")

        def new_port() -> None:
            port[0] = free_port()

        try:
            plane.retry_port_race("listener", start, new_port)
            assert len(tried) == 2 and tried[0] == held.getsockname()[1]
            assert _accepts(tried[1])
        finally:
            plane.stop()
    assert plane.pids == {}


def test_other_start_failures_are_not_retried(tmp_path: Path) -> None:
    plane = plane_in(tmp_path)
    starts: list[int] = []

    def start() -> None:
        starts.append(1)
        plane.spawn("broken", [sys.executable, "-c", "raise SystemExit('bad flag')"])
        plane.wait_for("broken", lambda: False, "the broken one")

    try:
        with pytest.raises(ControlPlaneStartError, match="broken exited"):
            plane.retry_port_race("broken", start, lambda: None)
    finally:
        plane.stop()
    assert starts == [1]


def test_a_port_lost_every_time_gives_up_after_the_attempts(tmp_path: Path) -> None:
    plane = plane_in(tmp_path)
    starts: list[int] = []
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]

        def start() -> None:
            starts.append(1)
            plane.spawn("listener", [sys.executable, "-c", _LISTENER, str(taken)])
            plane.wait_for("listener", lambda: _said_listening(plane), "the listener")

        try:
            with pytest.raises(ControlPlaneStartError, match="listener exited"):
                plane.retry_port_race("listener", start, lambda: None)
        finally:
            plane.stop()
    assert len(starts) == port_picks.PORT_ATTEMPTS


def _said_listening(plane: ControlPlane) -> bool:
    log = plane.processes["listener"].log_path.read_text()
    return "listening" in log.rsplit("\n==== ", 1)[-1].splitlines()[1:]


def _accepts(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0
