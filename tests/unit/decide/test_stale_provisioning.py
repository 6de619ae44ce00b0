"""Pods bound to a ProvisioningRequest other than the active slice's stay gated and uncounted:
the decision. The controller's Warning Event and metric are tested in
tests/unit/controller/test_stale_provisioning_warning.py."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

from tests.unit.builders import GATE, facts
from tests.unit.builders import workload as raw_workload
from ungater._decide.decision import CONSUME_PROVISIONING_REQUEST as PR
from ungater._decide.decision import PodFacts, decide
from ungater._model.views import WorkloadView, parse_workload


def with_request(wl: dict[str, Any], request: str, pod_set: str = "main") -> dict[str, Any]:
    """The slice admitted through a ProvisioningRequest check that asks its pods to consume
    ``request``."""
    out = copy.deepcopy(wl)
    out.setdefault("status", {})["admissionChecks"] = [
        {
            "name": "prov",
            "state": "Ready",
            "podSetUpdates": [{"name": pod_set, "annotations": {PR: request}}],
        }
    ]
    return out


def view(request: str | None) -> WorkloadView:
    wl = raw_workload(pod_sets={"main": 4}, admitted={"main": 3})
    return parse_workload(with_request(wl, request) if request else wl)


def bound(name: str, i: int, request: str | None) -> PodFacts:
    f = facts(name, sort_key=(i,))
    extra = {PR: request} if request else {}
    return replace(f, pod=replace(f.pod, annotations={**f.pod.annotations, **extra}))


def test_a_pod_for_another_request_stays_gated_and_takes_no_slot() -> None:
    pods = [
        bound("p0", 0, "pr-old"),
        bound("p1", 1, "pr-new"),
        bound("p2", 2, None),
        bound("p3", 3, "pr-new"),
    ]
    d = decide([view("pr-new")], pods, GATE)
    assert d.released_names == ["p1", "p2", "p3"]  # p0's slot goes to the next one
    (report,) = d.pod_sets
    assert report.stale == ("p0",)
    (why,) = [w.reason for w in report.waiting if w.pod == "p0"]
    assert "stale ProvisioningRequest" in why and "'pr-old'" in why and "'pr-new'" in why
    # the release applies the active slice's annotation to the unbound pod only
    changes = {r.pod.name: dict(r.changes.annotations) for r in d.releases}
    assert changes == {"p1": {}, "p2": {PR: "pr-new"}, "p3": {}}
    # also when pod set updates are not applied, and never without a request in the slice
    assert decide([view("pr-new")], pods, GATE, apply_pod_set_updates=False).pod_sets[0].stale
    assert decide([view(None)], pods, GATE).pod_sets[0].stale == ()
