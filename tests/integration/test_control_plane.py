"""The local control plane is real: pinned versions, upstream CRDs, the Job controller at work.

These tests pin down what the ungater integration tests rely on: kube-apiserver reports the
pinned Kubernetes version, the Kueue Workload CRD serves both v1beta2 and v1beta1, the JobSet
and RayCluster CRDs are established, and kube-controller-manager's Job controller creates
gated pods for an Indexed Job and adds one when parallelism grows.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

from ungater_devtools.devcluster import versions
from ungater_devtools.devcluster.environment import LocalControlPlane

pytestmark = pytest.mark.integration

GATE = "kueue.x-k8s.io/elastic-job"
CRD_BASE = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
DEADLINE_S = 60.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _crd(control_plane: LocalControlPlane, name: str) -> dict[str, Any]:
    status, body = control_plane.request("GET", f"{CRD_BASE}/{name}")
    assert status == 200, body
    assert isinstance(body, dict)
    return body


def _established(crd: dict[str, Any]) -> bool:
    return any(
        c["type"] == "Established" and c["status"] == "True"
        for c in crd.get("status", {}).get("conditions", [])
    )


def test_version_reports_the_pinned_kubernetes(control_plane: LocalControlPlane) -> None:
    status, body = control_plane.request("GET", "/version")
    assert status == 200
    assert body["gitVersion"] == versions.KUBERNETES_VERSION
    major, minor = versions.KUBERNETES_VERSION.lstrip("v").split(".")[:2]
    assert (body["major"], body["minor"]) == (major, minor)
    assert body["gitTreeState"] == "clean"


def test_workload_crd_serves_v1beta2_and_v1beta1(control_plane: LocalControlPlane) -> None:
    crd = _crd(control_plane, "workloads.kueue.x-k8s.io")
    assert _established(crd)
    served = {v["name"]: (v["served"], v["storage"]) for v in crd["spec"]["versions"]}
    assert served["v1beta2"][0] and served["v1beta1"][0], served
    for version in ("v1beta2", "v1beta1"):
        status, discovery = control_plane.request("GET", f"/apis/kueue.x-k8s.io/{version}")
        assert status == 200, discovery
        names = {r["name"] for r in discovery["resources"]}
        assert {"workloads", "workloads/status"} <= names


@pytest.mark.parametrize(
    ("name", "group", "version", "plural"),
    [
        ("jobsets.jobset.x-k8s.io", "jobset.x-k8s.io", "v1alpha2", "jobsets"),
        ("rayclusters.ray.io", "ray.io", "v1", "rayclusters"),
    ],
)
def test_jobset_and_raycluster_crds_are_established(
    control_plane: LocalControlPlane, name: str, group: str, version: str, plural: str
) -> None:
    crd = _crd(control_plane, name)
    assert _established(crd)
    status, discovery = control_plane.request("GET", f"/apis/{group}/{version}")
    assert status == 200, discovery
    assert plural in {r["name"] for r in discovery["resources"]}


def test_installing_the_crds_again_replaces_them(control_plane: LocalControlPlane) -> None:
    from ungater_devtools.devcluster.build import ensure_crds

    names = control_plane.install_crds(ensure_crds())
    assert sorted(names) == [
        "jobsets.jobset.x-k8s.io",
        "rayclusters.ray.io",
        "workloads.kueue.x-k8s.io",
    ]


def test_user_kubeconfig_is_subject_to_rbac(control_plane: LocalControlPlane) -> None:
    import base64
    import http.client
    import ssl
    import tempfile

    import yaml

    path = control_plane.make_user_kubeconfig("alice", ["team-a"])
    config = yaml.safe_load(path.read_text())
    user = config["users"][0]["user"]
    with tempfile.TemporaryDirectory() as tmp:
        cert, key = f"{tmp}/c.crt", f"{tmp}/c.key"
        with open(cert, "wb") as fh:
            fh.write(base64.b64decode(user["client-certificate-data"]))
        with open(key, "wb") as fh:
            fh.write(base64.b64decode(user["client-key-data"]))
        context = ssl.create_default_context(cafile=str(control_plane.ca_path))
        context.load_cert_chain(cert, key)
        conn = http.client.HTTPSConnection(
            "127.0.0.1", control_plane.apiserver_port, timeout=10, context=context
        )
        try:
            conn.request("GET", "/api/v1/namespaces/default/pods")
            response = conn.getresponse()
            body = response.read().decode()
        finally:
            conn.close()
    assert response.status == 403, body
    assert 'User "alice" cannot list resource "pods"' in json.loads(body)["message"]


async def _eventually(
    probe: Callable[[], Awaitable[Any]],
    done: Callable[[Any], bool],
    what: str,
    *,
    deadline_s: float = DEADLINE_S,
) -> Any:
    deadline = time.monotonic() + deadline_s
    last: Any = None
    for _ in range(int(deadline_s / 0.2) + 1):
        last = await probe()
        if done(last):
            return last
        if time.monotonic() > deadline:
            break
        await anyio.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}; last seen: {last!r}")


def _indexed_job(name: str, *, parallelism: int, completions: int) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "parallelism": parallelism,
            "completions": completions,
            "completionMode": "Indexed",
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "schedulingGates": [{"name": GATE}],
                    "containers": [{"name": "main", "image": "ungater-test-never-pulled"}],
                }
            },
        },
    }


@pytest.mark.anyio
@pytest.mark.parametrize("elastic_indexed", [False, True], ids=["parallelism", "elastic-indexed"])
async def test_job_controller_creates_gated_pods_and_scales_up(
    control_plane: LocalControlPlane, kube_namespace: str, elastic_indexed: bool
) -> None:
    from kubernetes_asyncio import client, config

    api_client = await config.new_client_from_config(config_file=str(control_plane.kubeconfig_path))
    async with api_client:
        batch: Any = client.BatchV1Api(api_client)
        core = client.CoreV1Api(api_client)
        name = "elastic"
        completions = 2 if elastic_indexed else 4
        await batch.create_namespaced_job(
            kube_namespace, _indexed_job(name, parallelism=2, completions=completions)
        )

        async def pods() -> list[Any]:
            listed = await core.list_namespaced_pod(
                kube_namespace, label_selector=f"batch.kubernetes.io/job-name={name}"
            )
            return [p for p in listed.items if p.metadata.deletion_timestamp is None]

        created = await _eventually(pods, lambda ps: len(ps) >= 2, "2 pods of the Job")
        assert len(created) == 2
        for pod in created:
            assert [g.name for g in pod.spec.scheduling_gates or []] == [GATE]
            assert pod.status.phase == "Pending"
        indexes = sorted(
            p.metadata.annotations["batch.kubernetes.io/job-completion-index"] for p in created
        )
        assert indexes == ["0", "1"]

        spec: dict[str, Any] = {"parallelism": 3}
        if elastic_indexed:
            spec["completions"] = 3
        await batch.patch_namespaced_job(
            name,
            kube_namespace,
            {"spec": spec},
            _content_type="application/merge-patch+json",
        )
        grown = await _eventually(pods, lambda ps: len(ps) >= 3, "a third pod after scale-up")
        assert len(grown) == 3
        assert all([g.name for g in p.spec.scheduling_gates or []] == [GATE] for p in grown)
        assert sorted(
            p.metadata.annotations["batch.kubernetes.io/job-completion-index"] for p in grown
        ) == ["0", "1", "2"]


def test_apiserver_restart_keeps_state_in_etcd(
    breakable_plane: LocalControlPlane, breakable_namespace: str
) -> None:
    plane = breakable_plane
    path = f"/api/v1/namespaces/{breakable_namespace}/configmaps"
    body = {"metadata": {"name": "survivor"}, "data": {"k": "v"}}
    status, created = plane.request("POST", path, body)
    assert status == 201, created
    plane.kill_apiserver()
    with pytest.raises(OSError):
        plane.request("GET", "/readyz", timeout=2)
    plane.start_apiserver()
    status, read = plane.request("GET", f"{path}/survivor")
    assert status == 200, read
    assert read["data"] == {"k": "v"}
