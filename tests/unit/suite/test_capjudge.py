"""The slice rule of the tests' cap oracles (``tests/integration/capjudge.py``), which the
integration monitor and the real-peer recorder share, against the product's own
(``ungater._decide.decision.active_slice``).

Before, ``realpeers.chain_cap`` took the newest slice by creation time and then by the latest
resourceVersion, while ``active_slice_of`` and the controller follow the replacement annotation.
Kueue creates a replacement within the same second as the slice it replaces and then writes the
old slice again (it finishes it, it updates its status), so the old slice can carry the later
resourceVersion: the two rules then named different slices, and the oracle judged against the
old slice's cap."""

from __future__ import annotations

import copy
from typing import Any

from tests.integration.capjudge import owner_slice
from tests.integration.realpeers import active_slice_of, chain_cap
from tests.objects import condition, workload
from tests.unit.podfactory import job
from ungater._decide.decision import active_slice
from ungater._model.views import parse_workload

SECOND = "2026-01-01T00:00:05Z"


def chain(*, old_finished: bool, new_admitted: int | None) -> tuple[dict[str, Any], ...]:
    """Slice ``a`` (admits 2) and its replacement ``b`` (count 4), both created in the same
    second; ``a`` was written again after ``b`` was created (a higher resourceVersion)."""
    owner = job("train", parallelism=4)
    old = workload(owner, "a", 2, admitted=2)
    new = workload(owner, "b", 4, admitted=new_admitted, replaces="a", slice_name="a")
    for w, uid, rv in ((old, "uid-z", "30"), (new, "uid-a", "20")):  # uids against the order
        w["metadata"].update(creationTimestamp=SECOND, uid=uid, resourceVersion=rv)
    if old_finished:
        old["status"]["conditions"].append(condition("Finished", "True", "WorkloadSliceReplaced"))
    return owner, old, new


def product(workloads: list[dict[str, Any]]) -> str | None:
    found = active_slice(parse_workload(w) for w in workloads)
    return found.name if found is not None else None


def named(w: dict[str, Any] | None) -> str | None:
    return w["metadata"]["name"] if w is not None else None


def test_an_old_slice_modified_after_its_replacement_was_created_is_not_the_active_one() -> None:
    for old_finished in (False, True):  # written again before, or by, Kueue's finishing it
        owner, old, new = chain(old_finished=old_finished, new_admitted=4)
        uid = owner["metadata"]["uid"]
        assert product([old, new]) == "b"
        assert named(owner_slice([old, new], uid)) == "b", old_finished
        assert named(active_slice_of([old, new], uid)) == "b", old_finished
        assert chain_cap([old, new], uid) == {"main": 4}, old_finished
        assert chain_cap([new, old], uid) == {"main": 4}, "whatever the order listed"


def test_the_hand_over_keeps_the_replaced_slice_until_the_replacement_is_admitted() -> None:
    """Kueue finished ``a`` for ``b`` and has not admitted ``b`` yet: the product has no active
    slice (it releases nothing); the oracle still bounds the released pods by ``a``'s cap
    (docs/safety.md, "What is left open", item 2), and names no active slice for the Kueue
    differential."""
    owner, old, new = chain(old_finished=True, new_admitted=None)
    uid = owner["metadata"]["uid"]
    assert product([old, new]) is None
    assert named(active_slice_of([old, new], uid)) is None
    assert named(owner_slice([old, new], uid)) == "a"
    assert chain_cap([old, new], uid) == {"main": 2}


def test_a_slice_finished_for_another_reason_or_evicted_bounds_nothing() -> None:
    owner, old, new = chain(old_finished=False, new_admitted=None)
    uid = owner["metadata"]["uid"]
    done = copy.deepcopy(old)
    done["status"]["conditions"].append(condition("Finished", "True", "Succeeded"))
    evicted = copy.deepcopy(old)
    evicted["status"]["conditions"].append(condition("Evicted", "True", "Preempted"))
    for w in (done, evicted):
        assert owner_slice([w, new], uid) is None
        assert chain_cap([w, new], uid) is None
