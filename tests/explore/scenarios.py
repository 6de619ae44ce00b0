"""The stories the explorer runs, for every built-in kind: a starting state, then the world's
writes in order (Kueue, the owner's controller, the user, other writers), with 1 or 2
replicas. The explorer interleaves everything else with these steps (deliveries, partial
deliveries, relists, reconciles and their pauses, faults, cancels, expiries, leadership).

Each story holds the ingredients of known paths (issue 33's, and issue 40's 1-7), never their
schedules: which interleaving breaks the cap, or leaves a gate held, is the explorer's to find.
A kind writes each step its own way (``kinds.py``): "the owner shrinks" is a Job's
parallelism, a JobSet's replicated Job, a RayCluster's worker replicas, a RayJob's RayCluster;
"pods deleted" is one MODIFIED (a deletion timestamp) then a DELETED once finalized for pods
with a finalizer (Job, JobSet), one DELETED for pods without (RayCluster, RayJob, and the
``unfinalized`` stories).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.explore import kinds as k
from tests.unit.podfactory import NAMESPACE
from ungater._kube.client import PODS

Step = tuple[str, Callable[[Any], None]]
OTHER_GATE = "example.com/other-gate"
ALL_KINDS = tuple(k.KINDS)
MAIN = "train"


@dataclass
class Scenario:
    name: str
    about: str
    build: Callable[[Any], None]
    story: list[Step]
    replicas: tuple[str, ...] = ("a",)
    leading: tuple[str, ...] = ("a",)
    proven_at_start: bool = True  # the leader led before anything happened (no proof reads)
    handover: bool = False
    bookmarks: bool = False
    relists: bool = True
    config: dict[str, Any] = field(default_factory=dict)  # settings beside the explorer's
    finalizers: bool | None = None  # the pods carry a finalizer (None: as the kind's do)
    kinds: tuple[str, ...] = ALL_KINDS
    faults: int | None = None  # a scenario that needs more than the default
    to_patch: bool = False  # also a reconcile run until its first patch is out, reads answered

    def reconciled(self, world: Any) -> list[str]:
        """The owners a reconcile may be of."""
        return [o for o in world.owners if k.owner_uid_or_none(world, o)]


def _owner(world: Any, name: str, size: int) -> None:
    world.kind.build(world, name, size)
    world.owners.append(name)


def _pods(world: Any, owner: str, indexes: range, *, released: bool = False) -> None:
    for i in indexes:
        k.pod(world, owner, i, released=released)


def _shrink(size: int, victims: range, owner: str = MAIN) -> Callable[[Any], None]:
    def write(w: Any) -> None:
        k.resize(w, owner, size)
        k.delete_pods(w, owner, victims)

    return write


def _regrow(size: int, new: range, owner: str = MAIN) -> Callable[[Any], None]:
    def write(w: Any) -> None:
        k.resize(w, owner, size)
        for i in new:
            k.pod(w, owner, i, seed="again")

    return write


def _replace_slice(count: int, seed: str, after: str, at: float) -> Callable[[Any], None]:
    """Kueue's hand-over in one step: the old slice finished, the replacement admitted."""

    def write(w: Any) -> None:
        k.finish(w, MAIN, after)
        k.new_slice(w, MAIN, count, seed, admitted=True, after=after, at=at)

    return write


# -- issue 40, 1 and 2: a shrink whose victims go (with or without a deletion timestamp first,
#    seen through a watch or a relist), the slice lowered, the owner grown back -------------------


def _shrink_regrow_build(world: Any) -> None:
    _owner(world, MAIN, 4)
    _pods(world, MAIN, range(4), released=True)
    k.status_written(world, MAIN)
    k.new_slice(world, MAIN, 4, "", admitted=True)


_SHRINK_REGROW_STORY: list[Step] = [
    ("the owner shrinks to 2, pods 2 and 3 deleted", _shrink(2, range(2, 4))),
    ("the victims' finalizers removed", lambda w: k.finalize_pods(w, MAIN)),
    ("Kueue lowers the slice to 2", lambda w: k.lower(w, MAIN, "", 2)),
    ("the owner grows back to 4, pods 2 and 3 created", _regrow(4, range(2, 4))),
]

SHRINK_REGROW = Scenario(
    "shrink-regrow",
    "4 released; the owner shrinks to 2 (pods 2, 3 deleted), Kueue lowers the slice to 2, the "
    "owner grows back to 4",
    _shrink_regrow_build,
    list(_SHRINK_REGROW_STORY),
)

SHRINK_REGROW_UNFINALIZED = Scenario(
    "shrink-regrow-unfinalized",
    "shrink-regrow with pods that carry no finalizer (one DELETED event, no deletion timestamp "
    "first): a Job's pods without the tracking finalizer",
    _shrink_regrow_build,
    list(_SHRINK_REGROW_STORY),
    finalizers=False,
    kinds=("Job", "JobSet"),  # the Ray kinds' pods carry none anyway: shrink-regrow
)

# -- issue 40, 7: the owner's size shrinks (no pod deleted) and grows back ------------------------


def _resize_build(world: Any) -> None:
    _owner(world, MAIN, 4)
    _pods(world, MAIN, range(2), released=True)
    _pods(world, MAIN, range(2, 4))
    k.new_slice(world, MAIN, 2, "", admitted=True)


RESIZE_NO_DELETE = Scenario(
    "resize-no-delete",
    "2 of 4 released under a slice of 2; a slice of 4 replaces it; the owner shrinks to 2 with "
    "no pod deleted, Kueue lowers the slice to 2, the owner grows back to 4",
    _resize_build,
    [
        ("S1 finished, S2 admitted at 4", _replace_slice(4, "s2", "", 10)),
        ("the owner shrinks to 2 (no pod deleted)", lambda w: k.resize(w, MAIN, 2)),
        ("Kueue lowers S2 to 2", lambda w: k.lower(w, MAIN, "s2", 2)),
        ("the owner grows back to 4", lambda w: k.resize(w, MAIN, 4)),
    ],
)

# -- issue 40, 3 and 4: a hand-over, the old leader's releases landing in the new term, relists ---


def _handover_grow_build(world: Any) -> None:
    _owner(world, MAIN, 3)
    _pods(world, MAIN, range(3))
    k.new_slice(world, MAIN, 3, "", admitted=True)


HANDOVER_RELIST = Scenario(
    "handover-relist",
    "a leader and a standby; 3 pods admitted; leadership may pass at any step; the owner then "
    "grows to 4 through a new slice",
    _handover_grow_build,
    [
        ("the owner grows to 4, pod 3 created", _regrow(4, range(3, 4))),
        ("S1 finished, S2 admitted at 4", _replace_slice(4, "s2", "", 10)),
    ],
    replicas=("a", "b"),
    handover=True,
)

# -- issue 40, 5: a new term's reads, and a shrink and regrow between them ------------------------


def _term_build(world: Any) -> None:
    _owner(world, MAIN, 4)
    _pods(world, MAIN, range(2), released=True)
    _pods(world, MAIN, range(2, 4))
    k.new_slice(world, MAIN, 4, "", admitted=True)


TERM_SHRINK_REGROW = Scenario(
    "term-shrink-regrow",
    "a new term whose caches may lag; 2 of 4 released, 2 releasable; the owner shrinks to 2 "
    "(pods 2, 3 deleted), Kueue lowers the slice, the owner grows back",
    _term_build,
    [
        ("the owner shrinks to 2, pods 2 and 3 deleted", _shrink(2, range(2, 4))),
        ("the victims' finalizers removed", lambda w: k.finalize_pods(w, MAIN)),
        ("Kueue lowers the slice to 2", lambda w: k.lower(w, MAIN, "", 2)),
        ("the owner grows back to 4, pods 2 and 3 created", _regrow(4, range(2, 4))),
    ],
    proven_at_start=False,
    bookmarks=True,
)

# -- issue 40, 6: a new term releases a pod its cache never held; the expectation expires and
#    reading it back fails -----------------------------------------------------------------------


def _expiry_build(world: Any) -> None:
    _owner(world, MAIN, 2)
    k.new_slice(world, MAIN, 1, "", admitted=True)


def _pods_created(w: Any) -> None:
    k.pod(w, MAIN, 1)
    k.pod(w, MAIN, 0)


EXPIRY = Scenario(
    "expiry-read-fails",
    "a new term whose pod cache lags; pods 1 and 0 created under a slice of 1; expectations "
    "expire, reads fail or time out",
    _expiry_build,
    [("pods 1 and 0 created", _pods_created)],
    proven_at_start=False,
    bookmarks=True,
)

# -- the slice hand-over window (Kueue's two writes) ---------------------------------------------


def _window_build(world: Any) -> None:
    _owner(world, MAIN, 2)
    _pods(world, MAIN, range(2))
    k.new_slice(world, MAIN, 1, "", admitted=True)


SLICE_WINDOW = Scenario(
    "slice-window",
    "2 pods, S1 admitted at 1; S2 (2) created pending, S1 finished, S2 admitted: Kueue's "
    "hand-over in two writes",
    _window_build,
    [
        (
            "S2 (2) created, pending",
            lambda w: k.new_slice(w, MAIN, 2, "s2", admitted=False, after="", at=10),
        ),
        ("S1 finished", lambda w: k.finish(w, MAIN, "")),
        ("S2 admitted", lambda w: k.admit(w, MAIN, "s2")),
    ],
)

# -- two owners in one namespace ----------------------------------------------------------------

OTHER = "infer"


def _two_build(world: Any) -> None:
    _owner(world, MAIN, 2)
    _pods(world, MAIN, range(2), released=True)
    k.new_slice(world, MAIN, 2, "", admitted=True)
    _owner(world, OTHER, 2)
    _pods(world, OTHER, range(2))
    k.new_slice(world, OTHER, 1, "", admitted=True)


TWO_OWNERS = Scenario(
    "two-owners",
    "two owners in one namespace: one shrinks 2 -> 1 (pod 1 deleted, its slice lowered) while "
    "the other's slice is replaced by a larger one",
    _two_build,
    [
        ("train shrinks to 1, pod 1 deleted", _shrink(1, range(1, 2))),
        ("Kueue lowers train's slice to 1", lambda w: k.lower(w, MAIN, "", 1)),
        (
            "infer's S1 finished, S2 admitted at 2",
            lambda w: (
                k.finish(w, OTHER, ""),
                k.new_slice(w, OTHER, 2, "s2", admitted=True, after="", at=10),
            ),
        ),
    ],
)

# -- issue 33's paths, for every kind -------------------------------------------------------------


def _term_unseen_build(world: Any) -> None:
    _owner(world, MAIN, 2)


TERM_UNSEEN_POD = Scenario(
    "term-unseen-pod",
    "a new leader whose caches are behind its term's start; pods and a slice arrive",
    _term_unseen_build,
    [
        ("pod 1 created", lambda w: k.pod(w, MAIN, 1)),
        ("pod 0 created", lambda w: k.pod(w, MAIN, 0)),
        ("slice admitted at 1", lambda w: k.new_slice(w, MAIN, 1, "", admitted=True)),
    ],
    proven_at_start=False,
    bookmarks=True,
)


def _other_gate_build(world: Any) -> None:
    _owner(world, MAIN, 3)
    _pods(world, MAIN, range(2))
    k.pod(world, MAIN, 2, gates=[k.GATE, OTHER_GATE])
    k.new_slice(world, MAIN, 3, "", admitted=True)


def _other_writer_releases(w: Any) -> None:
    for p in map(copy.deepcopy, k.pods_of(w, MAIN)):
        gates = [g["name"] for g in p["spec"].get("schedulingGates") or []]
        if OTHER_GATE in gates:
            p["spec"]["schedulingGates"] = [{"name": g} for g in gates if g != OTHER_GATE]
            w.fake.put(PODS, p)


OTHER_GATE_SHRINK = Scenario(
    "other-gate-shrink",
    "3 pods admitted, one also gated by another writer, who releases it; the owner shrinks to 2",
    _other_gate_build,
    [
        ("the other writer removes its gate", _other_writer_releases),
        ("the owner shrinks to 2", lambda w: k.resize(w, MAIN, 2)),
    ],
)


def _grow_build(world: Any) -> None:
    _owner(world, MAIN, 1)
    _pods(world, MAIN, range(1))
    k.new_slice(world, MAIN, 1, "", admitted=True)


GROW = Scenario(
    "grow",
    "a leader and a standby; the owner grows 1 -> 2 -> 3 through three slices",
    _grow_build,
    [
        ("the owner grows to 2, pod 1 created", _regrow(2, range(1, 2))),
        ("S1 finished, S2 admitted at 2", _replace_slice(2, "s2", "", 20)),
        ("the owner grows to 3, pod 2 created", _regrow(3, range(2, 3))),
        ("S2 finished, S3 admitted at 3", _replace_slice(3, "s3", "s2", 30)),
    ],
    replicas=("a", "b"),
    handover=True,
    bookmarks=True,
)


def _queued_build(world: Any) -> None:
    _owner(world, MAIN, 3)
    _pods(world, MAIN, range(3))
    k.new_slice(world, MAIN, 3, "", admitted=True)


QUEUED_SENDS = Scenario(
    "queued-sends",
    "3 pods admitted, patches one at a time; the owner shrinks to 1",
    _queued_build,
    [("the owner shrinks to 1", lambda w: k.resize(w, MAIN, 1))],
    config={"client": {"patchConcurrency": 1}},
)


def _touched_build(world: Any) -> None:
    _owner(world, MAIN, 4)
    _pods(world, MAIN, range(4), released=True)
    k.new_slice(world, MAIN, 4, "", admitted=True)


TOUCHED_SLICE = Scenario(
    "touched-slice",
    "4 released; the owner shrinks to 2 (pods 2, 3 deleted), the slice gets an unrelated "
    "write, Kueue lowers it to 2, the owner grows back to 4",
    _touched_build,
    [
        ("the owner shrinks to 2, pods 2 and 3 deleted", _shrink(2, range(2, 4))),
        ("the victims' finalizers removed", lambda w: k.finalize_pods(w, MAIN)),
        ("an unrelated write to the slice", lambda w: k.touch(w, MAIN, "")),
        ("Kueue lowers the slice to 2", lambda w: k.lower(w, MAIN, "", 2)),
        ("the owner grows back to 4, pods 2 and 3 created", _regrow(4, range(2, 4))),
    ],
)


def _admitted_mid_read_build(world: Any) -> None:
    _owner(world, MAIN, 3)
    _pods(world, MAIN, range(1), released=True)
    _pods(world, MAIN, range(1, 3))
    k.new_slice(world, MAIN, 2, "", admitted=True)


ADMITTED_MID_READ = Scenario(
    "admitted-mid-read",
    "owner 3, pod 0 released, S1 admits 2; S2 admitted at 3 (cutting short a view's reads), "
    "then the owner shrinks to 2, pod 2 deleted",
    _admitted_mid_read_build,
    [
        ("S1 finished, S2 admitted at 3", _replace_slice(3, "s2", "", 20)),
        ("the owner shrinks to 2, pod 2 deleted", _shrink(2, range(2, 3))),
    ],
)


def _overlap_build(world: Any) -> None:
    _owner(world, MAIN, 3)
    _pods(world, MAIN, range(2))
    k.new_slice(world, MAIN, 3, "", admitted=True)


WAVE_OVERLAP = Scenario(
    "wave-overlap",
    "owner 3, pods 0 and 1 gated, the slice admits 3, patches one at a time; pod 2 created "
    "(decided on while the first wave's patches are out), Kueue lowers the slice to 2",
    _overlap_build,
    [
        ("pod 2 created", lambda w: k.pod(w, MAIN, 2)),
        ("Kueue lowers the slice to 2", lambda w: k.lower(w, MAIN, "", 2)),
    ],
    config={"client": {"patchConcurrency": 1}},
    to_patch=True,
)

ALL: dict[str, Scenario] = {
    s.name: s
    for s in (
        SHRINK_REGROW,
        SHRINK_REGROW_UNFINALIZED,
        RESIZE_NO_DELETE,
        HANDOVER_RELIST,
        TERM_SHRINK_REGROW,
        EXPIRY,
        SLICE_WINDOW,
        TWO_OWNERS,
        TERM_UNSEEN_POD,
        OTHER_GATE_SHRINK,
        GROW,
        QUEUED_SENDS,
        TOUCHED_SLICE,
        ADMITTED_MID_READ,
        WAVE_OVERLAP,
    )
}

__all__ = ["ALL", "CI_DEPTHS", "NAMESPACE", "Scenario"]

#: scenario -> the depth CI explores it to, for every kind it names (``make explore`` and
#: ``python -m tests.explore --depth N`` go deeper); the sum stays within 3 minutes on 2 cores
CI_DEPTHS = {
    "shrink-regrow": 5,
    "shrink-regrow-unfinalized": 5,
    "resize-no-delete": 4,
    "handover-relist": 3,
    "term-shrink-regrow": 3,
    "expiry-read-fails": 4,
    "slice-window": 3,
    "two-owners": 3,
    "term-unseen-pod": 4,
    "other-gate-shrink": 4,
    "grow": 2,
    "queued-sends": 4,
    "touched-slice": 4,
    "admitted-mid-read": 4,
    "wave-overlap": 4,
}
