"""The integration suite's autouse fixture (``tests/integration/conftest.py``) fails a test that
leaves a cluster-scoped object on the shared plane, and passes one that cleans up.

An inner pytest session runs the integration conftest with ``control_plane`` replaced by an
in-memory plane that answers the list requests the fixture sends.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.isolation import CLUSTER_SCOPED, RETRIES, cluster_objects, leaks

CONFTEST = Path(__file__).parents[2] / "integration" / "conftest.py"

INNER = """
import pytest


class MemoryPlane:
    server_url = "https://127.0.0.1:1"

    def __init__(self):
        self.objects = {}  # list path -> {name: metadata}

    def request(self, method, path, body=None, *, accept="application/json"):
        if method == "GET":
            items = [{"metadata": m} for m in self.objects.get(path, {}).values()]
            return 200, {"items": items}
        collection, _, name = path.rpartition("/")
        if method == "POST":
            self.objects.setdefault(path, {})[body["metadata"]["name"]] = dict(body["metadata"])
            return 201, body
        if method == "DELETE":
            self.objects.get(collection, {}).pop(name, None)
            return 200, {}
        if method == "MARK-DELETED":
            self.objects[collection][name]["deletionTimestamp"] = "2026-12-06T00:00:00Z"
            return 200, {}
        return 405, {}


PLANE = MemoryPlane()
ROLES = "/apis/rbac.authorization.k8s.io/v1/clusterroles"
NAMESPACES = "/api/v1/namespaces"


@pytest.fixture
def control_plane():
    return PLANE


def test_leaves_a_cluster_role(control_plane):
    control_plane.request("POST", ROLES, {"metadata": {"name": "left-behind"}})


def test_cleans_up(control_plane):
    control_plane.request("POST", ROLES, {"metadata": {"name": "tidy"}})
    control_plane.request("DELETE", ROLES + "/tidy")


def test_namespace_being_deleted_is_not_a_leak(control_plane):
    control_plane.request("POST", NAMESPACES, {"metadata": {"name": "going"}})
    control_plane.request("MARK-DELETED", NAMESPACES + "/going")


def test_namespace_left_alive(control_plane):
    control_plane.request("POST", NAMESPACES, {"metadata": {"name": "staying"}})
"""


def test_a_test_that_leaves_a_cluster_object_fails_and_a_tidy_one_passes(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(INNER)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=4, errors=2)  # the check fails in teardown: an error each
    out = result.stdout.str()
    assert "clusterroles/left-behind" in out
    assert "namespaces/staying" in out
    assert "clusterroles/tidy" not in out
    assert "namespaces/going" not in out


class ListOnly:
    """Answers list requests from a fixed table; 404 for a kind it does not serve."""

    def __init__(self, served: dict[str, list[dict[str, object]]]) -> None:
        self.served = served
        self.accepts: list[str] = []

    def request(self, method: str, path: str, body: object = None, *, accept: str = "") -> tuple:
        self.accepts.append(accept)
        if path not in self.served:
            return 404, {}
        items = [{"metadata": m} for m in self.served[path]]
        return 200, {"items": items or None}  # as the real API server lists an empty kind


def test_cluster_objects_names_kind_and_object_and_asks_for_metadata_only() -> None:
    plane = ListOnly(
        {
            CLUSTER_SCOPED[0]: [],
            CLUSTER_SCOPED[1]: [{"name": "a"}, {"name": "b", "deletionTimestamp": "x"}],
        }
    )
    found = cluster_objects(plane, CLUSTER_SCOPED)
    assert found == {"clusterroles/a"}
    assert all("PartialObjectMetadataList" in a for a in plane.accepts)
    assert leaks({"clusterroles/a"}, found | {"namespaces/n"}) == ["namespaces/n"]


def test_cluster_objects_fails_on_an_error_rather_than_seeing_nothing() -> None:
    class Refusing(ListOnly):
        def request(self, method: str, path: str, body: object = None, *, accept: str = ""):
            return 403, {"message": "forbidden"}

    with pytest.raises(RuntimeError, match="HTTP 403"):
        cluster_objects(Refusing({}), CLUSTER_SCOPED)


def test_cluster_objects_asks_again_while_a_kinds_storage_is_initializing() -> None:
    class Initializing(ListOnly):
        def __init__(self) -> None:
            super().__init__({CLUSTER_SCOPED[1]: [{"name": "a"}]})
            self.refusals = 3

        def request(self, method: str, path: str, body: object = None, *, accept: str = ""):
            if path == CLUSTER_SCOPED[1] and self.refusals:
                self.refusals -= 1
                return 429, {"message": "storage is (re)initializing"}
            return super().request(method, path, body, accept=accept)

    slept: list[float] = []
    assert cluster_objects(Initializing(), CLUSTER_SCOPED, slept.append) == {"clusterroles/a"}
    assert len(slept) == 3


def test_cluster_objects_gives_up_on_a_429_that_never_ends() -> None:
    class Always(ListOnly):
        def request(self, method: str, path: str, body: object = None, *, accept: str = ""):
            return 429, {"message": "storage is (re)initializing"}

    slept: list[float] = []
    with pytest.raises(RuntimeError, match="HTTP 429"):
        cluster_objects(Always({}), CLUSTER_SCOPED, slept.append)
    assert len(slept) == RETRIES
