"""The bare control plane: etcd, kube-apiserver and (optionally) kube-controller-manager on
127.0.0.1, their certificates, kubeconfigs and logs in one state directory.

:class:`ControlPlane` starts the components in order and waits (with bounded deadlines) for
each to become healthy, and tears everything down by pid in reverse order.  Fault tests can
kill and restart the API server over the same etcd.  What runs on the plane (CRDs, the peers)
is installed by a subclass's :meth:`ControlPlane._install`, see
:mod:`ungater_devtools.devcluster.environment`.
"""

from __future__ import annotations

import atexit
import http.client
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from ungater_devtools.devcluster import pki
from ungater_devtools.devcluster.build import Binaries, ensure_binaries
from ungater_devtools.devcluster.plane import admin, apiserver, controllermanager, etcd
from ungater_devtools.devcluster.plane.controllermanager import DEFAULT_CONTROLLERS
from ungater_devtools.devcluster.ports import PORT_ATTEMPTS, free_port, lost_port_race
from ungater_devtools.devcluster.process import (
    KILL_WAIT_S,
    OWNER_FILE,
    STOP_GRACE_S,
    TEMP_PREFIX,
    ControlPlaneStartError,
    ProcessInfo,
    parent_death_signal,
    sweep_stale_temp_dirs,
    tail,
    terminate_pid,
)

__all__ = ["ControlPlane"]

_POLL_S = 0.2


class ControlPlane:
    """etcd + kube-apiserver (+ kube-controller-manager) on 127.0.0.1.

    Use as a context manager, or call :meth:`start` / :meth:`stop`.  With ``state_dir=None`` a
    temporary directory is created and removed on stop; a given ``state_dir`` is kept.
    """

    def __init__(
        self,
        binaries: Binaries | None = None,
        *,
        state_dir: Path | None = None,
        controllers: Sequence[str] | None = DEFAULT_CONTROLLERS,
        startup_timeout: float = 90.0,
        detached: bool = False,
        extra_apiserver_args: Sequence[str] = (),
    ) -> None:
        self._binaries = binaries
        self._owns_state_dir = state_dir is None
        self._given_state_dir = state_dir
        self._temp_state_dir: Path | None = None
        self._keep_state_dir = False
        self._controllers = tuple(controllers) if controllers else ()
        self.startup_timeout = startup_timeout
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
            sweep_stale_temp_dirs()
            self._temp_state_dir = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX))
            (self._temp_state_dir / OWNER_FILE).write_text(f"{os.getpid()}\n")
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
    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> Self:
        """Start everything and wait until it is ready; on failure stop what was started."""
        with self._lock:
            if self._started:
                return self
            self._started = True
        if not self._detached and not self._atexit_registered:
            atexit.register(self.stop)
            self._atexit_registered = True
        try:
            self._start_components(self.binaries)
            self._install()
        except BaseException:
            self._keep_state_dir = True  # keep the logs that the error message points at
            self.stop()
            raise
        return self

    def _install(self) -> None:
        """What runs on the plane, installed once it is up: nothing on the bare plane."""

    def _start_components(self, binaries: Binaries) -> None:
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
                popen.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait(timeout=KILL_WAIT_S)
        info.popen = None

    def start_apiserver(self) -> None:
        """(Re)start kube-apiserver on the same port, certificates and etcd; wait for /readyz."""
        info = self._procs.get("kube-apiserver")
        if info is not None and info.popen is not None and info.popen.poll() is None:
            return
        self._start_apiserver_process(self.binaries)

    # ----------------------------------------------------------------- setup
    def _prepare(self) -> None:
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
                preexec_fn=None if self._detached else parent_death_signal(),
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

    def wait_for(self, name: str, check: Callable[[], bool], what: str) -> None:
        """Poll ``check`` until true, failing if process ``name`` exits or time runs out."""
        deadline = time.monotonic() + self.startup_timeout
        attempts = 0
        max_attempts = int(self.startup_timeout / _POLL_S) + 10
        while attempts < max_attempts:
            attempts += 1
            if name and not self._alive(name):
                info = self._procs[name]
                code = info.popen.returncode if info.popen is not None else None
                raise ControlPlaneStartError(
                    f"{name} exited (code {code}) before {what}; log {info.log_path}:\n"
                    f"{tail(info.log_path)}"
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
            f"timed out after {self.startup_timeout}s waiting for {what}"
            + (f"; log {log}:\n{tail(log)}" if log else "")
        )

    def _start_etcd(self, binaries: Binaries) -> None:
        self.spawn(
            "etcd",
            etcd.args(
                binaries.etcd,
                data_dir=self._state_dir / "etcd",
                port=self.etcd_port,
                peer_port=self.etcd_peer_port,
            ),
        )
        self.wait_for("etcd", lambda: etcd.healthy(self.etcd_port), "etcd /health")

    def _start_apiserver_process(self, binaries: Binaries) -> None:
        self._ssl = None
        args = apiserver.args(
            binaries.kube_apiserver,
            etcd_url=self.etcd_url,
            port=self.apiserver_port,
            pki=self.pki_dir,
            server_url=self.server_url,
            extra=self._extra_apiserver_args,
        )
        self.spawn("kube-apiserver", args)

        def ready() -> bool:
            status, _ = self.request("GET", "/readyz", timeout=3)
            return status == 200

        self.wait_for("kube-apiserver", ready, "kube-apiserver /readyz")

    def _write_admin_kubeconfig(self) -> None:
        pki.write_kubeconfig(
            self.kubeconfig_path,
            server=self.server_url,
            ca_path=self.ca_path,
            client=pki.IssuedCert(self.admin_cert_path, self.admin_key_path),
            user="admin",
        )

    def _start_controller_manager(self, binaries: Binaries) -> None:
        kubeconfig = controllermanager.write_kubeconfig(
            self._state_dir, self.pki_dir, server_url=self.server_url
        )
        args = controllermanager.args(
            binaries.kube_controller_manager,
            kubeconfig=kubeconfig,
            port=self.controller_manager_port,
            pki_dir=self.pki_dir,
            controllers=self._controllers,
        )
        self.spawn("kube-controller-manager", args)
        context = self._ssl_context()
        self.wait_for(
            "kube-controller-manager",
            lambda: controllermanager.healthy(self.controller_manager_port, context),
            "kube-controller-manager /healthz",
        )

    # ----------------------------------------------------------------- API access
    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = admin.ssl_context(self.ca_path, self.admin_cert_path, self.admin_key_path)
        return self._ssl

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        accept: str = "application/json",
        timeout: float = 10.0,
    ) -> tuple[int, Any]:
        """One admin request to the API server; returns ``(status, decoded JSON or text)``."""
        return admin.request(
            self.apiserver_port,
            self._ssl_context(),
            method,
            path,
            body,
            content_type=content_type,
            accept=accept,
            timeout=timeout,
        )

    def make_user_kubeconfig(
        self, user: str, groups: Sequence[str] = (), *, namespace: str | None = None
    ) -> Path:
        """A kubeconfig authenticating as ``user`` in ``groups`` by client certificate."""
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
