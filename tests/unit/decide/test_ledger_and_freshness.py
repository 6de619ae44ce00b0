"""The write ledger and the freshness marks, as functions: the comparisons the cap rests on
(a view at our write's version has seen it; a view at the shrink's version is the shrink; a
cache at the term's start has seen the term) and the bookkeeping that must not leak."""

from __future__ import annotations

from typing import Any

from ungater._decide.freshness import Freshness, version_number
from ungater._decide.indexes import OwnerKey
from ungater._decide.ledger import GONE_REMEMBERED, Ledger

KEY = OwnerKey("team-a", "uid-train")


def ledger() -> Ledger:
    return Ledger(5.0, lambda: 100.0)


def test_a_view_older_than_our_write_has_not_seen_it_and_one_at_or_after_it_has() -> None:
    led = ledger()
    led.wrote("pod", 10)
    assert led.behind("pod", 9)
    assert not led.behind("pod", 10)  # the view is our write itself
    assert not led.behind("pod", 15)
    assert led.behind("pod", None)  # a version that cannot be ordered: assume not seen
    assert not led.behind("other", 1)  # nothing written: nothing to wait for


def test_the_newest_write_is_kept_whatever_order_they_are_recorded_in() -> None:
    led = ledger()
    led.wrote("pod", 10)
    led.wrote("pod", 5)  # a late record of an older write (the fence's read, say)
    assert led.written("pod") == 10


def test_a_release_known_from_another_view_counts_whatever_this_view_shows() -> None:
    led = ledger()
    led.wrote("ours", 10)
    assert not led.released_unseen("ours", 12)
    assert led.released_unseen("ours", 8)
    assert led.foreign("theirs")  # noted the first time
    assert not led.foreign("theirs")
    assert led.released_unseen("theirs", 99)
    assert not led.released_unseen("nobody", 1)


def test_sending_expects_records_where_and_marks_uncertain() -> None:
    led = ledger()
    led.sending(KEY, [("pod", "team-a", "train-0", "7")], "view")
    assert led.expectations.pending(KEY) == {"pod"}
    u = led.uncertain("pod")
    assert u is not None and u.resource_version == "7" and u.key == KEY
    assert led.locate("pod") == ("team-a", "train-0") and led.is_ours("pod")
    led.resent("pod", "9")  # refused, sent again on the pod as it is now
    assert (led.uncertain("pod") or u).resource_version == "9"
    led.answered("pod")
    assert led.uncertain("pod") is None and led.uncertain_pods() == frozenset()
    led.not_mine("pod")
    assert not led.is_ours("pod")


def test_forgetting_a_pod_drops_everything_kept_about_it_and_remembers_it_went() -> None:
    led = ledger()
    led.sending(KEY, [("pod", "team-a", "train-0", "7")], "view")
    led.wrote("pod", 8)
    led.foreign("pod")
    led.forget_pod("pod")
    assert led.locate("pod") is None
    assert led.uncertain("pod") is None and led.written("pod") is None
    assert not led.is_ours("pod") and "pod" not in led.foreign_pods()
    assert led.is_gone("pod")
    assert {k: v for k, v in led.sizes().items() if v} == {"expectations": 1, "gone": 1}


def test_gone_remembers_the_newest_pods_within_its_bound() -> None:
    led = ledger()
    for i in range(GONE_REMEMBERED + 2):
        led.went(f"pod-{i}")
    led.went("pod-2")  # seen gone again: the newest now
    assert led.sizes()["gone"] == GONE_REMEMBERED
    assert not led.is_gone("pod-0") and not led.is_gone("pod-1")
    led.went("pod-x")  # one more: the oldest goes, and pod-2 is no longer the oldest
    assert led.is_gone("pod-2") and not led.is_gone("pod-3")


def test_a_term_is_proven_once_every_cache_is_at_or_past_its_start() -> None:
    fresh = Freshness()
    assert not fresh.unconfirmed(KEY)  # no term began: nothing to prove
    versions = ["9", "12"]
    fresh.cache_versions = lambda: versions
    fresh.begin_term(10)
    assert fresh.unconfirmed(KEY)
    versions[0] = "10"  # exactly at the Lease write: it has seen it
    assert not fresh.unconfirmed(KEY) and fresh.confirmed is None


def test_an_owner_proven_by_a_read_needs_no_more_reads_in_its_term() -> None:
    fresh = Freshness()
    fresh.cache_versions = lambda: ["1"]
    fresh.begin_term(10)
    fresh.confirm(KEY)
    assert fresh.confirmed == {KEY}
    assert not fresh.unconfirmed(KEY)
    assert fresh.unconfirmed(OwnerKey("team-a", "other"))
    fresh.confirmed = None
    fresh.confirm(KEY)  # every owner proven already: nothing to add to
    assert fresh.confirmed is None


def test_an_unordered_cache_version_proves_nothing() -> None:
    fresh = Freshness()
    fresh.cache_versions = lambda: ["abc", "20"]
    fresh.begin_term(10)
    assert fresh.unconfirmed(KEY)
    assert version_number("abc") is None and version_number("20") == 20


def test_a_proof_needs_the_cache_at_or_past_every_version_the_list_shows() -> None:
    from tests.unit.podfactory import job, job_pod
    from ungater._controller.view import _not_older
    from ungater._model.views import parse_pod

    def at(rv: str) -> Any:
        pod = job_pod(job("train"), index=0)
        pod["metadata"]["resourceVersion"] = rv
        return parse_pod(pod)

    assert _not_older(at("7"), at("7"))  # the same version: the cache holds what was listed
    assert _not_older(at("8"), at("7"))
    assert not _not_older(at("6"), at("7"))
    assert not _not_older(at("x"), at("7")) and not _not_older(at("7"), at("x"))
    assert not _not_older(at("x"), at("x"))
