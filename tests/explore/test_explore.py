"""The small-scope explorer in CI: every scenario, for every built-in kind, explored to its
bound holds the cap and reports no false foreign release, and leaves no releasable pod gated;
and every oracle, excuse rule and the fingerprint prove themselves on planted bugs.
``make explore`` goes deeper (``python -m tests.explore``)."""

from __future__ import annotations

import logging
from dataclasses import replace
from unittest import mock

import pytest

from tests.explore import kinds as k
from tests.explore import oracles, planted
from tests.explore.scenarios import ALL, CI_DEPTHS, Scenario
from tests.explore.search import explore
from tests.explore.world import Action, Bounds, World
from ungater._controller.reconciler import Outcome, Reconciler

CASES = [(name, kind) for name in CI_DEPTHS for kind in ALL[name].kinds]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def quiet_controller() -> object:
    """Thousands of executions: the controller's warnings (expired expectations, refusals,
    stand-downs) are the explorer's choices, not news."""
    logger = logging.getLogger("ungater")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield None
    logger.setLevel(level)


@pytest.mark.anyio
@pytest.mark.parametrize(("name", "kind"), CASES, ids=[f"{n}-{k}" for n, k in CASES])
async def test_every_interleaving_within_the_bound_holds(name: str, kind: str) -> None:
    report = await explore(ALL[name], kind, CI_DEPTHS[name])
    assert not report.violation, f"{report.line()}\n  " + "\n  ".join(report.trace)
    assert report.exhausted and report.deepest == CI_DEPTHS[name], report.line()
    assert report.states > 10, report.line()  # it explored, not stopped at the start


# -- the oracles prove themselves on planted bugs ----------------------------------------------


def _oversized_slice(world: World) -> None:
    """An owner of 2 whose slice admits 3 (the slice alone would allow a third)."""
    world.kind.build(world, "train", 2)
    world.owners.append("train")
    for i in range(3):
        k.pod(world, "train", i)
    k.new_slice(world, "train", 3, "", admitted=True)


OVERSIZED = Scenario("planted-oversized", "owner 2, 3 pods, slice 3", _oversized_slice, [])


def _third_pod_later(world: World) -> None:
    world.kind.build(world, "train", 2)
    world.owners.append("train")
    for i in range(2):
        k.pod(world, "train", i)
    k.new_slice(world, "train", 3, "", admitted=True)


LATE_THIRD = Scenario(
    "planted-late-third",
    "owner 2, 2 pods, slice 3; a third pod created",
    _third_pod_later,
    [("pod 2 created", lambda w: k.pod(w, "train", 2))],
)


def _two_admitted(world: World) -> None:
    world.kind.build(world, "train", 2)
    world.owners.append("train")
    for i in range(2):
        k.pod(world, "train", i)
    k.new_slice(world, "train", 2, "", admitted=True)


TWO_ADMITTED = Scenario("planted-two-admitted", "owner 2, 2 pods, slice 2", _two_admitted, [])


@pytest.mark.anyio
@pytest.mark.parametrize("kind", sorted(k.KINDS))
async def test_the_cap_oracle_fails_a_release_over_the_owners_true_size(kind: str) -> None:
    """The plugin the controller runs with reads the owner one too large: the slice allows
    the third pod, the owner's true size does not. The strict oracle (the size from the
    server's objects through the real plugin) catches it; the same world with the real
    plugin holds."""
    held = await explore(OVERSIZED, kind, 3)
    assert not held.violation, held.line()
    with planted.oversized(kind):
        broken = await explore(OVERSIZED, kind, 3)
    assert "3 live released, true cap 2" in broken.violation, broken.line()


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["Job", "RayJob"])
async def test_the_liveness_oracle_fails_a_planted_stall(kind: str) -> None:
    """A controller that never releases the second pod (its plugin maps it to no pod set):
    the decision on the server's true state would release it, so the pod is stuck."""
    held = await explore(TWO_ADMITTED, kind, 2)
    assert not held.violation, held.line()
    with planted.stalled(kind):
        stuck = await explore(TWO_ADMITTED, kind, 2)
    assert stuck.liveness and stuck.violation.startswith("stuck"), stuck.line()
    without = await explore(TWO_ADMITTED, kind, 2, replace(Bounds(), liveness=False))
    assert not without.violation  # only the liveness oracle sees a stall


async def _world(name: str, kind: str = "Job") -> World:
    return await World.start(ALL[name], k.KINDS[kind], Bounds())


async def _story(world: World, steps: int) -> None:
    for _ in range(steps):
        await world.step(Action("story", (world.scenario.story[world.story_at][0],)))


async def _release(world: World, index: int) -> str:
    """A planted release of ours (a buggy releaser's patch), landing now."""
    pod = next(p for p in k.pods_of(world, "train") if k.index_of(world, p) == index)
    name = str(pod["metadata"]["name"])
    await world.fake.json_patch(
        k.PODS, k.NAMESPACE, name, [{"op": "remove", "path": "/spec/schedulingGates/0"}]
    )
    world.ours[name] = world.fake.rv
    return name


@pytest.mark.anyio
async def test_the_handover_window_rule_excuses_only_min_of_old_and_replacement() -> None:
    """Between Kueue's two writes (S1 finished, S2 not admitted yet) no slice is active. A
    release decided on S1 and landing then is judged against min(S1's cap, S2's count); with
    the rule off it breaks the cap of 0; a second release breaks min(1, 2) whatever."""
    for rule_on in (True, False):
        world = await _world("slice-window")
        try:
            world.rules.unknowable = False  # this rule alone
            world.rules.handover_window = rule_on
            await _story(world, 2)  # S2 created pending, S1 finished
            sent = oracles.Sent("a", await _release(world, 0), world.fake.rv, world.fake.rv)
            if rule_on:
                oracles.judge(world, sent, "a release in the window")
                sent = oracles.Sent("a", await _release(world, 1), world.fake.rv, world.fake.rv)
                with pytest.raises(oracles.Violation, match="2 live released, true cap 0"):
                    oracles.judge(world, sent, "a second release in the window")
            else:
                with pytest.raises(oracles.Violation, match="1 live released, true cap 0"):
                    oracles.judge(world, sent, "a release in the window")
        finally:
            await world.close()


@pytest.mark.anyio
async def test_the_unknowable_rule_excuses_only_a_decision_right_at_a_moment_of_its_reconcile() -> (
    None
):
    """The owner shrinks 3 -> 1 after the releasing reconcile's last read: the decision fit
    the cap (3) at a moment of its reconcile, so the release is excused. With the rule off, or
    with the shrink committed before the reconcile began (no moment of it saw 3), it breaks
    the cap of 1."""
    for rule_on, read_after_shrink in ((True, False), (False, False), (True, True)):
        world = await _world("queued-sends")
        try:
            world.rules.handover_window = False
            world.rules.unknowable = rule_on
            horizon = world.fake.rv
            await _story(world, 1)  # the owner shrinks to 1
            if read_after_shrink:
                horizon = world.fake.rv
            names = [await _release(world, i) for i in (0, 1)]
            sent = oracles.Sent("a", names[1], horizon, horizon, began=horizon)
            if rule_on and not read_after_shrink:
                oracles.judge(world, sent, "a release decided before the shrink")
            else:
                with pytest.raises(oracles.Violation, match="2 live released, true cap 1"):
                    oracles.judge(world, sent, "a release")
        finally:
            await world.close()


@pytest.mark.anyio
async def test_the_report_oracle_fails_a_report_of_our_own_release() -> None:
    """A report of a release of ours is false, unless it landed after the reporter's term
    began and the reporter saw it in a watch event; a list never dates a removal."""
    world = await _world("handover-relist")
    try:
        name = await _release(world, 0)
        rep = world.replica("b")
        rep.reports.append((name, "watch"))  # b has no term: ours landed before it began
        with pytest.raises(oracles.Violation, match="released by another writer"):
            oracles.check_reports(world)
        rep.reports[:] = []
        await world.step(Action("lead", ("b",)))
        name = await _release(world, 1)
        rep.reports.append((name, "watch"))
        oracles.check_reports(world)  # after b's term began, seen in an event: indistinguishable
        rep.reports.append((name, "list"))
        with pytest.raises(oracles.Violation, match="seen in a list"):
            oracles.check_reports(world)
    finally:
        await world.close()


@pytest.mark.anyio
async def test_hashing_finds_what_the_search_without_it_finds() -> None:
    """The fingerprint merges only states that act alike: with and without it, the search
    finds the same (a planted over-release, shortest path of the same length; and nothing on
    the real plugin) at a small bound."""
    small = Bounds(relists=0, partial=0, cancels=0, expiries=1)
    for hashing in (True, False):
        bounds = replace(small, hashing=hashing)
        held = await explore(ALL["slice-window"], "Job", 3, bounds)
        assert not held.violation, held.line()
        if hashing:
            merged_states = held.states
        else:
            assert held.states > merged_states  # without it, paths are states
    found = {}
    for hashing in (True, False):
        with planted.oversized("Job"):
            bounds = replace(small, hashing=hashing, liveness=False)
            report = await explore(LATE_THIRD, "Job", 4, bounds)
        found[hashing] = (report.violation, len(report.trace), report.states)
    assert found[True][:2] == found[False][:2] and found[True][1] == 3, found
    assert found[False][2] > found[True][2], found


@pytest.mark.anyio
async def test_an_admission_delivered_mid_read_cuts_the_reconcile_short_in_the_world() -> None:
    """The explorer's world reaches the path where an admission cuts a view's reads short:
    a reconcile paused on its first read ends when S2's admission is delivered, having sent
    nothing; the next reconcile releases what S2 admits, within the cap."""
    world = await _world("admitted-mid-read")
    try:
        rep = world.replica("a")
        await world.step(Action("reconcile-pausing", ("a", "train")))
        assert rep.task is not None and rep.requests and rep.requests[0].kind == "get"
        await _story(world, 1)  # S1 finished, S2 admitted at 3
        await world.step(Action("deliver", ("a", "workloads")))
        assert rep.task is None and not rep.requests
        assert rep.ctl.state.stats.reads_preempted == 1 and world.landed == 0
        await world.step(Action("reconcile", ("a", "train")))
        assert world.landed == 2
    finally:
        await world.close()


@pytest.mark.anyio
async def test_a_pod_created_while_a_wave_is_out_is_decided_on_beside_it_in_the_world() -> None:
    """The explorer's world reaches waves that overlap: a reconcile's first patch is out when
    pod 2 is created and delivered; the same reconcile reads a new view for it, and its
    second wave goes beside the first, within the cap."""
    world = await _world("wave-overlap")
    try:
        rep = world.replica("a")
        await world.step(Action("reconcile-to-patch", ("a", "train")))
        assert rep.task is not None and [r.kind for r in rep.requests] == ["patch"]
        await _story(world, 1)  # pod 2 created
        await world.step(Action("deliver", ("a", "pods")))
        kinds = [r.kind for r in rep.requests]
        assert kinds[0] == "patch" and "get" in kinds[1:], kinds  # a new view, the wave out
        await world.step(Action("resume", ("a",)))
        assert rep.task is None and world.landed == 3
    finally:
        await world.close()


@pytest.mark.anyio
async def test_the_sent_oracle_fails_a_wave_put_in_the_ledger_and_never_sent() -> None:
    """A reconcile whose releases go into the ledger and never out (planted in the controller:
    no plugin can do it) is caught when it ends; the real controller holds at that bound."""
    held = await explore(ALL["wave-overlap"], "Job", 2)
    assert not held.violation, held.line()

    async def never_sent(self: Reconciler, *args: object) -> Outcome:
        return Outcome()

    with mock.patch.object(Reconciler, "_release", never_sent):
        broken = await explore(ALL["wave-overlap"], "Job", 2)
    assert "releases never sent" in broken.violation, broken.line()
