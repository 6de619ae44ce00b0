"""The patcher alone, on the in-memory API server: what each patch outcome records, and when a
refused patch means another writer released the pod. These kill the mutants of
``ungater/_controller/patcher.py`` the whole-controller tests left alive (docs/testing.md)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fakekube import FakeKube
from tests.unit.builders import GATE, NS, pod
from ungater._controller.patcher import Patcher
from ungater._controller.state import State, Stats
from ungater._decide.decision import Release
from ungater._decide.indexes import OwnerKey
from ungater._decide.refusals import PatchOutcome
from ungater._kube.client import PODS, ApiError
from ungater._model.config import Config
from ungater._model.views import PodView, parse_pod
from ungater._observe.metrics import Metrics

OTHER_GATE = "example.com/other"
KEY = OwnerKey(NS, "owner-uid")

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Notices:
    """Stands in for ``ungater._controller.notices.Notices``: records the foreign releases reported."""

    def __init__(self) -> None:
        self.foreign: list[tuple[str, str]] = []

    def foreign_release(self, view: PodView, rt: Any, first: bool) -> None:
        if first:
            self.foreign.append((view.name, view.uid))


def patcher_on(state: State, notices: Notices) -> Patcher:
    """A patcher given the state's parts, as the controller gives them."""
    return Patcher(
        state.client,
        state.ledger,
        state.blocked,
        notices,  # type: ignore[arg-type]
        leading=lambda: state.leading(),
        concurrency=state.config.client.patch_concurrency,
        stats=state.stats,
        metrics=state.metrics,
    )


def patcher(fake: FakeKube, metrics: Metrics | None = None) -> tuple[Patcher, Notices, State]:
    state = State(Config(), fake, {}, Stats(), time.monotonic, metrics, None)
    notices = Notices()
    return patcher_on(state, notices), notices, state


def release_of(raw: dict[str, Any]) -> Release:
    view = parse_pod(raw)
    return Release(view, "main", GATE, view.gates.index(GATE))


def patches_total(m: Metrics) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(m.render().decode()):
        for s in family.samples:
            if s.name == "ungater_patches_total" and s.value:
                out[s.labels["outcome"]] = s.value
    return out


async def test_each_patch_counts_under_its_own_outcome() -> None:
    """The patches metric is labelled with what became of each request."""
    fake = FakeKube()
    released = fake.put(PODS, pod("a"))
    stale = release_of(fake.put(PODS, pod("b", gates=(OTHER_GATE, GATE))))
    fake.put(PODS, pod("b", gates=(GATE,), labels={"x": "1"}))  # changed: decide again
    moved = release_of(fake.put(PODS, pod("c", gates=(OTHER_GATE, GATE))))
    fake.put(PODS, pod("c", gates=(GATE,)))  # only the other gate went: sent again
    metrics = Metrics()
    p, _, _ = patcher(fake, metrics)
    assert await p.release(release_of(released)) == PatchOutcome.RELEASED
    assert await p.release(stale) == PatchOutcome.CONFLICT
    assert await p.release(moved) == PatchOutcome.RELEASED
    assert patches_total(metrics) == {"released": 2.0, "conflict": 2.0}  # one per request


async def test_a_refused_patch_on_a_pod_still_gated_is_no_foreign_release() -> None:
    """Another controller removed its own gate before ours and relabelled the pod: the guarded
    patch is refused, and our gate is still there: nobody released the pod."""
    fake = FakeKube()
    stale = release_of(fake.put(PODS, pod("b", gates=(OTHER_GATE, GATE))))
    fake.put(PODS, pod("b", gates=(GATE,), labels={"x": "1"}))
    p, notices, _ = patcher(fake)
    assert await p.release(stale) == PatchOutcome.CONFLICT
    await p.check_foreign_release(stale, None)  # type: ignore[arg-type]
    assert notices.foreign == []


async def test_a_pod_recreated_under_the_same_name_is_not_the_one_released() -> None:
    """The pod we decided on went and a new one took its name (stable names: JobSet, LWS):
    whatever its gates, it is another pod, so no release of ours was taken by someone."""
    fake = FakeKube()
    old = release_of(fake.put(PODS, pod("w-0", uid="uid-old", gates=(OTHER_GATE, GATE))))
    fake.delete(PODS, NS, "w-0")
    fake.put(PODS, pod("w-0", uid="uid-new", gates=(OTHER_GATE,)))
    p, notices, _ = patcher(fake)
    assert await p.release(old) == PatchOutcome.CONFLICT
    await p.check_foreign_release(old, None)  # type: ignore[arg-type]
    assert notices.foreign == []


async def test_a_refused_patch_on_a_pod_released_by_another_is_reported_once() -> None:
    """The same pod, gate gone: another writer released it. Reported, and not again: the
    ledger notes it once, whichever view shows it again."""
    fake = FakeKube()
    stale = release_of(fake.put(PODS, pod("c", gates=(OTHER_GATE, GATE))))
    fake.put(PODS, pod("c", gates=(OTHER_GATE,)))
    p, notices, state = patcher(fake)
    assert await p.release(stale) == PatchOutcome.CONFLICT
    await p.check_foreign_release(stale, None)  # type: ignore[arg-type]
    assert notices.foreign == [("c", "uid-c")]
    assert state.ledger.foreign_pods() == {"uid-c"}
    await p.check_foreign_release(stale, None)  # type: ignore[arg-type]
    assert notices.foreign == [("c", "uid-c")]


def refuse(status: int, reason: str, body: dict[str, Any] | None = None) -> Any:
    def before_patch(namespace: str, name: str) -> None:
        raise ApiError(status, reason, json.dumps(body) if body is not None else "")

    return before_patch


async def test_a_422_is_judged_by_the_status_causes_too() -> None:
    """The API server's 422 for a failed JSON-patch ``test`` may carry the telling words only in
    its Status body's causes: a stale view (re-decide), not a refusal (back off for minutes)."""
    fake = FakeKube()
    r = release_of(fake.put(PODS, pod("a")))
    fake.before_patch = refuse(
        422,
        "Unprocessable Entity",
        {
            "kind": "Status",
            "message": 'Pod "a" is invalid',
            "details": {"causes": [{"message": "testing value /spec/schedulingGates/0 failed"}]},
        },
    )
    p, _, state = patcher(fake)
    assert await p.release(r) == PatchOutcome.CONFLICT
    assert state.blocked.get(r.pod.uid) is None and state.stats.patch_blocked == 0


async def test_a_refusal_for_good_is_counted_each_time_and_remembered_in_the_servers_words() -> (
    None
):
    fake = FakeKube()
    r = release_of(fake.put(PODS, pod("a")))
    body = {
        "kind": "Status",
        "message": 'admission webhook "policy.example.com" denied the request',
        "details": {"causes": [{"message": "gates are managed by the platform team"}]},
    }
    fake.before_patch = refuse(403, "Forbidden", body)
    p, _, state = patcher(fake)
    for _ in range(2):
        assert await p.release(r) == PatchOutcome.BLOCKED
    assert state.stats.patch_blocked == 2
    entry = state.blocked.get(r.pod.uid)
    assert entry is not None
    assert (entry.namespace, entry.name, entry.status, entry.failures) == (NS, "a", 403, 2)
    assert entry.message == (
        'admission webhook "policy.example.com" denied the request; '
        "gates are managed by the platform team"
    )
    # with no Status body, the HTTP reason is what there is to say
    fake.before_patch = refuse(400, "Bad Request: gates are immutable here")
    assert await p.release(r) == PatchOutcome.BLOCKED
    entry = state.blocked.get(r.pod.uid)
    assert entry is not None and entry.message == "Bad Request: gates are immutable here"


async def test_a_pod_gone_before_its_patch_is_counted_each_time() -> None:
    fake = FakeKube()
    r = release_of(fake.put(PODS, pod("a")))
    fake.delete(PODS, NS, "a")
    p, _, state = patcher(fake)
    for _ in range(2):
        assert await p.release(r) == PatchOutcome.GONE
    assert state.stats.patch_gone == 2 and state.stats.patch_errors == 0


@pytest.mark.parametrize(
    "failure",
    [ApiError(500, "Internal Server Error"), TimeoutError("timed out"), OSError("reset")],
    ids=["5xx", "timeout", "connection"],
)
async def test_a_patch_with_an_unknown_outcome_is_counted_each_time(failure: Exception) -> None:
    """5xx, a timeout, a broken connection: the patch may have landed (the reconciler keeps
    expecting it); each one is counted as an error."""
    fake = FakeKube()
    r = release_of(fake.put(PODS, pod("a")))

    def before_patch(namespace: str, name: str) -> None:
        raise failure

    fake.before_patch = before_patch
    p, _, state = patcher(fake)
    for _ in range(2):
        assert await p.release(r) == PatchOutcome.ERROR
    assert state.stats.patch_errors == 2
    assert (state.stats.patch_blocked, state.stats.patch_conflicts) == (0, 0)


async def test_a_release_landing_on_a_terminating_pod_is_no_release() -> None:
    """The guarded patch succeeds on a pod already being deleted (decided on a view that
    showed it so: its version test passes): the gate is gone, but the pod runs nothing, so the
    outcome is ``deleting`` (counted apart, each time), never ``released``."""
    fake = FakeKube()
    terminating = []
    for name in ("c", "d"):
        raw = pod(name)
        raw["metadata"]["finalizers"] = ["example.com/keep"]
        fake.put(PODS, raw)
        fake.delete(PODS, NS, name)  # terminating, still gated
        terminating.append(release_of(fake.read(PODS, NS, name) or {}))
    live = release_of(fake.put(PODS, pod("e")))
    metrics = Metrics()
    p, _, state = patcher(fake, metrics)
    for r in terminating:
        assert await p.release(r) == PatchOutcome.DELETING
    assert await p.release(live) == PatchOutcome.RELEASED
    assert (state.stats.released_deleting, patches_total(metrics)) == (
        2,
        {"deleting": 2.0, "released": 1.0},
    )


async def test_our_own_earlier_release_is_remembered_and_never_taken_for_someone_elses() -> None:
    """Each landed release records the resourceVersion it wrote; a later refused re-patch of
    that pod (decided on a view older than that write) is no foreign release."""
    fake = FakeKube()
    r = release_of(fake.put(PODS, pod("f")))
    p, notices, state = patcher(fake)
    assert await p.release(r) == PatchOutcome.RELEASED
    written = (fake.read(PODS, NS, "f") or {})["metadata"]["resourceVersion"]
    assert state.ledger.written_pods() == {"uid-f"}
    assert state.ledger.written("uid-f") == int(written)
    assert await p.release(r) == PatchOutcome.CONFLICT  # the same stale view again: refused
    await p.check_foreign_release(r, None)  # type: ignore[arg-type]
    assert notices.foreign == []


# -- a refused release sent again ---------------------------------------------------------------


class CountingGets:
    """The fake's client, counting GETs and PATCHes."""

    def __init__(self, fake: FakeKube) -> None:
        self.fake, self.gets, self.patches = fake, 0, 0

    async def get(self, *a: Any) -> Any:
        self.gets += 1
        return await self.fake.get(*a)

    async def json_patch(self, *a: Any) -> Any:
        self.patches += 1
        return await self.fake.json_patch(*a)


async def test_a_release_refused_only_for_another_writers_gate_is_sent_again_at_once() -> None:
    """Kueue removed its own gate from the pod between our read and our patch: the patch is
    refused (the version moved), the pod is read once, and the same release goes again on
    the version read, our gate at its new index; the refused request never lands, so the one
    sent again is what an unanswered release must be fenced at."""
    fake = FakeKube()
    decided = release_of(fake.put(PODS, pod("b", gates=(OTHER_GATE, GATE))))
    now = fake.put(PODS, pod("b", gates=(GATE,)))
    client = CountingGets(fake)
    state = State(Config(), client, {}, Stats(), time.monotonic, None, None)  # type: ignore[arg-type]
    state.ledger.sending(KEY, [("uid-b", NS, "b", decided.pod.resource_version)], None)
    seen: list[str] = []
    sent = client.json_patch

    async def json_patch(*a: Any) -> Any:
        seen.append(a[3][0]["value"])  # the version each request tests
        if len(seen) == 2:  # the resent request: what would it be fenced at?
            assert (
                state.ledger.uncertain("uid-b").resource_version
                == now["metadata"]["resourceVersion"]
            )
        return await sent(*a)

    client.json_patch = json_patch  # type: ignore[method-assign]
    p = patcher_on(state, Notices())
    assert await p.release(decided) == PatchOutcome.RELEASED
    assert seen == [decided.pod.resource_version, now["metadata"]["resourceVersion"]]
    assert client.gets == 1 and state.stats.patch_resent == 1
    assert (await fake.get(PODS, NS, "b"))["spec"].get("schedulingGates") in (None, [])


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"labels": {"x": "1"}}, id="relabelled"),
        pytest.param({"deleting": True}, id="terminating"),
        pytest.param({"phase": "Failed"}, id="finished"),
        pytest.param({"gates": (OTHER_GATE,)}, id="our-gate-gone"),
        pytest.param({"uid": "uid-new"}, id="another-pod-by-that-name"),
    ],
)
async def test_a_refused_release_goes_back_to_the_decision_when_the_pod_changed(
    change: dict[str, Any],
) -> None:
    fake = FakeKube()
    decided = release_of(fake.put(PODS, pod("b", gates=(OTHER_GATE, GATE))))
    if "uid" in change:
        fake.delete(PODS, NS, "b")
    changed = pod("b", **{"gates": (GATE,), **change})
    changed["metadata"]["finalizers"] = ["example.com/keep"]  # terminating stays terminating
    fake.put(PODS, changed)
    client = CountingGets(fake)
    state = State(Config(), client, {}, Stats(), time.monotonic, None, None)  # type: ignore[arg-type]
    p = patcher_on(state, Notices())
    assert await p.release(decided) == PatchOutcome.CONFLICT
    assert client.patches == 1 and state.stats.patch_resent == 0


async def test_a_release_refused_twice_is_not_sent_a_third_time() -> None:
    """Resent once: if the pod moved again, the decision takes it from there (no loop)."""
    fake = FakeKube()
    decided = release_of(fake.put(PODS, pod("b", gates=(OTHER_GATE, "example.com/third", GATE))))
    fake.put(PODS, pod("b", gates=("example.com/third", GATE)))
    client = CountingGets(fake)
    sent = client.json_patch

    async def json_patch(*a: Any) -> Any:
        if client.patches == 1:  # before the resent request: another writer moves it again
            fake.put(PODS, pod("b", gates=(GATE,)))
        return await sent(*a)

    client.json_patch = json_patch  # type: ignore[method-assign]
    state = State(Config(), client, {}, Stats(), time.monotonic, None, None)  # type: ignore[arg-type]
    p = patcher_on(state, Notices())
    assert await p.release(decided) == PatchOutcome.CONFLICT
    assert client.patches == 2 and state.stats.patch_resent == 1


async def test_the_pod_read_after_a_refusal_serves_the_foreign_release_check() -> None:
    """One read per refusal: the pod read to decide whether to resend is the one the check
    for another writer's release looks at."""
    fake = FakeKube()
    decided = release_of(fake.put(PODS, pod("c", gates=(OTHER_GATE, GATE))))
    fake.put(PODS, pod("c", gates=(OTHER_GATE,)))  # our gate went by another hand
    client = CountingGets(fake)
    state = State(Config(), client, {}, Stats(), time.monotonic, None, None)  # type: ignore[arg-type]
    notices = Notices()
    p = patcher_on(state, notices)
    assert await p.release(decided) == PatchOutcome.CONFLICT
    await p.check_foreign_release(decided, None)  # type: ignore[arg-type]
    assert notices.foreign == [("c", "uid-c")] and client.gets == 1


async def test_a_refusal_on_a_pod_at_the_decided_version_is_not_sent_again() -> None:
    """The pod did not move: whatever refused the patch would refuse it again."""
    fake = FakeKube()
    decided = release_of(fake.put(PODS, pod("b")))
    client = CountingGets(fake)

    async def json_patch(*a: Any) -> Any:
        client.patches += 1
        raise ApiError(409, "Conflict")

    client.json_patch = json_patch  # type: ignore[method-assign]
    state = State(Config(), client, {}, Stats(), time.monotonic, None, None)  # type: ignore[arg-type]
    p = patcher_on(state, Notices())
    assert await p.release(decided) == PatchOutcome.CONFLICT
    assert client.patches == 1 and client.gets == 1
