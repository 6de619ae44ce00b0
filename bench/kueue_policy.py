"""The shipped admission policy, bound to the namespaces where ungater is the sole releaser.

Each releaser alone on one control plane: in some namespaces Kueue releases its own gate, in
the others ungater does behind ``deploy/manifests/optional/admission-policy.yaml``, the policy
a user installs. The policy is applied as shipped; its binding gets a ``namespaceSelector`` on
:data:`RELEASER_LABEL` = ``ungater`` (the one change), so Kueue keeps its hands off the gate
there and only there. In force is shown, not assumed: a dry-run removal of the gate from a
probe pod, sent as Kueue's service account (impersonated), is refused in an ungater namespace
and accepted in a Kueue one.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import anyio
import yaml

from bench.api import BenchApi
from bench.objects import PODS
from ungater._kube.adapter import ApiClientKube
from ungater._kube.client import ApiError, Resource
from ungater._kube.gateguard import BINDINGS, POLICIES

__all__ = ["RELEASER_LABEL", "bound_policy", "guarded_policy", "remove_policy"]

POLICY_FILE = (
    Path(__file__).resolve().parents[1] / "deploy/manifests/optional/admission-policy.yaml"
)
RELEASER_LABEL = "bench.ungater.example/releaser"
KUEUE_USER = "system:serviceaccount:kueue-system:kueue-controller-manager"
_PROBE = "policy-probe"
_IN_FORCE_S = 30.0
_POLL_S = 0.2


def bound_policy(text: str) -> list[dict[str, Any]]:
    """The shipped policy and its binding, the binding limited to the labelled namespaces."""
    docs = [d for d in yaml.safe_load_all(text) if d]
    kinds = sorted(d["kind"] for d in docs)
    if kinds != ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]:
        raise ValueError(f"{POLICY_FILE.name}: expected a policy and its binding, got {kinds}")
    out = []
    for doc in docs:
        doc = copy.deepcopy(doc)
        if doc["kind"] == "ValidatingAdmissionPolicyBinding":
            selector = {"matchLabels": {RELEASER_LABEL: "ungater"}}
            doc["spec"]["matchResources"] = {"namespaceSelector": selector}
        out.append(doc)
    return out


def _res(kind: str) -> Resource:
    return POLICIES if kind == "ValidatingAdmissionPolicy" else BINDINGS


async def remove_policy(api: BenchApi, docs: list[dict[str, Any]]) -> None:
    for doc in docs:
        await api.kube.delete(_res(doc["kind"]), None, doc["metadata"]["name"])


async def _dry_run_removal(kueue: ApiClientKube, ns: str, gate: str) -> bool:
    """Whether Kueue's account may remove ``gate`` from the probe pod in ``ns`` (dry run)."""
    patch = [{"op": "remove", "path": "/spec/schedulingGates/0"}]
    try:
        await kueue.json_patch_dry_run(PODS, ns, _PROBE, patch)
    except ApiError as exc:
        if exc.status in (403, 422):
            return False
        raise
    return True


async def guarded_policy(
    api: BenchApi, kueue: BenchApi, gate: str, ungater_ns: str, kueue_ns: str
) -> list[dict[str, Any]]:
    """Apply the bound policy; return once it refuses Kueue in ``ungater_ns`` and not in
    ``kueue_ns`` (both labelled by the caller). ``kueue`` impersonates Kueue's account."""
    docs = bound_policy(POLICY_FILE.read_text())
    for doc in docs:
        try:
            await api.kube.create(_res(doc["kind"]), None, doc)
        except ApiError as exc:
            if exc.status != 409:
                raise
    probe = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": _PROBE},
        "spec": {
            "schedulingGates": [{"name": gate}],
            "containers": [{"name": "c", "image": "registry.invalid/probe:1"}],
        },
    }
    for ns in (ungater_ns, kueue_ns):
        await api.kube.create(PODS, ns, probe)
    try:
        for _ in range(int(_IN_FORCE_S / _POLL_S)):  # the API server loads it a moment later
            if not await _dry_run_removal(kueue.kube, ungater_ns, gate):
                if not await _dry_run_removal(kueue.kube, kueue_ns, gate):
                    raise RuntimeError(f"the bound policy refuses Kueue in {kueue_ns} too")
                return docs
            await anyio.sleep(_POLL_S)
        raise RuntimeError(f"the admission policy was not in force after {_IN_FORCE_S:.0f} s")
    finally:
        for ns in (ungater_ns, kueue_ns):
            await api.kube.delete(PODS, ns, _PROBE)
