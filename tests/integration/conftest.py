"""Fixtures of the integration tests: an async client on the real API server, the controller
running in-process against it (the helpers they use are in support.py), helm and an admin
client for the chart tests (helpers in deploy.py), and the hook that marks every test here
``integration``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.integration.deploy import Admin, helm_for_tests
from tests.integration.isolation import CLUSTER_SCOPED, KUEUE_SCOPED, cluster_objects, leaks
from tests.integration.k8s import Kube
from tests.integration.support import config_for, running_controller

_HERE = Path(__file__).parent


@pytest.hookimpl(tryfirst=True)  # before the -m deselection reads the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test under tests/integration ``integration`` (a ``pytestmark`` in a conftest
    applies to nothing), so ``-m "not integration"`` leaves them all out."""
    for item in items:
        if item.path.is_relative_to(_HERE):
            item.add_marker(pytest.mark.integration)
        version = item.get_closest_marker("kueue_version")
        if version is not None:  # under `-n --dist loadgroup`: one worker starts this Kueue
            item.add_marker(pytest.mark.xdist_group(f"kueue-{version.args[0]}"))


@pytest.fixture(autouse=True)
def leaves_no_cluster_objects(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that leaves a cluster-scoped object on a shared plane (isolation.py).

    Autouse, so set up before and torn down after the test's own fixtures: the namespaces
    they delete are gone (or going) when this looks."""
    planes: list[tuple[Any, tuple[str, ...]]] = []
    # breakable_plane is control_plane, or (under $UNGATER_TEST_PLANES) a plane of the test's
    # own, which pytest stops after this fixture's teardown, having started it during its setup
    for fixture, paths in (
        ("control_plane", CLUSTER_SCOPED),
        ("breakable_plane", CLUSTER_SCOPED),
        ("kueue_cluster", CLUSTER_SCOPED + KUEUE_SCOPED),
    ):
        if fixture in request.fixturenames:
            plane = request.getfixturevalue(fixture)
            if all(plane is not seen for seen, _ in planes):
                planes.append((plane, paths))
    before = [cluster_objects(plane, paths) for plane, paths in planes]
    yield
    left = [
        f"{name} (on {plane.server_url})"
        for (plane, paths), had in zip(planes, before, strict=True)
        for name in leaks(had, cluster_objects(plane, paths))
    ]
    if left:
        pytest.fail("the test left cluster-scoped objects behind:\n" + "\n".join(left))


@asynccontextmanager
async def _connected(plane: Any) -> AsyncIterator[Kube]:
    """An admin client on ``plane``, closed when the block ends."""
    k = await Kube.connect(plane.kubeconfig_path)
    try:
        yield k
    finally:
        await k.close()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def kube(control_plane: Any) -> AsyncIterator[Kube]:
    async with _connected(control_plane) as k:
        yield k


@pytest.fixture
def controller(control_plane: Any, kube_namespace: str) -> Callable[..., Any]:
    def start(**overrides: Any) -> Any:
        return running_controller(
            control_plane.kubeconfig_path, config_for(kube_namespace, **overrides)
        )

    return start


@pytest.fixture
async def breakable_kube(breakable_plane: Any) -> AsyncIterator[Kube]:
    """``kube`` on ``breakable_plane``: for a test that kills or restarts the API server."""
    async with _connected(breakable_plane) as k:
        yield k


@pytest.fixture
async def kueue_kube(kueue_cluster: Any) -> AsyncIterator[Kube]:
    """An admin client on the control plane that runs the real Kueue, KubeRay and JobSet."""
    async with _connected(kueue_cluster) as k:
        yield k


@pytest.fixture(scope="module")
def helm(request: pytest.FixtureRequest) -> Path:
    """The helm binary, or a failure (CI) or a skip that says why."""
    return helm_for_tests(request.config)


@pytest.fixture
def admin(control_plane: Any) -> Admin:
    return Admin(control_plane)
