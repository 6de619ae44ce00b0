"""Attaching to running planes (``make test-fast``, ``$UNGATER_TEST_PLANES``) without a control
plane: a fabricated dev-cluster state directory, its processes a Python that sleeps (or one that
has exited), its API server a TLS server that answers ``/readyz`` with the state dir's
certificates."""

from __future__ import annotations

import http.server
import json
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ungater_devtools.devcluster import pki
from ungater_devtools.devcluster.detached import DevClusterNotRunning, attach_dev_cluster
from ungater_devtools.pytest_plugin import _attached_plane

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


class _Ready(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def apiserver(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """(state dir with its pki/, port): an HTTPS server that wants the admin's certificate."""
    state = tmp_path / "plane"
    ca = pki.CertificateAuthority.create(state / "pki")
    served = ca.issue(
        "apiserver", common_name="kube-apiserver", ip_addresses=("127.0.0.1",), server=True
    )
    ca.issue("admin", common_name="admin", organizations=("system:masters",), client=True)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(served.cert_path, served.key_path)
    context.load_verify_locations(ca.cert_path)
    context.verify_mode = ssl.CERT_REQUIRED
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ready)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield state, server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A recorded process that runs; its command line is the recorded one (after the exec)."""
    proc = subprocess.Popen(SLEEPER)
    cmdline = Path(f"/proc/{proc.pid}/cmdline")
    try:
        for _ in range(500):
            if cmdline.read_bytes().split(b"\0")[:2] == [s.encode() for s in SLEEPER[:2]]:
                break
            time.sleep(0.01)
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _exited() -> int:
    proc = subprocess.Popen([*SLEEPER[:2], "pass"])
    proc.wait()
    return proc.pid


def _record(
    state: Path,
    port: int,
    pids: dict[str, int],
    *,
    peers: tuple[str, ...] = (),
    kueue: str | None = None,
) -> None:
    state.mkdir(parents=True, exist_ok=True)
    record = {
        "server_url": f"https://127.0.0.1:{port}",
        "apiserver_port": port,
        "etcd_url": "http://127.0.0.1:2379",
        "kubernetes_version": "v1.35.4",
        "peers": list(peers),
        "kueue_version": kueue,
        "processes": {
            name: {"pid": pid, "args": SLEEPER, "log": str(state / "logs" / f"{name}.log")}
            for name, pid in pids.items()
        },
    }
    (state / "pids.json").write_text(json.dumps(record))


def test_no_directory_no_record_or_dead_processes_is_not_running(tmp_path: Path) -> None:
    with pytest.raises(DevClusterNotRunning, match="does not exist"):
        attach_dev_cluster(tmp_path / "nowhere")
    with pytest.raises(DevClusterNotRunning, match=r"no dev cluster recorded .* \(no pids.json\)"):
        attach_dev_cluster(tmp_path)
    _record(tmp_path, 1, {"etcd": _exited(), "kube-apiserver": _exited()})
    with pytest.raises(DevClusterNotRunning, match=r"recorded in .* is not running"):
        attach_dev_cluster(tmp_path)


def test_half_running_names_what_is_gone(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    _record(tmp_path, 1, {"etcd": sleeper.pid, "kube-apiserver": _exited()})
    with pytest.raises(DevClusterNotRunning, match=r"half running \(gone: kube-apiserver\)"):
        attach_dev_cluster(tmp_path)


def test_processes_up_but_no_api_server_is_not_ready(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    _record(tmp_path, 1, {"etcd": sleeper.pid, "kube-apiserver": sleeper.pid})
    with pytest.raises(DevClusterNotRunning, match=r"API server .* is not ready"):
        attach_dev_cluster(tmp_path)


def test_a_running_plane_is_the_plane_its_starter_had(
    apiserver: tuple[Path, int], sleeper: subprocess.Popen[bytes]
) -> None:
    state, port = apiserver
    names = ("etcd", "kube-apiserver", "kube-controller-manager", "kueue", "kuberay", "jobset")
    _record(
        state,
        port,
        dict.fromkeys(names, sleeper.pid),
        peers=("kueue", "kuberay", "jobset"),
        kueue="v0.17.1",
    )
    plane = attach_dev_cluster(state)
    assert (plane.apiserver_port, plane.server_url) == (port, f"https://127.0.0.1:{port}")
    assert plane.etcd_port == 2379
    assert plane.state_dir == state
    assert plane.kubeconfig_path == state / "kubeconfig"
    assert (plane.ca_path, plane.admin_cert_path, plane.admin_key_path) == (
        state / "pki" / "ca.crt",
        state / "pki" / "admin.crt",
        state / "pki" / "admin.key",
    )
    assert plane.logs_dir == state / "logs"
    assert plane.pids == dict.fromkeys(names, sleeper.pid)
    assert f"kueue: {state / 'logs' / 'kueue.log'}" in plane.describe_failure()
    assert plane.request("GET", "/readyz") == (200, {"path": "/readyz"})
    assert plane.recorded_kueue_version == "v0.17.1"
    assert plane.peers is not None
    assert plane.peers.names == ("kueue", "kuberay", "jobset")
    assert plane.peers.kubeconfigs == {n: state / "peers" / n / "kubeconfig" for n in names[3:]}
    assert "ray.io/raycluster" in plane.peers.integrations
    user = plane.make_user_kubeconfig("alice", ["team-a"])
    assert (
        user.parent == state / "users" and f"server: https://127.0.0.1:{port}" in user.read_text()
    )
    # the processes stay the starter's
    assert plane.start() is plane
    plane.stop()
    assert sleeper.poll() is None
    with pytest.raises(RuntimeError, match="started by another process"):
        plane.kill_apiserver()
    with pytest.raises(RuntimeError, match="started by another process"):
        plane.start_apiserver()
    assert sleeper.poll() is None


@pytest.mark.parametrize("ci", ["true", ""])
@pytest.mark.parametrize(
    ("peers", "kueue_version", "where", "options"),
    [
        (False, None, "plain", "--no-peers"),
        (True, None, "kueue-v0.19.2", "--kueue v0.19.2"),
        (True, "v0.17.1", "kueue-v0.17.1", "--kueue v0.17.1"),
    ],
)
def test_a_missing_plane_fails_with_the_command_that_starts_it(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    ci: str,
    peers: bool,
    kueue_version: str | None,
    where: str,
    options: str,
) -> None:
    monkeypatch.setenv("CI", ci)
    monkeypatch.delenv("UNGATER_KUEUE_VERSION", raising=False)
    with pytest.raises(pytest.fail.Exception) as failed:
        next(_attached_plane(tmp_path, peers=peers, kueue_version=kueue_version))
    message = str(failed.value)
    assert f"UNGATER_TEST_PLANES={tmp_path}, and {tmp_path / where} does not exist" in message
    assert (
        f"start it with\n  ungater dev-cluster up --state-dir {tmp_path / where} {options}\n"
        in (message)
    )


def test_a_plane_with_the_wrong_peers_fails_saying_to_restart_it(
    apiserver: tuple[Path, int], sleeper: subprocess.Popen[bytes]
) -> None:
    state, port = apiserver
    plain = state.rename(state.parent / "plain")
    _record(
        plain, port, {"etcd": sleeper.pid, "kueue": sleeper.pid}, peers=("kueue",), kueue="v0.19.2"
    )
    with pytest.raises(pytest.fail.Exception) as failed:
        next(_attached_plane(plain.parent, peers=False, kueue_version=None))
    assert f"the dev cluster in {plain} runs Kueue v0.19.2" in str(failed.value)
    assert (
        f"ungater dev-cluster down --state-dir {plain} && "
        f"ungater dev-cluster up --state-dir {plain} --no-peers"
    ) in str(failed.value)


def test_an_attached_plane_is_left_running_at_the_end(
    apiserver: tuple[Path, int], sleeper: subprocess.Popen[bytes]
) -> None:
    state, port = apiserver
    plain = state.rename(state.parent / "plain")
    _record(plain, port, {"etcd": sleeper.pid, "kube-apiserver": sleeper.pid})
    session = _attached_plane(plain.parent, peers=False, kueue_version=None)
    plane = next(session)
    assert plane.peers is None and plane.pids == {
        "etcd": sleeper.pid,
        "kube-apiserver": sleeper.pid,
    }
    assert next(session, None) is None  # the end of the session
    assert sleeper.poll() is None
