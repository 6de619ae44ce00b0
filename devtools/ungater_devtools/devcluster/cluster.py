"""Runs etcd, kube-apiserver and kube-controller-manager on loopback for tests.

:class:`LocalControlPlane` owns the processes, their certificates, kubeconfigs and logs, all
inside one state directory.  It starts them in order and waits (with bounded deadlines) for
each to become healthy, installs the pinned Kueue/JobSet/KubeRay CRDs and waits until they
are Established, and tears everything down by pid in reverse order.  The flags follow what
controller-runtime's envtest uses, plus the controller manager so that the real Job
controller creates pods.  Fault tests can kill and restart the API server over the same etcd.
"""

from __future__ import annotations

import atexit
import ctypes
import http.client
import json
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ungater_devtools.devcluster.build import Binaries, ensure_binaries, ensure_crds

if TYPE_CHECKING:
    from ungater_devtools.devcluster.peers import Peers

__all__ = [
    "DEFAULT_CONTROLLERS",
    "ControlPlaneStartError",
    "LocalControlPlane",
    "ProcessInfo",
]

#: Controllers run by kube-controller-manager: pods for Jobs, owner-reference cleanup, and
#: namespace deletion (so that per-test namespaces really go away).
DEFAULT_CONTROLLERS: tuple[str, ...] = (
    "job-controller",
    "garbage-collector-controller",
    "namespace-controller",
)

_POLL_S = 0.2
_STOP_GRACE_S = 10.0
_KILL_WAIT_S = 5.0
_SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
_PR_SET_PDEATHSIG = 1
_TEMP_PREFIX = "ungater-cp-"
_OWNER_FILE = "owner.pid"
_SWEEP_MIN_AGE_S = 300.0


class ControlPlaneStartError(RuntimeError):
    """A control-plane process did not become healthy in time, or exited."""


@dataclass
class ProcessInfo:
    """One control-plane process: what it is, its pid and its log file."""

    name: str
    args: list[str]
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None


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


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _parent_death_signal() -> Callable[[], None] | None:
    """A preexec hook making a child receive SIGKILL when this process dies (Linux only).

    SIGKILL rather than SIGTERM: a kube-apiserver whose etcd is going away at the same time
    can spend minutes in graceful shutdown.  Only safe when the spawning thread lives as long
    as the process, i.e. the main thread: the kernel signals when the *thread* that forked exits.
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

    return hook


def terminate_pid(pid: int, *, grace: float = _STOP_GRACE_S, popen: Any = None) -> None:
    """SIGTERM ``pid``, wait up to ``grace`` seconds, then SIGKILL and wait briefly."""

    def gone() -> bool:
        if popen is not None:
            return popen.poll() is not None
        try:
            waited, _ = os.waitpid(pid, os.WNOHANG)
            if waited == pid:
                return True
        except ChildProcessError:
            pass
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return _is_zombie(pid)

    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, _KILL_WAIT_S)):
        if gone():
            return
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if gone():
                return
            time.sleep(0.05)


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"


def _sweep_stale_temp_dirs() -> None:
    """Remove temporary state dirs whose owning Python process is gone (e.g. was SIGKILLed).

    The control-plane processes of such a dir already got SIGKILL from the kernel (see
    :func:`_parent_death_signal`); only the files are left behind.  Directories touched in
    the last few minutes are left alone, in case a process is still on its way out.
    """
    root = Path(tempfile.gettempdir())
    now = time.time()
    for candidate in root.glob(f"{_TEMP_PREFIX}*"):
        try:
            owner = int((candidate / _OWNER_FILE).read_text().strip())
            if now - candidate.stat().st_mtime < _SWEEP_MIN_AGE_S:
                continue
        except (OSError, ValueError):
            continue
        try:
            os.kill(owner, 0)
        except ProcessLookupError:
            shutil.rmtree(candidate, ignore_errors=True)
        except PermissionError:
            continue


class LocalControlPlane:
    """etcd + kube-apiserver (+ kube-controller-manager) on 127.0.0.1, with the CRDs installed.

    Use as a context manager, or call :meth:`start` / :meth:`stop` (e.g. from a session
    fixture or an async test's setup).  With ``state_dir=None`` a temporary directory is
    created and removed on stop; a given ``state_dir`` is kept.
    """

    def __init__(
        self,
        binaries: Binaries | None = None,
        *,
        state_dir: Path | None = None,
        crds: Sequence[Path] | None = None,
        controllers: Sequence[str] | None = DEFAULT_CONTROLLERS,
        startup_timeout: float = 90.0,
        detached: bool = False,
        extra_apiserver_args: Sequence[str] = (),
        peers: Sequence[str] | bool = False,
        peer_options: dict[str, Any] | None = None,
    ) -> None:
        from ungater_devtools.devcluster.peers import PEER_NAMES

        self._binaries = binaries
        self._peer_names: tuple[str, ...] = (
            PEER_NAMES if peers is True else tuple(peers) if peers else ()
        )
        self._peer_options = dict(peer_options or {})
        self.peers: Peers | None = None
        self._owns_state_dir = state_dir is None
        self._given_state_dir = state_dir
        self._temp_state_dir: Path | None = None
        self._keep_state_dir = False
        self._crds = list(crds) if crds is not None else None
        self._controllers = tuple(controllers) if controllers else ()
        self._startup_timeout = startup_timeout
        self._detached = detached
        self._extra_apiserver_args = list(extra_apiserver_args)
        self._procs: dict[str, ProcessInfo] = {}
        self._ssl: ssl.SSLContext | None = None
        self._started = False
        self._atexit_registered = False
        self._lock = threading.Lock()
        self.etcd_port = 0
        self.etcd_peer_port = 0
        self.apiserver_port = 0
        self.controller_manager_port = 0

    # ----------------------------------------------------------------- paths and URLs
    @property
    def state_dir(self) -> Path:
        return self._state_dir

    @property
    def _state_dir(self) -> Path:
        if self._given_state_dir is not None:
            return self._given_state_dir
        if self._temp_state_dir is None:
            _sweep_stale_temp_dirs()
            self._temp_state_dir = Path(tempfile.mkdtemp(prefix=_TEMP_PREFIX))
            (self._temp_state_dir / _OWNER_FILE).write_text(f"{os.getpid()}\n")
        return self._temp_state_dir

    @property
    def pki_dir(self) -> Path:
        return self._state_dir / "pki"

    @property
    def logs_dir(self) -> Path:
        return self._state_dir / "logs"

    @property
    def kubeconfig_path(self) -> Path:
        """Admin kubeconfig (user ``admin`` in group ``system:masters``), credentials embedded."""
        return self._state_dir / "kubeconfig"

    @property
    def ca_path(self) -> Path:
        return self.pki_dir / "ca.crt"

    @property
    def admin_cert_path(self) -> Path:
        return self.pki_dir / "admin.crt"

    @property
    def admin_key_path(self) -> Path:
        return self.pki_dir / "admin.key"

    @property
    def server_url(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.etcd_port}"

    @property
    def binaries(self) -> Binaries:
        if self._binaries is None:
            self._binaries = ensure_binaries()
        return self._binaries

    @property
    def log_paths(self) -> dict[str, Path]:
        return {name: info.log_path for name, info in self._procs.items()}

    @property
    def processes(self) -> dict[str, ProcessInfo]:
        """The processes started so far, in start order (a copy)."""
        return dict(self._procs)

    @property
    def pids(self) -> dict[str, int]:
        return {n: i.pid for n, i in self._procs.items() if i.pid is not None and self._alive(n)}

    # ----------------------------------------------------------------- lifecycle
    def __enter__(self) -> LocalControlPlane:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> LocalControlPlane:
        """Start everything and wait until it is ready; on failure stop what was started."""
        with self._lock:
            if self._started:
                return self
            self._started = True
        if not self._detached and not self._atexit_registered:
            atexit.register(self.stop)
            self._atexit_registered = True
        try:
            binaries = self.binaries
            crds = self._crds if self._crds is not None else ensure_crds()
            self._prepare()
            self.retry_port_race("etcd", lambda: self._start_etcd(binaries), self._new_etcd_ports)
            self.retry_port_race(
                "kube-apiserver",
                lambda: self._start_apiserver_process(binaries),
                self._new_apiserver_port,
            )
            self._write_admin_kubeconfig()
            if self._controllers:
                self.retry_port_race(
                    "kube-controller-manager",
                    lambda: self._start_controller_manager(binaries),
                    self._new_controller_manager_port,
                )
            if self._peer_names:
                from ungater_devtools.devcluster.peers import Peers

                self.peers = Peers(self, self._peer_names, **self._peer_options)
                # the peers install these themselves (Kueue's with its conversion webhook)
                theirs = {p.name for p in self.peers.crd_paths()}
                crds = [c for c in crds if c.name not in theirs]
            self.install_crds(crds)
            if self.peers is not None:
                self.peers.start()
        except BaseException:
            self._keep_state_dir = True  # keep the logs that the error message points at
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Terminate the processes by pid (newest first) and remove a temporary state dir."""
        with self._lock:
            for name in reversed(list(self._procs)):
                info = self._procs[name]
                if info.popen is not None:
                    terminate_pid(info.popen.pid, popen=info.popen)
                    info.popen = None
            self._started = False
            if self._atexit_registered:
                atexit.unregister(self.stop)
                self._atexit_registered = False
            temp = self._temp_state_dir
            if self._owns_state_dir and temp is not None and not self._keep_state_dir:
                shutil.rmtree(temp, ignore_errors=True)
                self._temp_state_dir = None

    def kill_apiserver(self, sig: signal.Signals = signal.SIGKILL) -> None:
        """Kill kube-apiserver (SIGKILL by default) and wait until it is gone; etcd stays up."""
        info = self._procs.get("kube-apiserver")
        if info is None or info.popen is None:
            return
        popen = info.popen
        if popen.poll() is None:
            popen.send_signal(sig)
            try:
                popen.wait(timeout=_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait(timeout=_KILL_WAIT_S)
        info.popen = None

    def start_apiserver(self) -> None:
        """(Re)start kube-apiserver on the same port, certificates and etcd; wait for /readyz."""
        info = self._procs.get("kube-apiserver")
        if info is not None and info.popen is not None and info.popen.poll() is None:
            return
        self._start_apiserver_process(self.binaries)

    # ----------------------------------------------------------------- setup
    def _prepare(self) -> None:
        from ungater_devtools.devcluster import pki

        self._state_dir.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        self.etcd_port = free_port()
        self.etcd_peer_port = free_port()
        self.apiserver_port = free_port()
        self.controller_manager_port = free_port() if self._controllers else 0
        ca = pki.CertificateAuthority.create(self.pki_dir)
        ca.issue(
            "apiserver",
            common_name="kube-apiserver",
            dns_names=("localhost", "kubernetes", "kubernetes.default"),
            ip_addresses=("127.0.0.1", "10.0.0.1"),
            server=True,
        )
        ca.issue("admin", common_name="admin", organizations=("system:masters",), client=True)
        # kube-controller-manager gets its own name for audit, but full rights: with
        # --use-service-account-credentials=false it acts as itself for every controller.
        ca.issue(
            "kube-controller-manager",
            common_name="system:kube-controller-manager",
            organizations=("system:masters",),
            client=True,
        )
        pki.write_service_account_keys(self.pki_dir)

    def retry_port_race(
        self, name: str, start: Callable[[], None], new_ports: Callable[[], None]
    ) -> None:
        """Run ``start``; when process ``name`` exited because its port was taken, stop it,
        call ``new_ports`` (which picks new ports and may spawn it again) and run ``start``
        again, at most :data:`PORT_ATTEMPTS` times in all."""
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                start()
                return
            except ControlPlaneStartError:
                info = self._procs.get(name)
                if attempt == PORT_ATTEMPTS or info is None or not lost_port_race(info.log_path):
                    raise
                if info.popen is not None:
                    terminate_pid(info.popen.pid, popen=info.popen)
                    info.popen = None
                new_ports()

    def _new_etcd_ports(self) -> None:
        shutil.rmtree(self._state_dir / "etcd", ignore_errors=True)
        self.etcd_port = free_port()
        self.etcd_peer_port = free_port()

    def _new_apiserver_port(self) -> None:
        self.apiserver_port = free_port()

    def _new_controller_manager_port(self) -> None:
        self.controller_manager_port = free_port()

    def spawn(
        self, name: str, args: list[str], *, env: dict[str, str] | None = None
    ) -> ProcessInfo:
        """Start a process whose lifetime is the control plane's (stopped by pid with it)."""
        return self._spawn(name, args, env=env)

    def wait_for(self, name: str, check: Callable[[], bool], what: str) -> None:
        """Poll ``check`` until true, failing if process ``name`` exits or time runs out."""
        self._wait_for(name, check, what)

    def _spawn(
        self, name: str, args: list[str], *, env: dict[str, str] | None = None
    ) -> ProcessInfo:
        log_path = self.logs_dir / f"{name}.log"
        log = log_path.open("ab")
        log.write(f"\n==== {time.strftime('%H:%M:%S')} {' '.join(args)}\n".encode())
        log.flush()
        try:
            popen = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self._state_dir,
                env={**os.environ, **env} if env else None,
                start_new_session=True,  # Ctrl-C in the test runner must not reach them
                preexec_fn=None if self._detached else _parent_death_signal(),
                close_fds=True,
            )
        finally:
            log.close()
        info = ProcessInfo(name=name, args=args, log_path=log_path, popen=popen)
        self._procs[name] = info
        return info

    def _alive(self, name: str) -> bool:
        info = self._procs.get(name)
        return info is not None and info.popen is not None and info.popen.poll() is None

    def _wait_for(self, name: str, check: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + self._startup_timeout
        attempts = 0
        max_attempts = int(self._startup_timeout / _POLL_S) + 10
        while attempts < max_attempts:
            attempts += 1
            if name and not self._alive(name):
                info = self._procs[name]
                code = info.popen.returncode if info.popen is not None else None
                raise ControlPlaneStartError(
                    f"{name} exited (code {code}) before {what}; log {info.log_path}:\n"
                    f"{_tail(info.log_path)}"
                )
            try:
                if check():
                    return
            except (OSError, http.client.HTTPException, ValueError):
                pass
            if time.monotonic() > deadline:
                break
            time.sleep(_POLL_S)
        log = self._procs[name].log_path if name in self._procs else None
        raise ControlPlaneStartError(
            f"timed out after {self._startup_timeout}s waiting for {what}"
            + (f"; log {log}:\n{_tail(log)}" if log else "")
        )

    def _start_etcd(self, binaries: Binaries) -> None:
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        args = [
            str(binaries.etcd),
            "--name=default",
            f"--data-dir={self._state_dir / 'etcd'}",
            f"--listen-client-urls={self.etcd_url}",
            f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=default={peer}",
            "--initial-cluster-state=new",
            "--unsafe-no-fsync=true",
            "--log-level=warn",
        ]
        self._spawn("etcd", args)

        def healthy() -> bool:
            conn = http.client.HTTPConnection("127.0.0.1", self.etcd_port, timeout=2)
            try:
                conn.request("GET", "/health")
                body = conn.getresponse().read()
            finally:
                conn.close()
            return bool(json.loads(body).get("health") == "true")

        self._wait_for("etcd", healthy, "etcd /health")

    def _apiserver_args(self, binaries: Binaries) -> list[str]:
        pki = self.pki_dir
        return [
            str(binaries.kube_apiserver),
            f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.apiserver_port}",
            f"--cert-dir={pki}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            "--authorization-mode=RBAC",
            f"--service-account-issuer={self.server_url}/",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={_SERVICE_CLUSTER_IP_RANGE}",
            "--disable-admission-plugins=ServiceAccount",
            "--allow-privileged=true",
            "--profiling=false",
            *self._extra_apiserver_args,
        ]

    def _start_apiserver_process(self, binaries: Binaries) -> None:
        self._ssl = None
        self._spawn("kube-apiserver", self._apiserver_args(binaries))

        def ready() -> bool:
            status, _ = self.request("GET", "/readyz", timeout=3)
            return status == 200

        self._wait_for("kube-apiserver", ready, "kube-apiserver /readyz")

    def _write_admin_kubeconfig(self) -> None:
        from ungater_devtools.devcluster import pki

        pki.write_kubeconfig(
            self.kubeconfig_path,
            server=self.server_url,
            ca_path=self.ca_path,
            client=pki.IssuedCert(self.admin_cert_path, self.admin_key_path),
            user="admin",
        )

    def _start_controller_manager(self, binaries: Binaries) -> None:
        from ungater_devtools.devcluster import pki

        kubeconfig = pki.write_kubeconfig(
            self._state_dir / "kube-controller-manager.kubeconfig",
            server=self.server_url,
            ca_path=self.ca_path,
            client=pki.IssuedCert(
                self.pki_dir / "kube-controller-manager.crt",
                self.pki_dir / "kube-controller-manager.key",
            ),
            user="system:kube-controller-manager",
        )
        args = [
            str(binaries.kube_controller_manager),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.controller_manager_port}",
            f"--tls-cert-file={self.pki_dir / 'apiserver.crt'}",
            f"--tls-private-key-file={self.pki_dir / 'apiserver.key'}",
            f"--client-ca-file={self.ca_path}",
            f"--controllers={','.join(self._controllers)}",
            "--use-service-account-credentials=false",
            "--leader-elect=false",
            "--profiling=false",
            # The defaults (20 QPS, 5 Job syncs) are sized for a shared production API server;
            # tests create and delete hundreds of pods at once and must not wait on them.
            "--kube-api-qps=500",
            "--kube-api-burst=1000",
            "--concurrent-job-syncs=20",
            "--concurrent-gc-syncs=40",
            f"--service-cluster-ip-range={_SERVICE_CLUSTER_IP_RANGE}",
        ]
        self._spawn("kube-controller-manager", args)
        context = self._ssl_context()

        def healthy() -> bool:
            conn = http.client.HTTPSConnection(
                "127.0.0.1", self.controller_manager_port, timeout=3, context=context
            )
            try:
                conn.request("GET", "/healthz")
                response = conn.getresponse()
                response.read()
                return response.status == 200
            finally:
                conn.close()

        self._wait_for("kube-controller-manager", healthy, "kube-controller-manager /healthz")

    # ----------------------------------------------------------------- API access
    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            context = ssl.create_default_context(cafile=str(self.ca_path))
            context.load_cert_chain(str(self.admin_cert_path), str(self.admin_key_path))
            self._ssl = context
        return self._ssl

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        timeout: float = 10.0,
    ) -> tuple[int, Any]:
        """One admin request to the API server; returns ``(status, decoded JSON or text)``."""
        conn = http.client.HTTPSConnection(
            "127.0.0.1", self.apiserver_port, timeout=timeout, context=self._ssl_context()
        )
        try:
            headers = {"Accept": "application/json"}
            payload: bytes | None = None
            if body is not None:
                payload = body if isinstance(body, bytes) else json.dumps(body).encode()
                headers["Content-Type"] = content_type
            conn.request(method, path, body=payload, headers=headers)
            response = conn.getresponse()
            raw = response.read()
        finally:
            conn.close()
        try:
            return response.status, json.loads(raw)
        except ValueError:
            return response.status, raw.decode(errors="replace")

    def install_crds(self, paths: Sequence[Path], *, timeout: float | None = None) -> list[str]:
        """Create (or replace) each CRD manifest and wait until all are Established."""
        import yaml

        names: list[str] = []
        base = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
        for path in paths:
            for doc in yaml.safe_load_all(path.read_text()):
                if not doc or doc.get("kind") != "CustomResourceDefinition":
                    continue
                name = doc["metadata"]["name"]
                status, result = self.request("POST", base, doc, timeout=30)
                if status == 409:
                    status, current = self.request("GET", f"{base}/{name}")
                    doc["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                    status, result = self.request("PUT", f"{base}/{name}", doc, timeout=30)
                if status not in (200, 201):
                    raise ControlPlaneStartError(f"installing CRD {name} from {path}: {result}")
                names.append(name)
        deadline = time.monotonic() + (timeout or self._startup_timeout)
        pending = list(names)
        while pending:
            still = []
            for name in pending:
                status, crd = self.request("GET", f"{base}/{urllib.parse.quote(name)}")
                conditions = (
                    ((crd.get("status") or {}).get("conditions") or []) if status == 200 else []
                )
                if not any(
                    c.get("type") == "Established" and c.get("status") == "True" for c in conditions
                ):
                    still.append(name)
            pending = still
            if pending and time.monotonic() > deadline:
                raise ControlPlaneStartError(f"CRDs not Established in time: {pending}")
            if pending:
                time.sleep(_POLL_S)
        return names

    def make_user_kubeconfig(
        self, user: str, groups: Sequence[str] = (), *, namespace: str | None = None
    ) -> Path:
        """A kubeconfig authenticating as ``user`` in ``groups`` by client certificate."""
        from ungater_devtools.devcluster import pki

        ca = pki.CertificateAuthority.load(self.pki_dir)
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in user)
        stem = f"user-{safe}-{len(list(self.pki_dir.glob(f'user-{safe}-*.crt')))}"
        issued = ca.issue(stem, common_name=user, organizations=tuple(groups), client=True)
        return pki.write_kubeconfig(
            self._state_dir / "users" / f"{stem}.kubeconfig",
            server=self.server_url,
            ca_path=self.ca_path,
            client=issued,
            user=user,
            namespace=namespace,
        )

    def describe_failure(self) -> str:
        """Where the process logs are (for a failing test's report)."""
        return "\n".join(f"{name}: {path}" for name, path in self.log_paths.items())
