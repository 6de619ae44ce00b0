"""Expectations' bookkeeping that the behaviour tests cannot see: a pod moved to another
owner is pending under that owner only, and nothing is left behind once a pod is observed or
its owner forgotten (a leak here grows with every release for the controller's lifetime)."""

from __future__ import annotations

from ungater._decide.expectations import Expectations


def empty(e: Expectations) -> bool:
    return not e._by_key and not e._key_of and not e._view_of and len(e) == 0


def test_a_pod_expected_under_another_owner_moves_there() -> None:
    e = Expectations(timeout=10, clock=lambda: 0.0)
    e.expect("a", ["p", "q"], view="Job")
    e.expect("b", ["p"], view="JobSet")
    assert e.pending("a") == {"q"}
    assert e.pending("b") == {"p"}
    assert e.observe("p", view="Job") is None, "only the new view clears it"
    assert e.observe("p", view="JobSet") == "b"


def test_nothing_is_left_behind() -> None:
    e = Expectations(timeout=10, clock=lambda: 0.0)
    e.expect("a", ["p"], view="Job")
    e.observe("p", view="Job")
    assert empty(e)
    e.expect("a", ["p", "q"], view="Job")
    e.forget_key("a")
    assert empty(e)
