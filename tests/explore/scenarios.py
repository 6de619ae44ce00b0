"""The stories the explorer runs: the world's writes in order (Kueue, the Job controller, other
writers), from a starting state, with 1 or 2 replicas. The explorer interleaves everything
else (deliveries, reconciles, pauses, faults, expiries, leadership) with these steps.

Each story holds the ingredients of a known path, not its schedule: which interleaving breaks
the cap is the explorer's to find. The cap of the owner at any moment is min(the active slice's
spec and admitted counts, the Job's parallelism), read from the server.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.objects import JOBS, WORKLOADS
from tests.unit.podfactory import GATE, NAMESPACE, job, job_pod, workload
from ungater._decide.indexes import OwnerKey
from ungater._kube.client import PODS

Step = tuple[str, Callable[[Any], None]]
OTHER_GATE = "example.com/other-gate"


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
    config: dict[str, Any] = field(default_factory=dict)  # settings beside the explorer's
    jobs: dict[str, Any] = field(default_factory=dict)

    def setup(self, world: Any) -> None:
        self.jobs.clear()
        self.build(world)
        world.owners = list(self.jobs)

    def key(self, world: Any) -> OwnerKey:
        j = world.fake.read(JOBS, NAMESPACE, world.owners[0])
        return OwnerKey(NAMESPACE, j["metadata"]["uid"])

    def live_and_cap(self, world: Any, owner: str) -> tuple[int, int]:
        fake = world.fake
        j = fake.read(JOBS, NAMESPACE, owner)
        if j is None:
            return 0, 0
        uid = j["metadata"]["uid"]
        pods = [
            p
            for p in _objects(fake, PODS)
            if any(r.get("uid") == uid for r in p["metadata"].get("ownerReferences") or [])
        ]
        live = sum(
            1
            for p in pods
            if GATE not in _gates(p)
            and p["status"]["phase"] not in ("Succeeded", "Failed")
            and not p["metadata"].get("deletionTimestamp")
        )
        return live, min(_slice_cap(fake, uid), j["spec"].get("parallelism") or 0)

    def bound(self, world: Any, owner: str, rep: Any) -> int:
        """The server's slice cap, and the owner's size as ``rep``'s owner cache shows it."""
        j = world.fake.read(JOBS, NAMESPACE, owner)
        if j is None:
            return 0
        uid = j["metadata"]["uid"]
        s = rep.ctl.state
        facts = s.owner_facts.get(uid)
        rt = next(iter(s.kinds.values()))
        seen = rt.handler.desired_counts(facts) if facts is not None else None
        size = (seen or {}).get("main", j["spec"].get("parallelism") or 0)
        return min(_slice_cap(world.fake, uid), size)


def _objects(fake: Any, resource: Any) -> list[dict[str, Any]]:
    """The server's objects of a resource, read in place (the oracle only reads them)."""
    rkey = (resource.group, resource.plural)
    return [o for k, o in fake.objects.items() if k[:2] == rkey]


def _gates(obj: dict[str, Any]) -> list[str]:
    return [g["name"] for g in obj["spec"].get("schedulingGates") or []]


def _slice_cap(fake: Any, owner_uid: str) -> int:
    """min(spec, admitted) of the newest admitted slice neither finished nor evicted (0: none)."""
    best: tuple[str, int] | None = None
    for wl in _objects(fake, WORKLOADS):
        if not any(r.get("uid") == owner_uid for r in wl["metadata"].get("ownerReferences") or []):
            continue
        conds = {c["type"]: c["status"] for c in wl["status"].get("conditions") or []}
        if conds.get("Admitted") != "True" or "True" in (
            conds.get("Finished"),
            conds.get("Evicted"),
        ):
            continue
        spec = wl["spec"]["podSets"][0]["count"]
        admitted = wl["status"]["admission"]["podSetAssignments"][0]["count"]
        stamp = wl["metadata"]["creationTimestamp"]
        if best is None or stamp > best[0]:
            best = (stamp, min(spec, admitted))
    return best[1] if best is not None else 0


# -- helpers the stories write with -----------------------------------------------------------


def _job(world: Any, name: str, parallelism: int) -> dict[str, Any]:
    j = world.fake.put(JOBS, job(name, parallelism=parallelism, completions=8))
    world.scenario.jobs[name] = j
    return j


def _resize(world: Any, name: str, parallelism: int) -> None:
    j = world.fake.read(JOBS, NAMESPACE, name)
    j["spec"]["parallelism"] = parallelism
    world.fake.put(JOBS, j)


def _pod(world: Any, owner: str, index: int, *, released: bool = False, seed: str = "") -> None:
    j = world.fake.read(JOBS, NAMESPACE, owner)
    p = job_pod(j, index=index, created=1 + index, seed=seed)
    if released:
        p["spec"]["schedulingGates"] = []
    world.fake.put(PODS, p)


def _slice(
    world: Any, owner: str, count: int, seed: str, *, admitted: bool, after: str = "", at: float = 0
) -> None:
    j = world.fake.read(JOBS, NAMESPACE, owner)
    replaced = f"{NAMESPACE}/{after}" if after else None
    wl = workload(
        j,
        {"main": count},
        admitted={"main": count} if admitted else None,
        created=at,
        seed=seed,
        replacement_for=replaced,
    )
    world.fake.put(WORKLOADS, wl)


def _slice_name(world: Any, owner: str, seed: str) -> str:
    j = world.fake.read(JOBS, NAMESPACE, owner)
    return str(workload(j, {"main": 1}, seed=seed)["metadata"]["name"])


def _finish(world: Any, owner: str, seed: str) -> None:
    wl = world.fake.read(WORKLOADS, NAMESPACE, _slice_name(world, owner, seed))
    wl["status"]["conditions"].append(
        {"type": "Finished", "status": "True", "reason": "WorkloadSliceReplaced"}
    )
    world.fake.put(WORKLOADS, wl)


def _lower(world: Any, owner: str, seed: str, count: int) -> None:
    wl = world.fake.read(WORKLOADS, NAMESPACE, _slice_name(world, owner, seed))
    wl["spec"]["podSets"][0]["count"] = count
    wl["status"]["admission"]["podSetAssignments"][0]["count"] = count
    world.fake.put(WORKLOADS, wl)


def _delete_pods(world: Any, owner: str, indexes: range) -> None:
    for p in world.fake.items(PODS, NAMESPACE):
        labels = p["metadata"].get("labels") or {}
        if (
            p["metadata"]["name"].startswith(f"{owner}-")
            and int(labels.get("batch.kubernetes.io/job-completion-index", -1)) in indexes
        ):
            world.fake.delete(PODS, NAMESPACE, p["metadata"]["name"])


# -- 1. a new term, a silent pod watch, an expectation of a pod the cache never held ----------


def _term_build(world: Any) -> None:
    _job(world, "train", 2)


TERM_UNSEEN_POD = Scenario(
    "term-unseen-pod",
    "a new leader whose caches are behind its term's start; pods and a slice arrive",
    _term_build,
    [
        ("pod 1 created", lambda w: _pod(w, "train", 1)),
        ("pod 0 created", lambda w: _pod(w, "train", 0)),
        ("slice admitted at 1", lambda w: _slice(w, "train", 2 - 1, "", admitted=True)),
    ],
    proven_at_start=False,
    bookmarks=True,
)


# -- 2. a shrink, a slice lowered in place, a chain of replacements -----------------------------


def _chain_build(world: Any) -> None:
    _job(world, "train", 6)
    for i in range(6):
        _pod(world, "train", i, released=True)
    _slice(world, "train", 4, "", admitted=True)
    _slice(world, "train", 6, "s2", admitted=True, after=_slice_name(world, "train", ""), at=10)


def _grow_to_3(w: Any) -> None:
    _resize(w, "train", 3)
    _finish(w, "train", "s2")
    _slice(w, "train", 3, "s3", admitted=True, after=_slice_name(w, "train", "s2"), at=20)
    _pod(w, "train", 2, seed="again")


def _grow_to_5(w: Any) -> None:
    _resize(w, "train", 5)
    _slice(w, "train", 5, "s4", admitted=False, after=_slice_name(w, "train", "s3"), at=30)
    for i in (3, 4):
        _pod(w, "train", i, seed="again")


def _shrink_to_2(w: Any) -> None:
    _resize(w, "train", 2)
    _delete_pods(w, "train", range(2, 6))


SLICE_CHAIN = Scenario(
    "slice-chain",
    "S1 (4) and S2 (6) admitted; S1 finishes, the Job shrinks to 2, S2 is lowered, the Job "
    "grows to 3 (S3) then 5 (S4 pending)",
    _chain_build,
    [
        ("S1 finished", lambda w: _finish(w, "train", "")),
        ("the Job shrinks to 2, pods 2-5 deleted", _shrink_to_2),
        ("S2 lowered to 2", lambda w: _lower(w, "train", "s2", 2)),
        ("the Job grows to 3: S2 finished, S3 admitted at 3, pod 2 created", _grow_to_3),
        ("the Job grows to 5: S4 pending, pods 3 and 4 created", _grow_to_5),
    ],
)


# -- 3. another writer's gate on a pod, and a shrink ---------------------------------------------


def _other_gate_build(world: Any) -> None:
    _job(world, "train", 3)
    for i in range(3):
        _pod(world, "train", i)
    p = world.fake.items(PODS, NAMESPACE)[-1]
    p["spec"]["schedulingGates"].append({"name": OTHER_GATE})
    world.fake.put(PODS, p)
    _slice(world, "train", 3, "", admitted=True)


def _other_writer_releases(w: Any) -> None:
    for p in w.fake.items(PODS, NAMESPACE):
        if OTHER_GATE in _gates(p):
            p["spec"]["schedulingGates"] = [
                g for g in p["spec"]["schedulingGates"] if g["name"] != OTHER_GATE
            ]
            w.fake.put(PODS, p)


OTHER_GATE_SHRINK = Scenario(
    "other-gate-shrink",
    "3 pods admitted, one also gated by another writer, who releases it; the Job shrinks to 2",
    _other_gate_build,
    [
        ("the other writer removes its gate", _other_writer_releases),
        ("the Job shrinks to 2", lambda w: _resize(w, "train", 2)),
    ],
)


# -- 4. a hand-over onto a standby -------------------------------------------------------------


def _handover_build(world: Any) -> None:
    _job(world, "train", 1)
    _pod(world, "train", 0)
    _slice(world, "train", 1, "", admitted=True)


HANDOVER = Scenario(
    "handover",
    "a leader and a standby; one pod admitted; leadership may pass at any step",
    _handover_build,
    [],
    replicas=("a", "b"),
    leading=("a",),
    handover=True,
)

# -- 5. the small scope: 2 replicas, up to 3 pods, up to 3 slices ----------------------


def _grow_build(world: Any) -> None:
    _job(world, "train", 1)
    _pod(world, "train", 0)
    _slice(world, "train", 1, "", admitted=True)


def _grow(w: Any, size: int) -> None:
    _resize(w, "train", size)
    _pod(w, "train", size - 1)


def _admit(w: Any, size: int, seed: str, after: str) -> None:
    _finish(w, "train", after)
    _slice(
        w, "train", size, seed, admitted=True, after=_slice_name(w, "train", after), at=size * 10
    )


GROW = Scenario(
    "grow",
    "a leader and a standby; a Job grows 1 -> 2 -> 3 through three slices",
    _grow_build,
    [
        ("the Job grows to 2, pod 1 created", lambda w: _grow(w, 2)),
        ("S1 finished, S2 admitted at 2", lambda w: _admit(w, 2, "s2", "")),
        ("the Job grows to 3, pod 2 created", lambda w: _grow(w, 3)),
        ("S2 finished, S3 admitted at 3", lambda w: _admit(w, 3, "s3", "s2")),
    ],
    replicas=("a", "b"),
    leading=("a",),
    handover=True,
    bookmarks=True,
)

# -- 6. one patch at a time, and a shrink while the rest wait -----------------------------------


def _queued_build(world: Any) -> None:
    _job(world, "train", 3)
    for i in range(3):
        _pod(world, "train", i)
    _slice(world, "train", 3, "", admitted=True)


QUEUED_SENDS = Scenario(
    "queued-sends",
    "3 pods admitted, patches one at a time; the Job shrinks to 1",
    _queued_build,
    [("the Job shrinks to 1", lambda w: _resize(w, "train", 1))],
    config={"client": {"patchConcurrency": 1}},
)


# -- 7. a slice touched between a shrink's victims and Kueue's lowering --------------------------


def _shrink(w: Any, size: int, victims: range) -> None:
    _resize(w, "train", size)
    _delete_pods(w, "train", victims)


def _touch(w: Any) -> None:
    wl = w.fake.read(WORKLOADS, NAMESPACE, _slice_name(w, "train", ""))
    wl["metadata"].setdefault("labels", {})["touched"] = "yes"
    w.fake.put(WORKLOADS, wl)


def _regrow(w: Any) -> None:
    _resize(w, "train", 4)
    for i in (2, 3):
        _pod(w, "train", i, seed="again")


def _touched_build(world: Any) -> None:
    _job(world, "train", 4)
    for i in range(4):
        _pod(world, "train", i, released=True)
    _slice(world, "train", 4, "", admitted=True)


TOUCHED_SLICE = Scenario(
    "touched-slice",
    "4 released; the Job shrinks to 2 (pods 2, 3 deleted), the slice gets an unrelated write, "
    "Kueue lowers it to 2, the Job grows back to 4",
    _touched_build,
    [
        ("the Job shrinks to 2, pods 2 and 3 deleted", lambda w: _shrink(w, 2, range(2, 4))),
        ("an unrelated write to the slice", _touch),
        ("Kueue lowers the slice to 2", lambda w: _lower(w, "train", "", 2)),
        ("the Job grows back to 4, pods 2 and 3 created", _regrow),
    ],
)

ALL = {
    s.name: s
    for s in (
        TERM_UNSEEN_POD,
        SLICE_CHAIN,
        OTHER_GATE_SHRINK,
        HANDOVER,
        GROW,
        QUEUED_SENDS,
        TOUCHED_SLICE,
    )
}
