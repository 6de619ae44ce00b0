"""What the controller's parts share (``ungater/_controller/state.py``), one method at a time, with no I/O.

The caches' bookkeeping (intermediate objects by controller, owner facts by resourceVersion),
the names log lines give an owner, and the figures a scrape reads: each test fails when one of
these keeps the wrong version, forgets too much or too little, or reports a figure it was not
given (docs/testing.md, mutation testing).
"""

from __future__ import annotations

from typing import Any

import pytest
import ungater_plugins.job as job_plugin

from tests.fakekube import FakeKube
from tests.unit.builders import NS
from tests.unit.harness import job_state as state
from tests.unit.harness import sliced
from tests.unit.podfactory import cluster_of, ray_owner
from ungater._controller.controller import Controller
from ungater._controller.state import State, Stats
from ungater._decide.indexes import OwnerFacts, OwnerKey
from ungater._model.config import Config
from ungater._model.views import Kind, ObjectView, parse_object
from ungater._plugins.registry import PluginRegistry
from ungater.plugin_api import KindSpec, hookimpl

JOB = Kind("batch", "Job")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class FactlessJobs:
    """The Job kind with an owner-facts hook that always fails (a plugin bug)."""

    @staticmethod
    @hookimpl
    def ungater_kinds() -> list[KindSpec]:
        return [
            KindSpec(
                group="batch",
                kind="Job",
                pod_label=job_plugin.CONTROLLER_UID_LABEL,
                owner_resource=job_plugin.JOBS,
            )
        ]

    @staticmethod
    @hookimpl
    def ungater_owner_facts(owner_object: Any) -> Any:
        raise ValueError("cannot read this Job")

    ungater_pod_selector = staticmethod(job_plugin.ungater_pod_selector)
    ungater_owns_pod = staticmethod(job_plugin.ungater_owns_pod)
    ungater_pod_set = staticmethod(job_plugin.ungater_pod_set)


def rayjob_uid(name: str) -> str:
    return str(ray_owner("RayJob", name)["metadata"]["uid"])


def cluster(name: str, rv: int, controller: str = "rayjob-a") -> ObjectView:
    raw = cluster_of(ray_owner("RayJob", controller), name, {"workers": (1, 1)})
    raw["metadata"]["resourceVersion"] = str(rv)
    return parse_object(raw)


# -- names and kinds of owners -------------------------------------------------------------------


def test_an_owner_is_named_by_its_slices_owner_reference_or_else_by_its_uid() -> None:
    s = state()
    key = sliced(s, "train", "wl-train")
    assert s.describe(key) == f"Job.batch {NS}/train"
    assert s.describe(OwnerKey(NS, "uid-unknown")) == f"owner {NS}/uid-unknown"


def test_the_kind_of_an_owner_without_slices_is_none() -> None:
    s = state()
    key = sliced(s, "train", "wl-train")
    assert s.kind_of(key) is s.kinds[JOB]
    assert s.kind_of(OwnerKey(NS, "uid-unknown")) is None


# -- intermediate objects --------------------------------------------------------------------------


def test_an_older_view_of_a_cached_object_does_not_replace_a_newer_one() -> None:
    """A relist gave version 20; a late watch event of version 10 arrives after it."""
    s = state()
    s.objects.keep(cluster("rc", 20))
    s.objects.keep(cluster("rc", 10))
    (held,) = s.objects.by_uid.values()
    assert held.resource_version == "20"
    s.objects.keep(cluster("rc", 30))
    (held,) = s.objects.by_uid.values()
    assert held.resource_version == "30"
    assert [v.resource_version for v in s.objects.controlled_by(rayjob_uid("rayjob-a"))] == ["30"]


def test_an_object_that_moves_to_another_controller_leaves_the_first_ones_list() -> None:
    s = state()
    s.objects.keep(cluster("rc", 10, controller="rayjob-a"))
    s.objects.keep(cluster("rc", 11, controller="rayjob-b"))
    assert s.objects.controlled_by(rayjob_uid("rayjob-a")) == []
    assert [v.resource_version for v in s.objects.controlled_by(rayjob_uid("rayjob-b"))] == ["11"]


def test_forgetting_one_object_keeps_its_controllers_others() -> None:
    s = state()
    first, second = cluster("rc-1", 10), cluster("rc-2", 11)
    s.objects.keep(first)
    s.objects.keep(second)
    s.objects.forget(first)
    assert [v.name for v in s.objects.controlled_by(rayjob_uid("rayjob-a"))] == ["rc-2"]
    s.objects.forget(second)
    assert s.objects.controlled_by(rayjob_uid("rayjob-a")) == []
    assert s.objects.sizes() == {"objects": 0, "controllers": 0}
    s.objects.forget(second)  # forgotten twice: nothing left, no error
    assert not s.objects


# -- owner objects -------------------------------------------------------------------------------


def job_object(rv: str = "5") -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "namespace": NS, "uid": "uid-train", "resourceVersion": rv},
        "spec": {"parallelism": 3},
    }


@pytest.mark.injects(ValueError, reason="the plugin's owner_facts hook raises it")
def test_a_failing_owner_facts_hook_is_counted_each_time_and_leaves_no_facts_but_its_error() -> (
    None
):
    s = state(FactlessJobs)
    rt = s.kinds[JOB]
    view = s.parse_owner(rt, job_object())
    assert view.facts == {} and (view.uid, view.resource_version) == ("uid-train", "5")
    assert "cannot read this Job" in view.error
    s.owners.keep(view)
    assert "cannot read this Job" in held_error(s)
    s.parse_owner(rt, job_object())
    assert s.stats.plugin_errors == 2
    via = s.parse_via(rt, job_object())
    assert via.facts == {} and via.name == "train" and "cannot read this Job" in via.facts_error
    s.parse_via(rt, job_object())
    assert s.stats.plugin_errors == 4
    s.owners.keep(OwnerFacts(NS, "uid-train", {"parallelism": 3}, "6"))  # read again: known
    assert held_error(s) == ""
    s.owners.keep(view.__class__(NS, "uid-train", {}, "7", "broken again"))
    assert held_error(s) == "broken again"
    s.owners.forget("uid-train")
    assert "uid-train" not in s.owners


def held_error(s: State) -> str:
    held = s.owners.get("uid-train")
    assert held is not None
    return held.error


def test_an_older_owner_event_does_not_replace_a_newer_one() -> None:
    s = state()
    s.owners.keep(OwnerFacts(NS, "uid-train", {"parallelism": 1}, "20"))
    s.owners.keep(OwnerFacts(NS, "uid-train", {"parallelism": 3}, "10"))
    held = s.owners.get("uid-train")
    assert held is not None and held.facts == {"parallelism": 1}
    assert held.resource_version == "20"
    s.owners.keep(OwnerFacts(NS, "uid-other", {"parallelism": 2}, "10"))  # another owner
    assert len(s.owners) == 2


def test_an_owner_version_that_cannot_be_ordered_is_taken_as_it_comes() -> None:
    """Without an etcd integer no order is known: the newcomer replaces what is held."""
    s = state()
    s.owners.keep(OwnerFacts(NS, "uid-train", {"parallelism": 1}, "20"))
    s.owners.keep(OwnerFacts(NS, "uid-train", {"parallelism": 2}, "not-a-number"))
    held = s.owners.get("uid-train")
    assert held is not None and held.facts == {"parallelism": 2}


def test_a_forgotten_owner_leaves_nothing() -> None:
    s = state()
    s.owners.keep(OwnerFacts(NS, "uid-train", {"parallelism": 1}, "20"))
    s.owners.forget("uid-train")
    assert "uid-train" not in s.owners and len(s.owners) == 0
    s.owners.forget("uid-train")  # twice: nothing left to forget, no error


# -- figures -------------------------------------------------------------------------------------


# -- the parts State builds from the config --------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def configured(clock: Clock, **settings: Any) -> Controller:
    cfg = Config.model_validate({"kinds": [{"group": "batch", "kind": "Job"}], **settings})
    return Controller(cfg, FakeKube(), PluginRegistry.from_modules({"jobs": job_plugin}), clock)


def test_a_refused_release_backs_off_up_to_the_configured_ceiling_on_the_states_clock() -> None:
    clock = Clock()
    s = configured(clock, releaseBlocked={"initialBackoffSeconds": 2, "maxBackoffSeconds": 6}).state
    clock.now = 100.0
    tries = [s.blocked.record("u", NS, "p", 422, "no").retry_at - clock.now for _ in range(4)]
    assert tries == [2.0, 4.0, 6.0, 6.0]


def test_the_auditor_waits_the_configured_slice_hand_over_grace() -> None:
    s = configured(Clock(), sliceHandoverGraceSeconds=7.5).state
    assert s.auditor.handover_grace == 7.5


def test_stand_down_counts_foreign_releases_in_a_window_of_the_states_clock() -> None:
    clock = Clock()
    s = configured(clock, standDown={"foreignReleases": 2, "windowSeconds": 10}).state
    clock.now = 1_000.0
    assert s.stand_down.record("Job.batch", "g", "team-a/p-0") is None
    clock.now = 1_020.0  # the first one is out of the window by now
    assert s.stand_down.record("Job.batch", "g", "team-a/p-1") is None
    clock.now = 1_021.0
    assert s.stand_down.record("Job.batch", "g", "team-a/p-2") is not None


@pytest.mark.anyio
async def test_start_checks_the_gate_guard_once_for_a_fractional_interval() -> None:
    ctl = configured(Clock(), policyCheckIntervalSeconds=0.5)
    await ctl.start()
    assert ctl.state.guard.checks == 1
    never = configured(Clock(), policyCheckIntervalSeconds=0)
    await never.start()
    assert never.state.guard.checks == 0


def test_the_totals_line_names_each_counter_that_moved_and_only_those() -> None:
    stats = Stats()
    assert stats.summary() == "nothing done"
    stats.reconciles, stats.released, stats.proof_reads = 3, 20, 1
    stats.skipped_kinds.append("Job.batch")  # not a counter
    assert stats.summary() == "reconciles=3, released=20, proof_reads=1"
