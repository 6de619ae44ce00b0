"""The shipped admission policy on the real API server: rendered from the chart (and identical
in deploy/manifests/optional), it refuses Kueue's service account, and only it, a pod update
that removes the gate, while the same account may still change anything else; ungater finds
it in force (guard check, /readyz detail line, metric, explain).

Regenerate the plain file with ``python -m tests.integration.test_admission_policy``.
"""

from __future__ import annotations

import copy
import secrets
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.deploy import Admin
from tests.integration.jobs import make_job, released_indexes
from tests.integration.k8s import Kube
from tests.integration.support import admit, config_for, create_workload, running_controller
from tests.objects import GATE, PODS
from tests.polling import equals, eventually, holds_for
from ungater._kube.adapter import connect
from ungater._kube.client import ApiError, Resource
from ungater._kube.gateguard import BINDINGS, POLICIES, GateGuard, check_guards
from ungater_devtools.devcluster import helm as helm_tool

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "ungater"
OPTIONAL = ROOT / "deploy" / "manifests" / "optional" / "admission-policy.yaml"
SERVICE_ACCOUNTS = Resource("", "v1", "serviceaccounts", "ServiceAccount")
HEADER = (
    "# Opt-in: makes ungater the only releaser of its gate beside a real Kueue (docs/operations.md,\n"
    '# "Sole releaser beside Kueue"). Generated from deploy/helm/ungater:\n'
    "# helm template ungater --namespace ungater-system --set managedBy=kubectl \\\n"
    "#   --set admissionPolicy.enabled=true   (its ValidatingAdmissionPolicy and binding)\n"
    "# Regenerate with `python -m tests.integration.test_admission_policy`; the integration test\n"
    "# checks that this file and the chart agree. Edit kueueNamespace/kueueServiceAccount there.\n"
)


def render_policy(helm_path: Path, **values: Any) -> str:
    stream = helm_tool.template(
        helm_path,
        CHART,
        release=helm_tool.PLAIN_RELEASE,
        namespace=helm_tool.PLAIN_NAMESPACE,
        values={"managedBy": "kubectl", "admissionPolicy": {"enabled": True, **values}},
    )
    kinds = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
    docs = [
        d
        for d in helm_tool.split_documents(stream)
        if (yaml.safe_load(d) or {}).get("kind") in kinds
    ]
    return HEADER + "".join(f"---\n{d}" for d in docs)


def test_plain_policy_is_the_chart_rendered(helm: Path) -> None:
    assert OPTIONAL.read_text() == render_policy(helm), (
        "deploy/manifests/optional/admission-policy.yaml is stale: "
        "python -m tests.integration.test_admission_policy"
    )


def sa_kubeconfig(admin: Admin, base: Path, ns: str, sa: str, out: Path) -> Path:
    """A kubeconfig acting as service account ``ns/sa`` (a TokenRequest)."""
    status, body, _ = admin.request(
        "POST",
        f"/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
    )
    assert status == 201, body
    cfg = yaml.safe_load(base.read_text())
    cfg["users"] = [{"name": "sa", "user": {"token": body["status"]["token"]}}]
    cfg["contexts"][0]["context"]["user"] = "sa"
    out.write_text(yaml.safe_dump(cfg))
    return out


def remove_gate(pod: dict[str, Any]) -> list[dict[str, Any]]:
    i = [g["name"] for g in pod["spec"]["schedulingGates"]].index(GATE)
    return [
        {"op": "test", "path": f"/spec/schedulingGates/{i}/name", "value": GATE},
        {"op": "remove", "path": f"/spec/schedulingGates/{i}"},
    ]


async def test_policy_refuses_only_kueues_gate_removal_and_ungater_sees_it(
    control_plane: Any,
    kube: Kube,
    kube_namespace: str,
    admin: Admin,
    helm: Path,
    tmp_path: Path,
) -> None:
    ns = kube_namespace
    kueue_sa = f"kueue-{secrets.token_hex(3)}"  # plays Kueue's service account
    other_sa = f"other-{secrets.token_hex(3)}"
    rbac = "rbac.authorization.k8s.io"
    await kube.create(
        Resource(rbac, "v1", "roles", "Role"),
        ns,
        {
            "metadata": {"name": "pod-writer"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]}],
        },
    )
    for sa in (kueue_sa, other_sa):
        await kube.create(SERVICE_ACCOUNTS, ns, {"metadata": {"name": sa}})
        await kube.create(
            Resource(rbac, "v1", "rolebindings", "RoleBinding"),
            ns,
            {
                "metadata": {"name": sa},
                "roleRef": {"apiGroup": rbac, "kind": "Role", "name": "pod-writer"},
                "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}],
            },
        )
    docs = list(
        yaml.safe_load_all(render_policy(helm, kueueNamespace=ns, kueueServiceAccount=kueue_sa))
    )
    policy, binding = (copy.deepcopy(d) for d in docs if d)
    name = f"guard-{ns}"[:63]
    policy["metadata"]["name"] = binding["metadata"]["name"] = name
    binding["spec"]["policyName"] = name
    base = control_plane.kubeconfig_path
    kueue = await connect(sa_kubeconfig(admin, base, ns, kueue_sa, tmp_path / "kueue.yaml"))
    other = await connect(sa_kubeconfig(admin, base, ns, other_sa, tmp_path / "other.yaml"))
    _, sel = await make_job(kube, ns, "train", 3)
    pods = await kube.list(PODS, ns, sel)
    before = await check_guards(kube.client, [GATE])
    assert before[GATE].state == "unguarded"
    await kube.client.create(POLICIES, None, policy)
    await kube.client.create(BINDINGS, None, binding)
    try:
        guarded = await check_guards(kube.client, [GATE])
        assert guarded[GATE].state == "guarded" and guarded[GATE].policies == (name,)

        async def kueue_refused() -> ApiError | None:
            try:
                await kueue.json_patch_dry_run(
                    PODS, ns, pods[0]["metadata"]["name"], remove_gate(pods[0])
                )
            except ApiError as exc:
                return exc
            return None

        refused = await eventually(kueue_refused, timeout=15, what="the policy in force")
        assert refused is not None and refused.status == 403, refused
        assert "released by ungater only" in refused.reason
        # Kueue may still do everything else to the pod
        await kueue.json_patch(
            PODS,
            ns,
            pods[0]["metadata"]["name"],
            [{"op": "add", "path": "/metadata/labels/kueue.x-k8s.io~1touched", "value": "1"}],
        )
        # and anyone else (ungater's account, here another one) may remove the gate
        await other.json_patch(PODS, ns, pods[1]["metadata"]["name"], remove_gate(pods[1]))

        # the controller finds it: /readyz detail line and the metric
        guard = GateGuard(kube.client, [GATE], interval=300)
        await guard.refresh()
        lines = [st.line for st in guard.status.values()]
        assert lines == [f"gate {GATE}: guarded by {name}"]
    finally:
        await kube.client.delete(BINDINGS, None, name)
        await kube.client.delete(POLICIES, None, name)
        await kueue.close()
        await other.close()


async def test_auto_audits_kueues_gate_without_the_policy_and_releases_behind_it(
    control_plane: Any,
    kube: Kube,
    kube_namespace: str,
) -> None:
    """``mode: auto`` (the default) on the real API server: no patch while no policy guards
    Kueue's gate; the shipped policy installed (the plain file, the chart's render), it
    releases as far as admitted; the policy removed, the next check turns it back to audit and
    nothing more is released."""
    ns = kube_namespace
    policy, binding = (d for d in yaml.safe_load_all(OPTIONAL.read_text()) if d)
    name = f"auto-{ns}"[:63]
    policy["metadata"]["name"] = binding["metadata"]["name"] = name
    binding["spec"]["policyName"] = name
    job, sel = await make_job(kube, ns, "train", 4)
    await create_workload(kube, job, "job-train-a", {"main": 4})
    await admit(kube, ns, "job-train-a", {"main": 2})
    config = config_for(ns, mode="auto", policyCheckIntervalSeconds=0.5)
    async with running_controller(control_plane.kubeconfig_path, config) as ctl:
        rt = next(rt for kind, rt in ctl.state.kinds.items() if kind.kind == "Job")
        assert ctl.state.guard.status[GATE].state == "unguarded" and rt.mode == "audit"
        await holds_for(lambda: equals(released_indexes(kube, ns, sel), []), 2.0)
        assert ctl.status_lines()[0].startswith("Job.batch: audit")
        await kube.client.create(POLICIES, None, policy)
        await kube.client.create(BINDINGS, None, binding)
        try:
            await eventually(
                lambda: equals(released_indexes(kube, ns, sel), [0, 1]),
                timeout=15,
                what="released behind the policy",
            )
            assert rt.mode == "release"
        finally:
            await kube.client.delete(BINDINGS, None, name)
            await kube.client.delete(POLICIES, None, name)
        await eventually(lambda: rt.mode == "audit", timeout=5, what="audit again")
        await admit(kube, ns, "job-train-a", {"main": 4})
        await holds_for(lambda: equals(released_indexes(kube, ns, sel), [0, 1]), 2.0)


def test_chart_schema_refuses_a_bad_admission_policy(helm: Path) -> None:
    for values, error in (
        ({"admissionPolicy": {"failurePolicy": "Sometimes"}}, "failurePolicy"),
        ({"admissionPolicy": {"kueueNamespace": ""}}, "kueueNamespace"),
        ({"admissionPolicy": {"namespace": "typo"}}, "'namespace' not allowed"),
    ):
        proc = helm_tool.run_helm(helm, ["template", "x", str(CHART)], values=values)
        assert proc.returncode != 0, f"accepted {values}"
        assert error in proc.stderr, proc.stderr


if __name__ == "__main__":
    found = helm_tool.find_helm()
    if found is None:
        sys.exit("no helm: python -m ungater_devtools.devcluster.helm build")
    OPTIONAL.parent.mkdir(parents=True, exist_ok=True)
    OPTIONAL.write_text(render_policy(found))
    print(f"wrote {OPTIONAL}")
