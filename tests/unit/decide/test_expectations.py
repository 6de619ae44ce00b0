"""Expectations: patched pods the cache has not shown released yet, with a fake clock."""

from __future__ import annotations

import pytest

from ungater._decide.expectations import Expectations


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def exp(clock: FakeClock) -> Expectations:
    return Expectations(timeout=30.0, clock=clock)


def test_expect_then_pending(exp: Expectations) -> None:
    assert exp.pending("owner-a") == frozenset()
    exp.expect("owner-a", ["u1", "u2"])
    exp.expect("owner-b", ["u3"])
    assert exp.pending("owner-a") == {"u1", "u2"}
    assert exp.pending("owner-b") == {"u3"}
    assert len(exp) == 3


def test_expect_accepts_any_iterable(exp: Expectations) -> None:
    exp.expect("k", (u for u in ["u1", "u2"]))
    exp.expect("k", [])
    assert exp.pending("k") == {"u1", "u2"}


def test_observe_returns_the_key_and_clears(exp: Expectations) -> None:
    exp.expect("k", ["u1", "u2"])
    assert exp.observe("u1") == "k"
    assert exp.pending("k") == {"u2"}
    assert exp.observe("u1") is None  # already observed
    assert exp.observe("u2") == "k"
    assert exp.pending("k") == frozenset()
    assert len(exp) == 0
    assert exp.next_deadline("k") is None  # the empty bucket is gone


def test_observe_unknown_uid(exp: Expectations) -> None:
    assert exp.observe("nobody") is None
    exp.expect("k", ["u1"])
    assert exp.observe("nobody") is None
    assert exp.pending("k") == {"u1"}


def test_expired_with_fake_clock(exp: Expectations, clock: FakeClock) -> None:
    exp.expect("k", ["old"])
    clock.advance(20)
    exp.expect("k", ["new"])
    assert exp.expired("k") == frozenset()
    assert exp.next_deadline("k") == pytest.approx(10)
    clock.advance(10)  # exactly at the first deadline
    assert exp.expired("k") == {"old"}
    assert exp.next_deadline("k") == pytest.approx(0)
    # expired() only reports: the uids are still pending until observed
    assert exp.pending("k") == {"old", "new"}
    clock.advance(25)
    assert exp.expired("k") == {"old", "new"}
    assert exp.next_deadline("k") == pytest.approx(-25)
    assert exp.expired("other") == frozenset()


def test_re_expecting_refreshes_the_deadline(exp: Expectations, clock: FakeClock) -> None:
    exp.expect("k", ["u"])
    clock.advance(29)
    exp.expect("k", ["u"])
    clock.advance(2)
    assert exp.expired("k") == frozenset()
    assert exp.next_deadline("k") == pytest.approx(28)
    assert len(exp) == 1


def test_observe_after_expiry(exp: Expectations, clock: FakeClock) -> None:
    exp.expect("k", ["u"])
    clock.advance(31)
    assert exp.expired("k") == {"u"}
    assert exp.observe("u") == "k"
    assert exp.expired("k") == frozenset() and exp.pending("k") == frozenset()


def test_forget_key(exp: Expectations) -> None:
    exp.expect("k", ["u1", "u2"])
    exp.expect("other", ["u3"])
    exp.forget_key("k")
    assert exp.pending("k") == frozenset()
    assert exp.observe("u1") is None  # the reverse index is cleared as well
    assert exp.pending("other") == {"u3"}
    assert len(exp) == 1
    exp.forget_key("k")  # idempotent
    exp.forget_key("never")


def test_keys_may_be_any_hashable(exp: Expectations) -> None:
    key = ("ns", "owner-uid")
    exp.expect(key, ["u"])
    assert exp.observe("u") == key


def test_default_clock_is_monotonic() -> None:
    e = Expectations(timeout=60)
    e.expect("k", ["u"])
    deadline = e.next_deadline("k")
    assert deadline is not None and 0 < deadline <= 60
    assert e.expired("k") == frozenset()


def test_expired_total_counter_starts_at_zero(exp: Expectations) -> None:
    assert exp.expired_total == 0


def test_uid_moving_to_another_key_leaves_nothing_behind(exp: Expectations) -> None:
    exp.expect("a", ["u"])
    exp.expect("b", ["u"])
    assert exp.observe("u") == "b"
    assert exp.pending("a") == frozenset()


def test_forget_key_does_not_break_another_keys_expectation(exp: Expectations) -> None:
    exp.expect("a", ["u"])
    exp.expect("b", ["u"])
    exp.forget_key("a")
    assert exp.observe("u") == "b"
    assert exp.pending("b") == frozenset()


def test_only_the_deciding_view_clears_an_expectation(exp: Expectations) -> None:
    """A pod in two kinds' watches: the faster watch must not clear what the other waits for."""
    exp.expect("jobset-owner", ["u1"], view="JobSet")
    assert exp.observe("u1", view="Job") is None  # another index shows it first: keep waiting
    assert exp.pending("jobset-owner") == {"u1"}
    assert exp.observe("u1", view="JobSet") == "jobset-owner"
    assert exp.pending("jobset-owner") == frozenset()


def test_our_own_request_outcome_clears_whatever_the_view(exp: Expectations) -> None:
    exp.expect("k", ["u1"], view="JobSet")
    assert exp.observe("u1") == "k"  # a refused or 404 patch: nothing of ours is in flight
    exp.expect("k", ["u2"])  # recorded for any view: the first event clears it
    assert exp.observe("u2", view="Job") == "k"
    exp.expect("k", ["u3"], view="JobSet")
    exp.forget_key("k")
    exp.expect("k2", ["u3"])  # the view is not remembered across a forgotten key
    assert exp.observe("u3", view="Job") == "k2"


def test_the_next_deadline_follows_the_pods_still_expected(
    exp: Expectations, clock: FakeClock
) -> None:
    exp.expect("owner", ["early-1", "early-2"])  # deadline 1030
    clock.advance(10)
    exp.expect("owner", ["late"])  # deadline 1040
    assert exp.has_pending("owner")
    assert exp.next_deadline("owner") == pytest.approx(20.0)
    exp.observe("early-1")
    assert exp.next_deadline("owner") == pytest.approx(20.0)  # early-2 still waits
    exp.observe("early-2")
    assert exp.next_deadline("owner") == pytest.approx(30.0)
    clock.advance(25)  # 1035: past the early deadline only, and nothing expected there now
    assert exp.expired("owner") == frozenset()
    clock.advance(5)
    assert exp.expired("owner") == {"late"}
    exp.observe("late")
    assert not exp.has_pending("owner")
    assert exp.next_deadline("owner") is None


def test_a_re_expected_pod_keeps_only_its_newest_deadline(
    exp: Expectations, clock: FakeClock
) -> None:
    exp.expect("owner", ["a", "b"])  # 1030
    clock.advance(10)
    exp.expect("owner", ["a"])  # 1040 for a; b keeps 1030
    clock.advance(20)  # 1030
    assert exp.expired("owner") == {"b"}
    exp.observe("b")
    assert exp.expired("owner") == frozenset()
    assert exp.next_deadline("owner") == pytest.approx(10.0)


def test_a_forgotten_owner_has_no_deadline_left(exp: Expectations) -> None:
    exp.expect("owner", ["a"])
    exp.forget_key("owner")
    assert not exp.has_pending("owner")
    assert exp.next_deadline("owner") is None
    assert exp.expired("owner") == frozenset()
