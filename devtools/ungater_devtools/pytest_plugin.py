"""pytest fixtures giving a suite a real kube-apiserver: ``control_plane``, ``kube_namespace``.

Registered through the ``pytest11`` entry point, so any suite that installs ungater (plugin
authors' included) can request them.  Importing this module costs nothing beyond ``pytest``
itself: the control plane machinery is imported only when a fixture is actually used, and a
suite that never asks for the fixtures never builds or starts anything.

When the binaries cannot be had, the fixture fails under ``CI=true`` (a CI that silently skips
its integration tests is worse than a red one) and skips elsewhere, saying how to get them.
``UNGATER_CONTROL_PLANE=skip`` forces the skip outside CI; ``UNGATER_CONTROL_PLANE=reuse``
uses cached binaries only and never starts a (long) build.

``kueue_cluster`` runs the Kueue a test asks for with ``@pytest.mark.kueue_version("v0.17.1")``
(on the test, its class or its module), else ``$UNGATER_KUEUE_VERSION``, else the default pin.
Each version asked for starts once and runs to the end of the session (of each pytest-xdist
worker, under ``-n``).

With ``$UNGATER_TEST_PLANES`` naming a directory (``make test-fast``), nothing starts: the
fixtures attach to the dev clusters already running there (``ungater dev-cluster up
--state-dir``), ``plain`` (started ``--no-peers``) for ``control_plane`` and ``kueue-<version>``
for ``kueue_cluster``, and leave them running at the end. A plane that is not there fails the
test with the command that starts it, under ``CI=true`` or not. A test that kills or restarts
the API server takes ``breakable_plane`` (and ``breakable_namespace``) instead of
``control_plane``: the same plane normally, a plane of its own in that mode.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Callable, Generator, Iterator
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import pytest

from ungater_devtools.ci import in_ci

if TYPE_CHECKING:
    from ungater_devtools.devcluster.environment import LocalControlPlane

__all__ = [
    "PLANES_ENV",
    "breakable_namespace",
    "breakable_plane",
    "control_plane",
    "kube_namespace",
    "kueue_cluster",
    "kueue_namespace",
]

#: A directory of running dev clusters the fixtures attach to instead of starting planes.
PLANES_ENV = "UNGATER_TEST_PLANES"

_HOW_TO_GET = (
    "build the binaries once with `python -m ungater_devtools.devcluster build` "
    "(needs Go and the Go module proxy; takes a while on first run)"
)
_ACTIVE: list[LocalControlPlane] = []
T = TypeVar("T")


def _unavailable(reason: str) -> NoReturn:
    if in_ci():
        pytest.fail(f"local control plane unavailable under CI=true: {reason}", pytrace=False)
    pytest.skip(f"local control plane unavailable: {reason}; {_HOW_TO_GET}")


@pytest.fixture(scope="session")
def control_plane(request: pytest.FixtureRequest) -> Iterator[LocalControlPlane]:
    """A started etcd + kube-apiserver + kube-controller-manager with the CRDs installed
    (under ``$UNGATER_TEST_PLANES``: the running one in ``$UNGATER_TEST_PLANES/plain``)."""
    yield from _plane(request, peers=False)


@pytest.fixture
def breakable_plane(request: pytest.FixtureRequest) -> Iterator[LocalControlPlane]:
    """The plain plane for a test that breaks it (``kill_apiserver``, ``start_apiserver``):
    ``control_plane`` itself, except under ``$UNGATER_TEST_PLANES``, whose planes every later
    session shares: there a plane of the test's own, started for it and stopped after it
    (about 10 s on two cores)."""
    if _planes_dir() is None:
        yield request.getfixturevalue("control_plane")
    else:
        yield from _started_plane(request, peers=False)


class _KueueClusters:
    """The running Kueue clusters of the session, one per Kueue version asked for.

    Each version's cluster starts at its first test and lives to the end of the session (or of
    the pytest-xdist worker): a suite that interleaves versions never pays a second start-up
    (about 35 s on two cores each), and two idle clusters cost memory, not CPU."""

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self._request = request
        self._running: dict[str | None, Iterator[LocalControlPlane]] = {}
        self._planes: dict[str | None, LocalControlPlane] = {}
        self._failed: dict[str | None, BaseException] = {}  # skip or failure, given once

    def get(self, version: str | None) -> LocalControlPlane:
        if version in self._failed:
            raise self._failed[version]
        if version not in self._planes:
            running = _plane(self._request, peers=True, kueue_version=version)
            try:
                self._planes[version] = next(running)
            except BaseException as exc:  # pytest's skip and fail are BaseExceptions
                self._failed[version] = exc
                raise
            self._running[version] = running
        return self._planes[version]

    def close(self) -> None:
        running, self._running, self._planes = self._running, {}, {}
        for generator in running.values():
            next(generator, None)  # runs the generator's clean-up: stops the plane


@pytest.fixture(scope="session")
def _kueue_clusters(request: pytest.FixtureRequest) -> Iterator[_KueueClusters]:
    clusters = _KueueClusters(request)
    try:
        yield clusters
    finally:
        clusters.close()


@pytest.fixture
def kueue_cluster(
    _kueue_clusters: _KueueClusters, request: pytest.FixtureRequest
) -> LocalControlPlane:
    """A second control plane of its own, running the real Kueue (the version of the
    ``kueue_version`` marker, else the default), KubeRay operator and JobSet controller
    (``plane.peers``); a ResourceFlavor ``default-flavor`` exists. Shared by every test of
    the session that asks for the same Kueue (under ``$UNGATER_TEST_PLANES``: the running one
    in ``$UNGATER_TEST_PLANES/kueue-<version>``)."""
    marker = request.node.get_closest_marker("kueue_version")
    return _kueue_clusters.get(str(marker.args[0]) if marker is not None else None)


def _planes_dir() -> Path | None:
    value = os.environ.get(PLANES_ENV, "").strip()
    return Path(value).expanduser() if value else None


def _plane(
    request: pytest.FixtureRequest, *, peers: bool, kueue_version: str | None = None
) -> Iterator[LocalControlPlane]:
    """The plane of a session fixture: attached under ``$UNGATER_TEST_PLANES``, else started."""
    planes = _planes_dir()
    if planes is not None:
        return _attached_plane(planes, peers=peers, kueue_version=kueue_version)
    return _started_plane(request, peers=peers, kueue_version=kueue_version)


def _attached_plane(
    planes: Path, *, peers: bool, kueue_version: str | None
) -> Iterator[LocalControlPlane]:
    """The running dev cluster of ``planes`` that the fixture asks for (``plain``, else
    ``kueue-<version>``, the version resolved as :func:`versions.kueue_pin` does), never
    stopped here. When it is not there, the test fails saying how to start it: never a start,
    never a skip (a plane started here would die with the session, the opposite of why
    ``$UNGATER_TEST_PLANES`` is set)."""
    from ungater_devtools.devcluster import versions
    from ungater_devtools.devcluster.detached import DevClusterNotRunning, attach_dev_cluster

    if peers:
        try:
            version = versions.kueue_pin(kueue_version).version
        except ValueError as exc:
            pytest.fail(str(exc), pytrace=False)
        directory = planes / f"kueue-{version}"
        options = f"--kueue {version}"
    else:
        version = None
        directory = planes / "plain"
        options = "--no-peers"
    start = f"ungater dev-cluster up --state-dir {directory} {options}"
    problem = ""
    try:
        plane = attach_dev_cluster(directory)
    except DevClusterNotRunning as exc:
        problem = str(exc)
    else:
        runs = plane.recorded_kueue_version
        if runs != version:
            problem = f"the dev cluster in {directory} runs " + (
                f"Kueue {runs}" if runs else "no Kueue"
            )
            start = f"ungater dev-cluster down --state-dir {directory} && {start}"
    if problem:
        pytest.fail(
            f"{PLANES_ENV}={planes}, and {problem}; start it with\n  {start}\n"
            f"(`make test-fast` starts every plane the tests use and runs them; without "
            f"{PLANES_ENV} each session starts planes of its own)",
            pytrace=False,
        )
    _ACTIVE.append(plane)
    try:
        yield plane
    finally:
        _ACTIVE.remove(plane)  # and the plane runs on, for the next session


def _started_plane(
    request: pytest.FixtureRequest, *, peers: bool, kueue_version: str | None = None
) -> Iterator[LocalControlPlane]:
    mode = os.environ.get("UNGATER_CONTROL_PLANE", "").strip().lower()
    if mode == "skip" and not in_ci():
        pytest.skip(f"UNGATER_CONTROL_PLANE=skip; {_HOW_TO_GET}")
    try:
        from ungater_devtools.devcluster.build import (
            ControlPlaneUnavailable,
            ensure_binaries,
            find_binaries,
        )
        from ungater_devtools.devcluster.environment import LocalControlPlane
        from ungater_devtools.devcluster.process import ControlPlaneStartError
    except ImportError as exc:  # e.g. `cryptography` missing from a partial install
        missing = str(exc)
    else:
        missing = ""
    if missing:
        _unavailable(
            f"cannot import the control plane ({missing}); "
            "install ungater-devtools (`pip install -e devtools`)"
        )

    capture: Any = request.config.pluginmanager.getplugin("capturemanager")
    reporter: Any = request.config.pluginmanager.getplugin("terminalreporter")

    def say(message: str) -> None:
        if reporter is not None:
            reporter.write_line(f"[ungater control plane] {message}")

    binaries = _built_or_reused(
        "the control plane",
        find_binaries,
        ensure_binaries,
        ControlPlaneUnavailable,
        mode,
        say,
        capture,
    )
    peer_options: dict[str, Any] = {}
    if peers:
        from ungater_devtools.devcluster.peerbuild import (
            PeersUnavailable,
            ensure_peers,
            find_peers,
            select_peers,
        )

        try:
            chosen = select_peers(kueue_version, log=say)
        except (PeersUnavailable, ValueError) as exc:
            _unavailable(str(exc))
        peer_options["binaries"] = _built_or_reused(
            "the peers",
            partial(find_peers, chosen),
            partial(ensure_peers, chosen),
            PeersUnavailable,
            mode,
            say,
            capture,
        )

    plane = LocalControlPlane(binaries, peers=peers, peer_options=peer_options)
    reason: str | None = None
    failure: str | None = None
    try:
        plane.start()
    except ControlPlaneUnavailable as exc:
        reason = str(exc)
    except ControlPlaneStartError as exc:
        failure = str(exc)
    if reason is not None:
        _unavailable(reason)
    if failure is not None:
        pytest.fail(f"local control plane did not start: {failure}", pytrace=False)
    if peers:
        from ungater_devtools.kueue_objects import create_default_flavor

        create_default_flavor(plane)
        if plane.peers is not None:
            timings = ", ".join(f"{k} {v}s" for k, v in plane.peers.seconds.items())
            with _uncaptured(capture):
                say(
                    f"peers {', '.join(plane.peers.names)} (Kueue {plane.peers.kueue_version}) "
                    f"up (seconds since start: {timings})"
                )
    _ACTIVE.append(plane)
    try:
        yield plane
    finally:
        _ACTIVE.remove(plane)
        plane.stop()


def _uncaptured(capture: Any) -> AbstractContextManager[object]:
    """Past pytest's capture, so that a long build's progress shows while it runs."""
    return capture.global_and_fixture_disabled() if capture is not None else nullcontext()


def _built_or_reused(
    what: str,
    find: Callable[[], T | None],
    ensure: Callable[..., T],
    unavailable: type[Exception],
    mode: str,
    say: Callable[[str], None],
    capture: Any,
) -> T:
    """The cached build of ``what``, else a new one (progress shown past the capture); under
    ``UNGATER_CONTROL_PLANE=reuse`` outside CI never a build. Skips or fails (CI) the test
    when it cannot be had. One function for the control plane's binaries and the peers'."""
    found = find()
    if found is not None:
        return found
    if mode == "reuse" and not in_ci():
        _unavailable(f"UNGATER_CONTROL_PLANE=reuse and no cached build of {what}")
    try:
        with _uncaptured(capture):
            return ensure(log=say)
    except unavailable as exc:
        _unavailable(str(exc))


def _namespace_name(node_name: str) -> str:
    stem = re.sub(r"[^a-z0-9-]+", "-", node_name.lower()).strip("-")[:40].strip("-")
    return f"t-{stem or 'test'}-{secrets.token_hex(3)}"


def _fresh_namespace(plane: LocalControlPlane, request: pytest.FixtureRequest) -> Iterator[str]:
    name = _namespace_name(request.node.name)
    status, body = plane.request(
        "POST",
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
    )
    if status != 201:
        pytest.fail(f"creating namespace {name}: HTTP {status}: {body}", pytrace=False)
    try:
        yield name
    finally:
        plane.request("DELETE", f"/api/v1/namespaces/{name}")


@pytest.fixture
def kube_namespace(
    control_plane: LocalControlPlane, request: pytest.FixtureRequest
) -> Iterator[str]:
    """A fresh namespace (its name) for one test, deleted afterwards."""
    yield from _fresh_namespace(control_plane, request)


@pytest.fixture
def breakable_namespace(
    breakable_plane: LocalControlPlane, request: pytest.FixtureRequest
) -> Iterator[str]:
    """A fresh namespace on ``breakable_plane``, deleted afterwards."""
    yield from _fresh_namespace(breakable_plane, request)


@pytest.fixture
def kueue_namespace(
    kueue_cluster: LocalControlPlane, request: pytest.FixtureRequest
) -> Iterator[str]:
    """A fresh namespace on the Kueue cluster with a LocalQueue ``user-queue`` pointing at a
    ClusterQueue of its own (6 CPUs of ``default-flavor`` unless the test is marked
    ``@pytest.mark.kueue_quota(cpu=N)``); all three are deleted afterwards."""
    from ungater_devtools.kueue_objects import create_queues, delete_queues

    marker = request.node.get_closest_marker("kueue_quota")
    cpu = int(marker.kwargs.get("cpu", 6)) if marker is not None else 6
    name = _namespace_name(request.node.name)
    status, body = kueue_cluster.request(
        "POST",
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
    )
    if status != 201:
        pytest.fail(f"creating namespace {name}: HTTP {status}: {body}", pytrace=False)
    try:
        create_queues(kueue_cluster, name, cluster_queue=f"cq-{name}", cpu=cpu)
        yield name
    finally:
        kueue_cluster.request("DELETE", f"/api/v1/namespaces/{name}")
        delete_queues(kueue_cluster, name, cluster_queue=f"cq-{name}")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "kueue_quota(cpu=N): the CPU quota of kueue_namespace's ClusterQueue"
    )
    config.addinivalue_line(
        "markers", "kueue_version(v): the Kueue version kueue_cluster runs for this test"
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    """Point a failed test that used the control plane at the process logs."""
    outcome = yield
    report = outcome.get_result()
    names = getattr(item, "fixturenames", ())
    planes = {"control_plane", "breakable_plane", "kueue_cluster"}
    if report.failed and _ACTIVE and planes.intersection(names):
        report.sections.append(
            ("ungater control plane logs", "\n".join(p.describe_failure() for p in _ACTIVE))
        )
