"""A long-lived dev cluster for manual work: ``python -m ungater_devtools.devcluster up|down``.

Unlike the test fixture, these processes outlive the Python process that started them.  Their
pids, ports and command lines are recorded in ``<state_dir>/pids.json`` so that ``down`` (from
another shell, later) can stop exactly them, and ``up`` can tell that the cluster is already
running instead of starting a second one.  :func:`attach_dev_cluster` gives another process
(a test session under ``$UNGATER_TEST_PLANES``) the running cluster as the
:class:`~ungater_devtools.devcluster.environment.LocalControlPlane` that started it, made from
the same record.
"""

from __future__ import annotations

import http.client
import json
import shutil
import ssl
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from ungater_devtools.devcluster.environment import AttachedControlPlane

__all__ = [
    "DevClusterNotRunning",
    "attach_dev_cluster",
    "default_state_dir",
    "dev_cluster_down",
    "dev_cluster_status",
    "dev_cluster_up",
]

_PIDS = "pids.json"


def default_state_dir() -> Path:
    return Path.home() / ".cache" / "ungater" / "dev-cluster"


def _read_record(state_dir: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads((state_dir / _PIDS).read_text())
    except (OSError, ValueError):
        return None
    return data


def _is_our_process(pid: int, executable: str) -> bool:
    """True if ``pid`` is alive and still runs ``executable`` (guards against pid reuse)."""
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0].decode()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except (OSError, IndexError, UnicodeDecodeError):
        return False
    return state != "Z" and argv0 == executable


def _readyz(state_dir: Path, record: dict[str, Any]) -> bool:
    pki = state_dir / "pki"
    try:
        context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        conn = http.client.HTTPSConnection(
            "127.0.0.1", int(record["apiserver_port"]), timeout=3, context=context
        )
        try:
            conn.request("GET", "/readyz")
            response = conn.getresponse()
            response.read()
            return response.status == 200
        finally:
            conn.close()
    except (OSError, KeyError, ValueError, http.client.HTTPException, ssl.SSLError):
        return False


def _alive(record: dict[str, Any]) -> list[str]:
    """The names of the recorded processes that still run."""
    procs = record.get("processes", {})
    return [n for n, p in procs.items() if _is_our_process(int(p["pid"]), p["args"][0])]


def _status(directory: Path, record: dict[str, Any] | None) -> str:
    if record is None:
        return "stopped"
    alive = _alive(record)
    if not alive:
        return "stopped"
    if len(alive) == len(record.get("processes", {})) and _readyz(directory, record):
        return "running"
    return "broken"


def dev_cluster_status(state_dir: Path | None = None) -> str:
    """``running``, ``stopped`` or ``broken`` (some recorded process alive, API not ready)."""
    directory = state_dir or default_state_dir()
    return _status(directory, _read_record(directory))


def _why_not_running(directory: Path, record: dict[str, Any] | None) -> str:
    if not directory.is_dir():
        return f"{directory} does not exist"
    if record is None:
        return f"no dev cluster recorded in {directory} (no {_PIDS})"
    alive = _alive(record)
    gone = [name for name in record.get("processes", {}) if name not in alive]
    if not alive:
        return f"the dev cluster recorded in {directory} is not running"
    if gone:
        return f"the dev cluster in {directory} is half running (gone: {', '.join(gone)})"
    return f"the API server of the dev cluster in {directory} is not ready"


class DevClusterNotRunning(RuntimeError):
    """:func:`attach_dev_cluster` found no running dev cluster; the message says what it found."""


def attach_dev_cluster(state_dir: Path) -> AttachedControlPlane:
    """The dev cluster running in ``state_dir`` (started by ``dev_cluster_up``, by any process),
    as a :class:`~ungater_devtools.devcluster.environment.LocalControlPlane`: its ports, peers
    and processes from ``pids.json``, its certificates, kubeconfigs and logs from the state
    directory, so ``request``, ``make_user_kubeconfig``, ``install_crds``, ``pids``,
    ``peers.kubeconfigs`` and the paths work as on the plane that started it.

    The processes stay the starter's: ``stop()`` leaves them running, and ``kill_apiserver`` /
    ``start_apiserver`` raise (another user of the cluster would see it break). Raises
    :class:`DevClusterNotRunning` unless every recorded process runs and the API is ready."""
    record = _read_record(state_dir)
    if record is None or _status(state_dir, record) != "running":
        raise DevClusterNotRunning(_why_not_running(state_dir, record))
    from ungater_devtools.devcluster.environment import AttachedControlPlane

    procs = record["processes"]
    return AttachedControlPlane(
        state_dir,
        apiserver_port=int(record["apiserver_port"]),
        etcd_port=urlsplit(str(record["etcd_url"])).port or 0,
        processes={n: (int(p["pid"]), list(p["args"]), Path(p["log"])) for n, p in procs.items()},
        alive=lambda: _alive(record),
        peers=tuple(record.get("peers") or ()),
        kueue_version=record.get("kueue_version"),
    )


def _usage(directory: Path, record: dict[str, Any], stop_command: str) -> str:
    kubeconfig = directory / "kubeconfig"
    lines = [
        f"kube-apiserver {record.get('kubernetes_version', '')} at {record.get('server_url')}",
        "peers: " + (", ".join(record.get("peers") or ()) or "none"),
        f"Kueue {record.get('kueue_version')}" if record.get("kueue_version") else "",
        f"state and logs: {directory}",
        "use it with:",
        f"  export KUBECONFIG={kubeconfig}",
        "  ungater run",
        "stop it with:",
        f"  {stop_command} --state-dir {directory}",
    ]
    return "\n".join(line for line in lines if line)


def _say(line: str) -> None:
    print(line, flush=True)


def dev_cluster_up(
    state_dir: Path | None = None,
    *,
    peers: bool = True,
    kueue: str | None = None,
    stop_command: str = "ungater dev-cluster down",
) -> int:
    """Start a detached dev cluster (or report the running one); returns an exit code.

    With ``peers`` (the default) the real Kueue, KubeRay operator and JobSet controller run
    in it too (Kueue ``kueue``, else the default of :func:`versions.kueue_pin`), and a
    ResourceFlavor ``default-flavor`` exists. ``stop_command`` is printed as
    the way to stop it: the same command line the user started it with.
    """
    from ungater_devtools.devcluster.build import ControlPlaneUnavailable
    from ungater_devtools.devcluster.environment import LocalControlPlane
    from ungater_devtools.devcluster.process import ControlPlaneStartError

    directory = state_dir or default_state_dir()
    status = dev_cluster_status(directory)
    if status == "running":
        record = _read_record(directory) or {}
        print("dev cluster already running")
        print(_usage(directory, record, stop_command))
        return 0
    if status == "broken":
        print("dev cluster half running; stopping what is left before starting anew")
        dev_cluster_down(directory, quiet=True)
    # A stopped cluster's state is stale (new ports, new certificates): start from scratch.
    if directory.exists():
        for child in ("etcd", "pki", "users", "logs", "peers", _PIDS, "kubeconfig"):
            target = directory / child
            if target.is_dir():
                shutil.rmtree(target, ignore_errors=True)
            else:
                target.unlink(missing_ok=True)
    directory.mkdir(parents=True, exist_ok=True)
    plane = LocalControlPlane(
        state_dir=directory,
        detached=True,
        peers=peers,
        peer_options={"kueue_version": kueue, "log": _say},
    )
    try:
        plane.start()
        if peers:
            from ungater_devtools.kueue_objects import create_default_flavor

            create_default_flavor(plane)
    except (ControlPlaneUnavailable, ControlPlaneStartError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        print(f"logs: {directory / 'logs'}", file=sys.stderr)
        return 1
    record = {
        "server_url": plane.server_url,
        "apiserver_port": plane.apiserver_port,
        "etcd_url": plane.etcd_url,
        "kubernetes_version": plane.binaries.kubernetes_version,
        "peers": list(plane.peers.names) if plane.peers is not None else [],
        "kueue_version": plane.peers.kueue_version if plane.peers is not None else None,
        "processes": {
            name: {"pid": info.pid, "args": info.args, "log": str(info.log_path)}
            for name, info in plane.processes.items()
            if info.pid is not None
        },
    }
    tmp = directory / f".{_PIDS}.tmp"
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(directory / _PIDS)
    print("dev cluster started")
    print(_usage(directory, record, stop_command))
    return 0


def dev_cluster_down(state_dir: Path | None = None, *, quiet: bool = False) -> int:
    """Stop the processes recorded in ``pids.json`` (newest first); returns an exit code."""
    from ungater_devtools.devcluster.process import terminate_pid

    directory = state_dir or default_state_dir()
    record = _read_record(directory)
    if record is None:
        if not quiet:
            print(f"no dev cluster recorded in {directory}")
        return 0
    procs: dict[str, Any] = record.get("processes", {})
    for name in reversed(list(procs)):
        pid = int(procs[name]["pid"])
        if _is_our_process(pid, procs[name]["args"][0]):
            terminate_pid(pid)
            if not quiet:
                print(f"stopped {name} (pid {pid})")
    (directory / _PIDS).unlink(missing_ok=True)
    if not quiet:
        print(f"dev cluster in {directory} is down")
    return 0
