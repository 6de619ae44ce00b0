"""Releases refused for good, on the real API server: a ValidatingAdmissionPolicy denies the
release patch of one pod; the controller classifies it as blocked, backs off on that pod only,
says so (ReleaseBlocked Event with the server's message, metric, explain) and keeps releasing
the others. Also: what the real server answers for a failed JSON-patch ``test`` (a conflict,
never "blocked")."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from tests.integration.jobs import index, make_job
from tests.integration.k8s import Kube
from tests.integration.monitor import live_released
from tests.integration.support import (
    admit,
    config_for,
    create_workload,
    events_with,
    observed_controller,
)
from tests.objects import GATE, PODS
from tests.polling import eventually, holds_for
from ungater._cli.explain import explain
from ungater._decide.refusals import PatchOutcome, classify_patch_error, server_message
from ungater._kube.client import ApiError, Resource

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

POLICIES = Resource(
    "admissionregistration.k8s.io",
    "v1",
    "validatingadmissionpolicies",
    "ValidatingAdmissionPolicy",
)
BINDINGS = Resource(
    "admissionregistration.k8s.io",
    "v1",
    "validatingadmissionpolicybindings",
    "ValidatingAdmissionPolicyBinding",
)
DENIED = "release refused by policy test-deny-release"


@asynccontextmanager
async def deny_release_of_index(kube: Kube, ns: str, job: str, idx: int) -> AsyncIterator[str]:
    """A policy (and binding, for ``ns`` only) that refuses removing our gate from the pod of
    Job ``job`` whose completion index is ``idx``; deleted on exit (both are cluster-scoped)."""
    name = f"deny-release-{ns}"
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["UPDATE"],
                        "resources": ["pods"],
                    }
                ]
            },
            "validations": [
                {
                    "expression": (
                        "!(has(object.metadata.labels) && "
                        "object.metadata.labels['batch.kubernetes.io/job-name'] == "
                        f"'{job}' && "
                        "has(object.metadata.annotations) && "
                        "object.metadata.annotations["
                        "'batch.kubernetes.io/job-completion-index'] == "
                        f"'{idx}' && "
                        "has(oldObject.spec.schedulingGates) && "
                        f"oldObject.spec.schedulingGates.exists(g, g.name == '{GATE}') && "
                        "!(has(object.spec.schedulingGates) && "
                        f"object.spec.schedulingGates.exists(g, g.name == '{GATE}')))"
                    ),
                    "message": DENIED,
                    "reason": "Forbidden",
                }
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}
            },
        },
    }
    await kube.create(POLICIES, "", policy)
    await kube.create(BINDINGS, "", binding)
    try:
        yield name
    finally:
        await kube.delete(BINDINGS, "", name)
        await kube.delete(POLICIES, "", name)


def remove_gate(pod: dict[str, Any]) -> list[dict[str, Any]]:
    gates = [g["name"] for g in pod["spec"].get("schedulingGates") or []]
    i = gates.index(GATE)
    return [
        {"op": "test", "path": f"/spec/schedulingGates/{i}/name", "value": GATE},
        {"op": "remove", "path": f"/spec/schedulingGates/{i}"},
    ]


async def refusal(kube: Kube, ns: str, pod: dict[str, Any]) -> ApiError | None:
    """The error a dry-run release of ``pod`` gets now (None: it would be accepted)."""
    try:
        await kube.client.json_patch_dry_run(PODS, ns, pod["metadata"]["name"], remove_gate(pod))
    except ApiError as exc:
        return exc
    return None


async def test_a_failed_json_patch_test_is_a_conflict_not_a_block(
    kube: Kube, kube_namespace: str
) -> None:
    ns = kube_namespace
    _, sel = await make_job(kube, ns, "stale", 1)
    (pod,) = await kube.list(PODS, ns, sel)
    name = pod["metadata"]["name"]
    stale = [
        {"op": "test", "path": "/spec/schedulingGates/0/name", "value": "example.com/not-there"},
        {"op": "remove", "path": "/spec/schedulingGates/0"},
    ]
    with pytest.raises(ApiError) as caught:
        await kube.json_patch(PODS, ns, name, stale)
    exc = caught.value
    assert exc.status == 422, (exc.status, exc.body)
    assert classify_patch_error(exc.status, exc.reason, exc.body) == PatchOutcome.CONFLICT, exc.body
    gone = [{"op": "remove", "path": "/spec/schedulingGates/5"}]
    with pytest.raises(ApiError) as caught:
        await kube.json_patch(PODS, ns, name, gone)
    exc = caught.value
    assert classify_patch_error(exc.status, exc.reason, exc.body) == PatchOutcome.CONFLICT, exc.body


async def test_a_policy_refusing_one_pod_blocks_it_alone(
    control_plane: Any, kube: Kube, kube_namespace: str
) -> None:
    ns = kube_namespace
    job, sel = await make_job(kube, ns, "train", 4)
    other, other_sel = await make_job(kube, ns, "other", 2)
    await create_workload(kube, job, "job-train-a", {"main": 4})
    await create_workload(kube, other, "job-other-a", {"main": 2})
    async with deny_release_of_index(kube, ns, "train", 0):
        pods = {index(p): p for p in await kube.list(PODS, ns, sel)}
        # the policy takes effect once the API server's policy cache has it
        refused = await eventually(
            lambda: refusal(kube, ns, pods[0]), timeout=15, what="the policy in force"
        )
        assert refused is not None
        assert (
            classify_patch_error(refused.status, refused.reason, refused.body)
            == PatchOutcome.BLOCKED
        )
        assert DENIED in server_message(refused.reason, refused.body)
        assert await refusal(kube, ns, pods[1]) is None  # only index 0 is refused

        config = config_for(ns)
        async with observed_controller(control_plane.kubeconfig_path, config) as ctl:
            await admit(kube, ns, "job-train-a", {"main": 3})
            await admit(kube, ns, "job-other-a", {"main": 2})

            async def released(selector: str) -> list[int]:
                return sorted(index(p) for p in live_released(await kube.list(PODS, ns, selector)))

            # index 0 stays gated; the next ones in order take its place, never over the cap
            await eventually(lambda: _eq(released(sel), [1, 2, 3]), timeout=15, what="1, 2, 3")
            await eventually(lambda: _eq(released(other_sel), [0, 1]), what="the other owner")
            blocked_uid = pods[0]["metadata"]["uid"]
            assert blocked_uid in ctl.state.blocked
            assert ctl.stats.patch_blocked >= 1
            # one refusal, then the pod waits out its backoff instead of hammering the server
            patches_before = ctl.stats.patch_blocked
            await holds_for(lambda: _eq(released(sel), [1, 2, 3]), 1.5, what="cap of 3 held")
            assert ctl.stats.patch_blocked == patches_before

            warnings = await eventually(
                lambda: events_with(kube, ns, "ReleaseBlocked"), what="a ReleaseBlocked Event"
            )
            (event,) = warnings
            assert event["type"] == "Warning"
            assert event["involvedObject"]["name"] == "job-train-a"
            assert DENIED in event["message"] and pods[0]["metadata"]["name"] in event["message"]
            assert ctl.metrics is not None
            text = ctl.metrics.render().decode()
            assert 'ungater_release_blocked_total{kind="Job.batch"} 1.0' in text, text
            assert "ungater_pods_release_blocked 1.0" in text
            assert 'ungater_patches_total{outcome="blocked"} 1.0' in text

            # explain says why index 0 waits, from a dry run of the same patch
            report = await explain(ctl.client, config, ctl.registry, ns, "job-train-a")
            waits = {w["pod"]: w["reason"] for ps in report["podSets"] for w in ps["waiting"]}
            assert report["wouldRelease"] == []
            assert DENIED in waits[pods[0]["metadata"]["name"]], json.dumps(report, indent=1)


async def _eq(value: Any, want: Any) -> bool:
    return bool(await value == want)
