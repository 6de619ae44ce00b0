"""The deploy files against the real API server: the Helm chart (``helm lint``, ``helm
template``) and the plain manifests pass a strict server-side dry run, and the chart's RBAC,
applied for real and bound to a client-certificate user, is enough to run the controller through
a release and too little to delete pods or read secrets.

helm is built from its Go module (``ungater_devtools.devcluster.helm``). When it cannot be had,
the chart tests fail under ``CI=true`` (as the control plane does: a CI that silently skips the
chart checks is worse than a red one); elsewhere they skip with the reason, and the RBAC tests
take the roles from the committed plain manifests instead, which the chart tests otherwise
prove equal to the chart's output.
"""

from __future__ import annotations

import copy
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.integration.deploy import Admin, rbac_source, render
from tests.integration.jobs import make_job, released_indexes
from tests.integration.k8s import Kube
from tests.integration.monitor import monitoring
from tests.integration.support import admit, create_workload, running_controller
from tests.objects import PODS, WORKLOADS
from tests.polling import equals, eventually, holds_for
from tests.unit.deploy.deploy_checks import (
    CHART,
    CLUSTER_RULES,
    NAMESPACE,
    assert_least_privilege,
    by_kind,
    check_deployment,
    check_rbac,
    leader_election_rules,
    lease_name,
    load_documents,
    one,
    plain_objects,
    rendered_config,
)
from ungater._kube.adapter import ApiClientKube, connect
from ungater._kube.client import ApiError, Resource
from ungater._model.config import Config
from ungater_devtools.devcluster import helm as helm_tool
from ungater_devtools.devcluster.versions import KUBERNETES_VERSION

pytestmark = pytest.mark.integration

RBAC = "rbac.authorization.k8s.io"
CLUSTER_ROLES = Resource(RBAC, "v1", "clusterroles", "ClusterRole", namespaced=False)
CLUSTER_ROLE_BINDINGS = Resource(
    RBAC, "v1", "clusterrolebindings", "ClusterRoleBinding", namespaced=False
)
ROLES = Resource(RBAC, "v1", "roles", "Role")
ROLE_BINDINGS = Resource(RBAC, "v1", "rolebindings", "RoleBinding")
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease")
SECRETS = Resource("", "v1", "secrets", "Secret")
JOBS = Resource("batch", "v1", "jobs", "Job")
ACCESS_REVIEWS = Resource(
    "authorization.k8s.io",
    "v1",
    "selfsubjectaccessreviews",
    "SelfSubjectAccessReview",
    namespaced=False,
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# -- helm -------------------------------------------------------------------------------------


def test_helm_lint_passes_and_rejects_unsafe_values(helm: Path) -> None:
    for values in (None, {"config": {"namespaces": ["team-a", "team-b"]}}):
        proc = helm_tool.run_helm(helm, ["lint", "--strict", str(CHART)], values=values)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    bad = {  # what: (values, a fragment of helm's error)
        "an unknown config key": ({"config": {"namespace": "typo"}}, "'namespace' not allowed"),
        "two replicas without leader election": (
            {"config": {"leaderElection": {"enabled": False}}},
            "needs config.leaderElection.enabled",
        ),
        "namespaced RBAC with all namespaces": (
            {"rbac": {"scope": "namespaced"}},
            "rbac.scope=namespaced needs config.namespaces",
        ),
        "a renew deadline not below the lease duration": (
            {
                "config": {
                    "leaderElection": {"leaseDurationSeconds": 10, "renewDeadlineSeconds": 10}
                }
            },
            "must be less than leaseDurationSeconds",
        ),
        "a renew deadline within 1.2 retries": (
            {"config": {"leaderElection": {"renewDeadlineSeconds": 2.4, "retryPeriodSeconds": 2}}},
            "must exceed 1.2 x retryPeriodSeconds",
        ),
        "a loopback server address the probes cannot reach": (
            {"config": {"server": {"address": "127.0.0.1:8080"}}},
            "is a loopback address",
        ),
        "a server address without a port": (
            {"config": {"server": {"address": "localhost"}}},
            "/config/server/address",
        ),
    }
    for what, (values, error) in bad.items():
        proc = helm_tool.run_helm(
            helm, ["template", "x", str(CHART), "--kube-version", KUBERNETES_VERSION], values=values
        )
        assert proc.returncode != 0, f"helm template accepted {what}:\n{proc.stdout}"
        assert error in proc.stderr, f"{what}: {proc.stderr}"


def _key(obj: dict[str, Any]) -> tuple[str, str, str]:
    meta = obj["metadata"]
    return (obj["kind"], meta.get("namespace", ""), meta["name"])


def test_plain_manifests_are_the_chart_rendered(helm: Path) -> None:
    """deploy/manifests is `helm template` output: same objects, same RBAC rules."""
    fresh = helm_tool.render_plain_manifests(helm, CHART, KUBERNETES_VERSION)
    chart = {_key(o): o for o in load_documents(fresh.values())}
    plain = {_key(o): o for o in plain_objects()}
    regen = "run `python -m ungater_devtools.devcluster.helm render-manifests` and commit deploy/manifests"
    for kind in ("ClusterRole", "Role"):
        assert [o["rules"] for o in by_kind(chart.values(), kind)] == [
            o["rules"] for o in by_kind(plain.values(), kind)
        ], f"{kind} rules differ between the chart and deploy/manifests; {regen}"
    assert sorted(chart) == sorted(plain), regen
    for key, obj in chart.items():
        assert plain[key] == obj, f"{key} differs; {regen}"
    manifests = Path(CHART).parents[1] / "manifests"
    assert sorted(p.name for p in manifests.glob("*.yaml")) == sorted(fresh), regen


def test_chart_rbac_and_deployment_hold_for_both_scopes(helm: Path) -> None:
    cluster = render(helm)
    check_rbac(cluster)
    check_deployment(cluster)
    assert_least_privilege(one(cluster, "ClusterRole"), CLUSTER_RULES)
    namespaced = render(helm, config={"namespaces": ["team-a", "team-b"]})
    check_rbac(namespaced)
    check_deployment(namespaced)
    other = render(helm, namespace="ops", config={"leaderElection": {"leaseName": "ug-lease"}})
    check_rbac(other, namespace="ops")
    assert_least_privilege(one(other, "Role"), leader_election_rules("ug-lease"))


def test_chart_derives_the_lease_name_as_the_controller_does(helm: Path) -> None:
    """The chart's default Lease (kube-system, a name from the gates) is the one `ungater run`
    finds with the same config anywhere, so a laptop and the Deployment never both lead."""
    cases: list[dict[str, Any]] = [
        {},
        {"gate": "example.com/hold"},
        {"kinds": [{"group": "batch", "kind": "Job", "gate": "b.example/two"}]},
        {
            "gate": "a.example/one",
            "kinds": [
                {"group": "batch", "kind": "Job", "gate": "b.example/two"},
                {"group": "ray.io", "kind": "RayCluster"},
            ],
        },
    ]
    for config in cases:
        objects = render(helm, namespace="ops", config=config)
        expected = Config.model_validate(config)
        assert lease_name(objects) == expected.lease_name, config
        assert one(objects, "Role")["metadata"]["namespace"] == "kube-system"
        assert rendered_config(objects)["leaderElection"]["namespace"] == "kube-system"
    assert len({Config.model_validate(c).lease_name for c in cases}) == len(cases)


# -- server-side dry run --------------------------------------------------------------------


def dry_run_all(admin: Admin, objects: list[dict[str, Any]]) -> None:
    """Dry-run the Namespace, create it for real, then dry-run everything in it."""
    namespaces = by_kind(objects, "Namespace")
    for ns in namespaces:
        admin.wait_absent(ns["metadata"]["name"])
        admin.dry_run(ns)
    created = []
    try:
        for ns in namespaces:
            admin.create_namespace(ns["metadata"]["name"], ns["metadata"].get("labels"))
            created.append(ns["metadata"]["name"])
        for obj in objects:
            if obj["kind"] != "Namespace":
                admin.dry_run(obj)
    finally:
        for name in created:
            admin.delete_namespace(name)


def test_plain_manifests_pass_a_strict_server_side_dry_run(admin: Admin) -> None:
    objects = plain_objects()
    assert one(objects, "Namespace")["metadata"]["name"] == NAMESPACE
    dry_run_all(admin, objects)


def test_chart_objects_pass_a_strict_server_side_dry_run(
    admin: Admin, helm: Path, kube_namespace: str
) -> None:
    dry_run_all(admin, render(helm, f"ungater-{secrets.token_hex(3)}", createNamespace=True))
    # namespaced RBAC: RoleBindings in each watched namespace (here: the test's)
    ns = f"ungater-{secrets.token_hex(3)}"
    objects = render(helm, ns, createNamespace=True, config={"namespaces": [kube_namespace]})
    bindings = [b for b in by_kind(objects, "RoleBinding") if b["roleRef"]["kind"] == "ClusterRole"]
    assert [b["metadata"]["namespace"] for b in bindings] == [kube_namespace]
    dry_run_all(admin, objects)


# -- the chart's RBAC, for real ----------------------------------------------------------------


@asynccontextmanager
async def bound_user(
    control_plane: Any,
    kube: Kube,
    objects: list[dict[str, Any]],
    namespace: str,
    *,
    cluster_wide: bool,
) -> AsyncIterator[tuple[Path, ApiClientKube, str]]:
    """The chart's ClusterRole and leader-election Role, applied (renamed, the Role moved to
    ``namespace``) and bound to a fresh client-certificate user: its kubeconfig and a client.

    ``cluster_wide``: a ClusterRoleBinding, as the chart renders for all namespaces; else a
    RoleBinding in ``namespace``, as it renders for ``config.namespaces``."""
    suffix = secrets.token_hex(3)
    user = f"ungater-test-user-{suffix}"
    cluster_role = copy.deepcopy(one(objects, "ClusterRole"))
    role = copy.deepcopy(one(objects, "Role"))
    cr_name = f"ungater-test-{suffix}"
    cluster_role["metadata"] = {"name": cr_name, "labels": cluster_role["metadata"]["labels"]}
    role["metadata"] = {"name": f"ungater-leader-election-{suffix}", "namespace": namespace}
    subject = [{"apiGroup": RBAC, "kind": "User", "name": user}]
    cleanup: list[tuple[Resource, str]] = []
    try:
        await kube.client.create(CLUSTER_ROLES, None, cluster_role)
        cleanup.append((CLUSTER_ROLES, cr_name))
        await kube.create(ROLES, namespace, role)
        await kube.create(
            ROLE_BINDINGS,
            namespace,
            {
                "apiVersion": f"{RBAC}/v1",
                "kind": "RoleBinding",
                "metadata": {"name": role["metadata"]["name"]},
                "roleRef": {"apiGroup": RBAC, "kind": "Role", "name": role["metadata"]["name"]},
                "subjects": subject,
            },
        )
        ref = {"apiGroup": RBAC, "kind": "ClusterRole", "name": cr_name}
        if cluster_wide:
            body = {
                "apiVersion": f"{RBAC}/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": cr_name},
                "roleRef": ref,
                "subjects": subject,
            }
            await kube.client.create(CLUSTER_ROLE_BINDINGS, None, body)
            cleanup.append((CLUSTER_ROLE_BINDINGS, cr_name))
        else:
            await kube.create(
                ROLE_BINDINGS,
                namespace,
                {
                    "apiVersion": f"{RBAC}/v1",
                    "kind": "RoleBinding",
                    "metadata": {"name": cr_name},
                    "roleRef": ref,
                    "subjects": subject,
                },
            )
        kubeconfig = control_plane.make_user_kubeconfig(user, [])
        client = await connect(kubeconfig, qps=100, burst=100)
        try:
            # RBAC changes reach the authorizer's cache within moments
            await eventually(
                lambda: allowed(client, "list", "", "pods", namespace),
                timeout=10,
                what="the bindings to take effect",
            )
            yield kubeconfig, client, user
        finally:
            await client.close()
    finally:
        for res, name in reversed(cleanup):
            await kube.client.delete(res, None, name)


async def allowed(
    client: ApiClientKube,
    verb: str,
    group: str,
    resource: str,
    namespace: str | None,
    name: str = "",
) -> bool:
    attrs = {"verb": verb, "group": group, "resource": resource}
    if namespace:
        attrs["namespace"] = namespace
    if name:
        attrs["name"] = name
    review = await client.create(
        ACCESS_REVIEWS,
        None,
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attrs},
        },
    )
    return bool((review.get("status") or {}).get("allowed"))


async def assert_denied(what: str, call: Any) -> None:
    with pytest.raises(ApiError) as info:
        await call
    assert info.value.status == 403, f"{what}: expected 403, got {info.value}"


def controller_config(objects: list[dict[str, Any]], namespaces: list[str]) -> Config:
    """The chart's config file, watching ``namespaces``, with the tests' short timeouts.

    Keys ungater._model.config does not know yet (leaderElection, server) are left out: this test
    runs the controller in-process, without its leader election or HTTP server."""
    raw = rendered_config(objects)
    raw["namespaces"] = namespaces
    # the test plays Kueue: ungater is the only releaser (the chart's mode auto would only
    # audit Kueue's gate without the admission policy; test_admission_policy.py covers that)
    assert raw["mode"] == "auto"
    raw["mode"] = "release"
    raw["expectationsTimeoutSeconds"] = 5
    raw["watch"] = {
        **raw.get("watch", {}),
        "backoffInitialSeconds": 0.05,
        "backoffMaxSeconds": 1,
        "silenceSeconds": 30,
    }
    return Config.model_validate(raw)


async def release_scenario(kube: Kube, ns: str, user_kubeconfig: Path, config: Config) -> None:
    """An Indexed Job of 3 gated pods, its Workload admitted for 2: the controller, acting as
    the user, releases exactly indexes 0 and 1."""
    job, sel = await make_job(kube, ns, "deploy", 3)
    await create_workload(kube, job, "job-deploy-a", {"main": 3})
    async with (
        monitoring(kube, ns, sel) as mon,
        running_controller(user_kubeconfig, config) as ctl,
    ):
        await admit(kube, ns, "job-deploy-a", {"main": 2})
        await eventually(
            lambda: equals(released_indexes(kube, ns, sel), [0, 1]),
            timeout=20,
            what="indexes 0 and 1 released by the controller acting as the chart's user",
        )
        await holds_for(lambda: equals(released_indexes(kube, ns, sel), [0, 1]), 1.5)
        assert ctl.stats.patch_errors == 0
        assert ctl.stats.reconcile_errors == 0
    assert mon.max_seen == 2
    assert not mon.violations, mon.violations


async def assert_least_privilege_for_real(
    kube: Kube, client: ApiClientKube, ns: str, lease: str, *, cluster_wide: bool
) -> None:
    """What the user may not do, tried for real (403) and asked (SelfSubjectAccessReview)."""
    pods = await kube.list(PODS, ns)
    assert pods, "the scenario left pods"
    victim = pods[0]["metadata"]["name"]
    await assert_denied("deleting a pod", client.delete(PODS, ns, victim))
    await assert_denied("listing secrets", client.list_objects(SECRETS, ns))
    await assert_denied("reading a secret", client.get(SECRETS, ns, "anything"))
    await assert_denied(
        "creating a pod",
        client.create(
            PODS,
            ns,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "intruder"},
                "spec": {"containers": [{"name": "c", "image": "x"}]},
            },
        ),
    )
    await assert_denied(
        "changing a Workload",
        client.merge_patch(WORKLOADS, ns, "job-deploy-a", {"metadata": {"labels": {"x": "y"}}}),
    )
    await assert_denied(
        "changing a Job",
        client.merge_patch(JOBS, ns, "deploy", {"metadata": {"labels": {"x": "y"}}}),
    )
    assert await kube.get(PODS, ns, victim) is not None, "the pod must still exist"
    for verb, group, resource in (
        ("delete", "", "pods"),
        ("deletecollection", "", "pods"),
        ("create", "", "pods"),
        ("update", "", "pods"),
        ("get", "", "secrets"),
        ("list", "", "secrets"),
        ("get", "", "configmaps"),
        ("update", "kueue.x-k8s.io", "workloads"),
        ("patch", "kueue.x-k8s.io", "workloads"),
        ("delete", "kueue.x-k8s.io", "workloads"),
        ("update", "batch", "jobs"),
        ("patch", "batch", "jobs"),
        ("delete", "batch", "jobs"),
        ("patch", "ray.io", "rayclusters"),
        ("delete", "ray.io", "rayclusters"),
        ("create", "", "pods/exec"),
        ("create", "", "serviceaccounts/token"),
        ("patch", "", "pods/status"),
        ("delete", "coordination.k8s.io", "leases"),
        ("list", "coordination.k8s.io", "leases"),
    ):
        assert not await allowed(client, verb, group, resource, ns), f"{verb} {resource}"
    for verb, group, resource in (
        ("get", "", "pods"),
        ("list", "", "pods"),
        ("watch", "", "pods"),
        ("patch", "", "pods"),
        ("list", "kueue.x-k8s.io", "workloads"),
        ("watch", "kueue.x-k8s.io", "workloads"),
        ("get", "batch", "jobs"),
        ("list", "batch", "jobs"),
        ("watch", "batch", "jobs"),
        ("get", "jobset.x-k8s.io", "jobsets"),
        ("list", "jobset.x-k8s.io", "jobsets"),
        ("watch", "jobset.x-k8s.io", "jobsets"),
        ("list", "ray.io", "rayclusters"),
        ("watch", "ray.io", "rayclusters"),
        ("create", "", "events"),
        ("patch", "", "events"),
    ):
        assert await allowed(client, verb, group, resource, ns), f"{verb} {resource}"
    # all namespaces: only with the ClusterRoleBinding
    assert await allowed(client, "list", "", "pods", None) is cluster_wide
    assert await allowed(client, "create", "", "events", "kube-system") is cluster_wide
    if not cluster_wide:
        await assert_denied("listing pods of all namespaces", client.list_objects(PODS, None))
    # the Lease of leader election: create any, but read and write only ours
    body = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": lease},
        "spec": {"holderIdentity": "test", "leaseDurationSeconds": 15},
    }
    await client.create(LEASES, ns, body)
    assert (await client.get(LEASES, ns, lease) or {}).get("spec", {}).get(
        "holderIdentity"
    ) == "test"
    await client.merge_patch(LEASES, ns, lease, {"spec": {"holderIdentity": "other"}})
    assert await allowed(client, "update", "coordination.k8s.io", "leases", ns, lease)
    assert not await allowed(client, "update", "coordination.k8s.io", "leases", ns, "not-ours")
    await assert_denied("reading another Lease", client.get(LEASES, ns, "not-ours"))
    await assert_denied("deleting the Lease", client.delete(LEASES, ns, lease))


@pytest.mark.anyio
async def test_chart_rbac_namespaced_runs_the_controller_and_nothing_more(
    control_plane: Any, kube: Kube, kube_namespace: str
) -> None:
    """config.namespaces: [ns] with the ClusterRole bound in ns only (the chart's RoleBinding)."""
    objects, source = rbac_source()
    ns = kube_namespace
    lease = lease_name(objects)
    async with bound_user(control_plane, kube, objects, ns, cluster_wide=False) as (kc, client, _):
        await release_scenario(kube, ns, kc, controller_config(objects, [ns]))
        await assert_least_privilege_for_real(kube, client, ns, lease, cluster_wide=False)
    print(f"RBAC from {source}")


@pytest.mark.anyio
async def test_chart_rbac_cluster_wide_runs_the_all_namespaces_default(
    control_plane: Any, kube: Kube, kube_namespace: str
) -> None:
    """The default config (all namespaces) with the ClusterRoleBinding."""
    objects, source = rbac_source()
    ns = kube_namespace
    lease = lease_name(objects)
    async with bound_user(control_plane, kube, objects, ns, cluster_wide=True) as (kc, client, _):
        config = controller_config(objects, [])
        assert config.namespaces == []
        await release_scenario(kube, ns, kc, config)
        await assert_least_privilege_for_real(kube, client, ns, lease, cluster_wide=True)
    print(f"RBAC from {source}")
