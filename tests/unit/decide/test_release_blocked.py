"""Releases refused for good (admission webhooks, policies, RBAC, validation) and releases that
land on a pod being deleted: the classification, the per-pod backoff and the decision's part.
The controller end to end is tested in tests/unit/controller/test_refused_releases.py."""

from __future__ import annotations

import json
from dataclasses import replace as _replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fakekube import FakeKube
from tests.objects import GATE, PODS, ungated
from tests.unit.builders import facts, wl_view
from tests.unit.builders import workload as raw_workload
from ungater._decide.decision import CONSUME_PROVISIONING_REQUEST, decide
from ungater._decide.refusals import (
    BlockedReleases,
    PatchOutcome,
    classify_patch_error,
    server_message,
)
from ungater._model.views import parse_workload

NS = "team-a"


# what the real kube-apiserver answered (tests/integration/test_release_blocked.py)
GENERIC_422 = json.dumps(
    {
        "kind": "Status",
        "status": "Failure",
        "message": "the server rejected our request due to an error in our request",
        "reason": "Invalid",
        "details": {},
        "code": 422,
    }
)


POLICY_403 = (
    "pods \"train-0-zfhfr\" is forbidden: ValidatingAdmissionPolicy 'deny' with binding "
    "'deny' denied request: release refused by policy"
)


@pytest.mark.parametrize(
    ("status", "message", "body", "want"),
    [
        (404, "not found", "", PatchOutcome.GONE),
        (409, "the object has been modified", "", PatchOutcome.CONFLICT),
        (
            422,
            "the server rejected our request due to an error in our request",
            GENERIC_422,
            PatchOutcome.CONFLICT,
        ),
        (422, "", GENERIC_422, PatchOutcome.CONFLICT),
        (
            422,
            "testing value /spec/schedulingGates/0/name failed: test failed",
            "",
            PatchOutcome.CONFLICT,
        ),
        (403, POLICY_403, "", PatchOutcome.BLOCKED),
        (
            403,
            'pods "p" is forbidden: User "u" cannot patch resource "pods"',
            "",
            PatchOutcome.BLOCKED,
        ),
        (
            400,
            'admission webhook "deny.example.com" denied the request: no',
            "",
            PatchOutcome.BLOCKED,
        ),
        (
            422,
            "ValidatingAdmissionPolicy 'p' with binding 'b' denied request: no",
            "",
            PatchOutcome.BLOCKED,
        ),
        (
            422,
            'Pod "p" is invalid: spec: Forbidden: pod updates may not change fields',
            "",
            PatchOutcome.BLOCKED,
        ),
        (500, "etcdserver: request timed out", "", PatchOutcome.ERROR),
        (429, "too many requests", "", PatchOutcome.ERROR),
        (503, "service unavailable", "", PatchOutcome.ERROR),
    ],
)
def test_classify_patch_error(status: int, message: str, body: str, want: str) -> None:
    assert classify_patch_error(status, message, body) == want


def test_server_message_adds_the_causes() -> None:
    body = json.dumps(
        {
            "message": "admission webhook denied the request",
            "details": {"causes": [{"message": "gate removal forbidden"}, {"message": ""}]},
        }
    )
    assert server_message("ignored", body) == (
        "admission webhook denied the request; gate removal forbidden"
    )
    assert server_message("plain text", "not json") == "plain text"


def test_backoff_doubles_per_pod_up_to_the_ceiling() -> None:
    now = [100.0]
    b = BlockedReleases(initial=5, ceiling=60, clock=lambda: now[0])
    delays = []
    for _ in range(6):
        entry = b.record("uid-a", NS, "a", 403, "denied")
        delays.append(entry.retry_at - now[0])
    assert delays == [5, 10, 20, 40, 60, 60]
    assert b.get("uid-a") is not None and b.get("uid-a").failures == 6  # type: ignore[union-attr]
    b.record("uid-b", NS, "b", 400, "no")
    assert set(b.waiting()) == {"uid-a", "uid-b"}
    assert set(b.waiting(["uid-b", "uid-c"])) == {"uid-b"}
    assert "HTTP 403, 6 times): denied; next try in 60s" in b.waiting()["uid-a"]
    assert b.next_retry(["uid-a", "uid-b"]) == 5
    now[0] += 5.0  # b's backoff ran out: it is tried again, a's has not
    assert set(b.waiting()) == {"uid-a"}
    assert len(b) == 2 and b.total == 7
    b.clear("uid-a")
    assert "uid-a" not in b and b.next_retry(["uid-a"]) is None


def test_decision_keeps_a_blocked_pod_gated_and_gives_its_slot_to_the_next() -> None:
    pods = [facts(f"p{i}", sort_key=(i,)) for i in range(4)]
    slices = [wl_view(pod_sets={"main": 4}, admitted={"main": 2})]
    blocked = {pods[0].pod.uid: "release refused by the API server (HTTP 403): no"}
    d = decide(slices, pods, GATE, blocked=blocked)
    assert d.released_names == [pods[1].pod.name, pods[2].pod.name]
    (report,) = d.pod_sets
    waits = {w.pod: w.reason for w in report.waiting}
    assert waits[pods[0].pod.name] == blocked[pods[0].pod.uid]
    assert report.gated == 4  # still gated, and not counted as released
    # never over the cap, whatever is blocked
    everything = {p.pod.uid: "no" for p in pods[:3]}
    assert decide(slices, pods, GATE, blocked=everything).released_names == [pods[3].pod.name]
    assert decide(slices, pods, GATE).released_names == [pods[0].pod.name, pods[1].pod.name]


def released(fake: FakeKube, job: str) -> list[str]:
    return sorted(
        p["metadata"]["name"]
        for p in ungated(fake.items(PODS, NS))
        if p["metadata"]["labels"]["batch.kubernetes.io/job-name"] == job
        and not p["metadata"].get("deletionTimestamp")
    )


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(min_value=0, max_value=8),
    cap=st.integers(min_value=0, max_value=8),
    released_ix=st.sets(st.integers(min_value=0, max_value=7)),
    blocked_ix=st.sets(st.integers(min_value=0, max_value=7)),
    stale_ix=st.sets(st.integers(min_value=0, max_value=7)),
)
def test_refused_and_stale_pods_wait_and_the_cap_holds(
    n: int, cap: int, released_ix: set[int], blocked_ix: set[int], stale_ix: set[int]
) -> None:
    wl = raw_workload(pod_sets={"main": 8}, admitted={"main": cap})
    wl["status"]["admissionChecks"] = [
        {
            "name": "prov",
            "podSetUpdates": [
                {"name": "main", "annotations": {CONSUME_PROVISIONING_REQUEST: "new"}}
            ],
        }
    ]
    pods = []
    for i in range(n):
        f = facts(f"p{i}", sort_key=(i,), gates=() if i in released_ix else (GATE,))
        if i in stale_ix:
            annotations = {**f.pod.annotations, CONSUME_PROVISIONING_REQUEST: "old"}
            f = _replace(f, pod=_replace(f.pod, annotations=annotations))
        pods.append(f)
    blocked = {f"uid-p{i}": "refused" for i in blocked_ix}
    d = decide([parse_workload(wl)], pods, GATE, blocked=blocked)
    released = {i for i in released_ix if i < n}
    waiting = [
        i for i in range(n) if i not in released and i not in blocked_ix and i not in stale_ix
    ]
    expected = waiting[: max(0, cap - len(released))]  # the first in order, up to the cap
    assert d.released_names == [f"p{i}" for i in expected]
