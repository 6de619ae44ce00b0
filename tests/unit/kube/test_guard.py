"""Which gates an admission policy guards against the other releaser (ungater._kube.gateguard): the pure
assessment, the read that cannot see the policies, and what the controller reports."""

from __future__ import annotations

from typing import Any

import pytest

from tests.fakekube import FakeKube
from ungater._kube.client import ApiError
from ungater._kube.gateguard import (
    BINDINGS,
    GUARDS_GATE_ANNOTATION,
    POLICIES,
    GateGuard,
    assess_guards,
    check_guards,
)
from ungater._observe.metrics import ControllerSnapshot, Metrics

GATE = "kueue.x-k8s.io/elastic-job"
OTHER = "example.com/gate"


def policy(name: str, gate: str | None) -> dict[str, Any]:
    ann = {GUARDS_GATE_ANNOTATION: gate} if gate else {}
    return {"metadata": {"name": name, "annotations": ann}, "spec": {}}


def binding(policy_name: str, actions: list[str]) -> dict[str, Any]:
    return {
        "metadata": {"name": f"b-{policy_name}"},
        "spec": {"policyName": policy_name, "validationActions": actions},
    }


def test_a_gate_is_guarded_by_an_annotated_policy_bound_with_deny() -> None:
    policies = [policy("p1", GATE), policy("p2", GATE), policy("p3", None), policy("p4", OTHER)]
    bindings = [binding("p1", ["Deny"]), binding("p2", ["Audit", "Warn"]), binding("p3", ["Deny"])]
    got = assess_guards([GATE, OTHER], policies, bindings)
    assert got[GATE].state == "guarded" and got[GATE].policies == ("p1",)
    assert got[OTHER].state == "unguarded"  # p4 is not bound at all
    assert "guarded by p1" in got[GATE].line and "not guarded" in got[OTHER].line
    assert assess_guards([GATE], policies, [binding("p2", ["Warn"])])[GATE].state == "unguarded"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_unreadable_policies_make_the_verdict_unknown_and_the_metric_minus_one() -> None:
    fake = FakeKube()
    fake.put(POLICIES, {**policy("p1", GATE), "metadata": {**policy("p1", GATE)["metadata"]}})
    fake.put(BINDINGS, binding("p1", ["Deny"]))
    assert (await check_guards(fake, [GATE]))[GATE].state == "guarded"

    class Forbidden(FakeKube):
        async def list_objects(
            self, resource: Any, namespace: Any, label_selector: str = ""
        ) -> Any:
            raise ApiError(403, "validatingadmissionpolicies is forbidden")

    guard = GateGuard(Forbidden(), [GATE, GATE], interval=1)
    await guard.refresh()
    (st,) = guard.status.values()
    assert st.state == "unknown" and "forbidden" in st.line
    metrics = Metrics()

    class Target:  # the controller's snapshot takes the guard's states as they are
        def metrics_snapshot(self) -> ControllerSnapshot:
            return ControllerSnapshot(gate_guard={g: st.state for g, st in guard.status.items()})

    metrics.bind(Target())
    assert f'ungater_gate_guarded{{gate="{GATE}"}} -1.0' in metrics.render().decode()
