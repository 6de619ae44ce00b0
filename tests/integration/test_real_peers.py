"""The peers as deployed: each runs as its own service account with its upstream RBAC, and
their webhooks are registered by URL on loopback."""

from __future__ import annotations

import http.client
import json
import ssl
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.integration

KUEUE_SA = "system:serviceaccount:kueue-system:kueue-controller-manager"


def whoami(plane: Any, peer: str) -> str:
    """The user name the API server sees for a peer's own kubeconfig (a token)."""
    config = yaml.safe_load(plane.peers.kubeconfigs[peer].read_text())
    token = config["users"][0]["user"]["token"]
    context = ssl.create_default_context(cafile=str(plane.ca_path))
    conn = http.client.HTTPSConnection("127.0.0.1", plane.apiserver_port, context=context)
    try:
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        conn.request(
            "POST",
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            body=json.dumps(body),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        reply = json.loads(conn.getresponse().read())
    finally:
        conn.close()
    return str(reply["status"]["userInfo"]["username"])


def allowed(
    plane: Any, user: str, verb: str, resource: str, group: str = "", sub: str = ""
) -> bool:
    status, body = plane.request(
        "POST",
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user,
                "groups": ["system:serviceaccounts", "system:authenticated"],
                "resourceAttributes": {
                    "verb": verb,
                    "group": group,
                    "resource": resource,
                    "subresource": sub,
                    "namespace": "default",
                },
            },
        },
    )
    assert status == 201, body
    return bool(body["status"].get("allowed"))


def test_each_peer_runs_as_its_own_service_account(kueue_cluster: Any) -> None:
    peers = kueue_cluster.peers
    assert set(peers.names) == {"kueue", "kuberay", "jobset"}
    assert whoami(kueue_cluster, "kueue") == KUEUE_SA
    assert whoami(kueue_cluster, "jobset") == (
        "system:serviceaccount:jobset-system:jobset-controller-manager"
    )
    assert whoami(kueue_cluster, "kuberay") == (
        "system:serviceaccount:kuberay-system:kuberay-operator"
    )
    assert all(name in kueue_cluster.pids for name in peers.names)


def test_kueue_has_its_upstream_rbac_and_no_more(kueue_cluster: Any) -> None:
    assert allowed(kueue_cluster, KUEUE_SA, "patch", "pods")
    assert allowed(kueue_cluster, KUEUE_SA, "update", "workloads", "kueue.x-k8s.io", "status")
    assert allowed(kueue_cluster, KUEUE_SA, "update", "jobs", "batch")
    assert not allowed(kueue_cluster, KUEUE_SA, "delete", "namespaces")
    assert not allowed(
        kueue_cluster, KUEUE_SA, "create", "clusterrolebindings", "rbac.authorization.k8s.io"
    )


def test_webhooks_are_served_on_loopback_with_the_cluster_ca(kueue_cluster: Any) -> None:
    for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        status, body = kueue_cluster.request("GET", f"/apis/admissionregistration.k8s.io/v1/{kind}")
        assert status == 200
        names = {c["metadata"]["name"] for c in body["items"]}
        for config in body["items"]:
            for hook in config["webhooks"]:
                assert hook["clientConfig"]["url"].startswith("https://127.0.0.1:")
                assert hook["clientConfig"]["caBundle"]
        prefix = "mutating" if kind.startswith("mutating") else "validating"
        assert f"kueue-{prefix}-webhook-configuration" in names
        assert f"jobset-{prefix}-webhook-configuration" in names
    status, crd = kueue_cluster.request(
        "GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/workloads.kueue.x-k8s.io"
    )
    assert crd["spec"]["conversion"]["strategy"] == "Webhook"


def test_a_peer_lives_and_dies_with_its_control_plane(control_plane: Any) -> None:
    """A plane of its own with one peer: stop() ends every process by pid, the peer first."""
    from ungater_devtools.devcluster.environment import LocalControlPlane

    plane = LocalControlPlane(control_plane.binaries, peers=("jobset",))
    try:
        plane.start()
        pids = plane.pids
        assert list(pids) == ["etcd", "kube-apiserver", "kube-controller-manager", "jobset"]
        assert plane.peers is not None and plane.peers.integrations == (
            "batch/job",
            "jobset.x-k8s.io/jobset",
        )
    finally:
        plane.stop()
    for pid in pids.values():
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue  # gone
        assert stat.rsplit(")", 1)[-1].split()[0] == "Z", f"pid {pid} still runs"


def test_kueue_runs_the_version_asked_for_with_the_webhooks_of_its_own_tree(
    kueue_cluster: Any,
) -> None:
    """The binary and its manifests come from the same tree: Kueue reports the pinned version,
    and from v0.19 its webhook kustomization copies the pod webhook's namespace selector onto
    every job webhook (``replacements``), while v0.17 leaves the job webhooks unselected."""
    version = kueue_cluster.peers.kueue_version
    log = (kueue_cluster.logs_dir / "kueue.log").read_text(errors="replace")
    assert any("Initializing" in line and version in line for line in log.splitlines())
    hooks: dict[str, Any] = {}
    for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        status, body = kueue_cluster.request("GET", f"/apis/admissionregistration.k8s.io/v1/{kind}")
        assert status == 200
        for config in body["items"]:
            if config["metadata"]["name"].startswith("kueue-"):
                hooks.update({h["name"]: h for h in config["webhooks"]})
    pod_selector = hooks["vpod.kb.io"]["namespaceSelector"]
    assert pod_selector["matchExpressions"][0]["values"] == ["kube-system", "kueue-system"]
    job_hooks = ("mjob.kb.io", "vjob.kb.io", "mraycluster.kb.io", "vjobset.kb.io")
    if version.startswith("v0.19."):
        assert all(hooks[h]["namespaceSelector"] == pod_selector for h in job_hooks)
    else:
        assert all(not hooks[h]["namespaceSelector"] for h in job_hooks)
