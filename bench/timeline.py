"""The harness's watch on a namespace beside the real Kueue: when each pod appeared, lost each
gate, succeeded or went, and when each Workload slice was first seen admitted.

The pod and Workload watches record the arrival of every event on this process's monotonic
clock, in the order the API server sends them (resourceVersion order within one watch). Every
latency of the Kueue benchmark is a difference of two moments recorded here, so both gates are
timed by the same observer and the same clock. Each event is also kept in ``events`` with its
resourceVersion (one etcd: one order across all watches), for ``bench.kueue_overcap`` to
replay the server's own objects in order; so is every event of the owners (Jobs, RayClusters)
watched beside them, with the owner's own size per pod set. The watches run through
``bench.gapwatch``'s loop: a 410, an ``ERROR`` event, running out of watch rounds or being
stopped with a watch down is a gap in that history (what changed meanwhile was not seen), kept
in ``gaps``; the over-cap judge refuses a history with one.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from bench.gapwatch import Gap, RecorderBroken, WatchSettings, watch_recorded
from bench.objects import CONTROLLER_UID, PODS, WORKLOADS
from ungater._kube.client import KubeClient, Resource

__all__ = [
    "OWNER_SIZES",
    "OwnerEvent",
    "PodEvent",
    "PodTrack",
    "SliceEvent",
    "SliceTrack",
    "Timeline",
    "job_sizes",
    "raycluster_sizes",
]

log = logging.getLogger(__name__)
# each watch lasts up to 300 s; far more rounds than any run needs, and running out is a gap
WATCHES = WatchSettings(rounds=10_000, watch_seconds=300, silence_seconds=120.0)
_INDEX = "batch.kubernetes.io/job-completion-index"
_POD_SET = "kueue.x-k8s.io/podset"
_REPLACED = "WorkloadSliceReplaced"  # the reason Kueue finishes a slice that a new one replaced
_REPLACES = "kueue.x-k8s.io/workload-slice-replacement-for"


@dataclass
class PodTrack:
    uid: str
    name: str
    owner: str
    index: int
    added_at: float
    gates: set[str]  # the gates the pod carried when first seen
    removed_at: dict[str, float] = field(default_factory=dict)  # gate -> first seen without it
    succeeded_at: float | None = None
    deleted_at: float | None = None
    pod_set: str = ""  # Kueue's pod set label ("" when absent: the owner's only pod set)

    def gated(self, gate: str) -> bool:
        return gate in self.gates and gate not in self.removed_at

    @property
    def live(self) -> bool:
        return self.succeeded_at is None and self.deleted_at is None


@dataclass(frozen=True)
class PodEvent:
    """One pod as an event showed it: what the over-cap replay needs."""

    rv: int
    uid: str
    owner: str
    pod_set: str
    carried: frozenset[str]  # the gates the pod carried when first seen
    gates: frozenset[str]  # the gates it carries now
    live: bool  # neither finished nor being deleted nor gone


@dataclass(frozen=True)
class SliceEvent:
    """One Workload slice as an event showed it."""

    rv: int
    name: str
    owner: str
    admitted: bool  # Admitted, not Evicted, not Finished but by a replacement
    counts: tuple[tuple[str, int], ...]  # admitted count per pod set
    gone: bool
    spec: tuple[tuple[str, int], ...] = ()  # spec count per pod set
    # what the product orders slices by (``ungater._decide.decision.order_slices``)
    uid: str = ""
    created: str = ""  # creationTimestamp
    key: str = ""  # namespace/name
    replaces: str = ""  # the replacement annotation: namespace/name of the slice it replaces


Sizes = tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class OwnerEvent:
    """One owner (a Job, a RayCluster) as an event showed it: its own size per pod set (the pods
    its own controller keeps), named as Kueue names its pod sets."""

    rv: int
    owner: str  # its UID, as its pods' events name it
    sizes: Sizes
    gone: bool


@dataclass
class SliceTrack:
    name: str
    owner: str
    created_at: float
    admitted_at: float | None = None
    count: int | None = None  # admitted count of the (only) pod set


def _gates(pod: dict[str, Any]) -> set[str]:
    return {str(g.get("name")) for g in (pod.get("spec") or {}).get("schedulingGates") or ()}


def _admitted(wl: dict[str, Any]) -> bool:
    return _cond(wl, "Admitted")


def _cond(wl: dict[str, Any], kind: str) -> bool:
    conds = (wl.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == kind and c.get("status") == "True" for c in conds)


def _count(value: Any, default: int) -> int:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return value if ok else default


def _spec_counts(wl: dict[str, Any]) -> Sizes:
    sets = (wl.get("spec") or {}).get("podSets") or ()
    return tuple((str(p.get("name", "main")), _count(p.get("count"), 0)) for p in sets)


def _counts(wl: dict[str, Any]) -> Sizes:
    """The admitted count per pod set (an assignment without a count admits the spec's)."""
    spec = dict(_spec_counts(wl))
    sets = ((wl.get("status") or {}).get("admission") or {}).get("podSetAssignments") or ()
    out = []
    for a in sets:
        name = str(a.get("name", "main"))
        out.append((name, _count(a.get("count"), spec.get(name, 0))))
    return tuple(out)


def _finished_not_replaced(wl: dict[str, Any]) -> bool:
    conds = (wl.get("status") or {}).get("conditions") or ()
    return any(
        c.get("type") == "Finished" and c.get("status") == "True" and c.get("reason") != _REPLACED
        for c in conds
    )


def job_sizes(job: dict[str, Any]) -> Sizes:
    """What the Job controller keeps active: min(parallelism, completions - succeeded), 0 while
    suspended; Kueue's one pod set of a Job is ``main``."""
    spec = job.get("spec") or {}
    if spec.get("suspend") is True:
        return (("main", 0),)
    n = _count(spec.get("parallelism"), 1)  # the API server defaults it to 1
    completions = spec.get("completions")
    if completions is not None:
        succeeded = _count((job.get("status") or {}).get("succeeded"), 0)
        n = min(n, max(0, _count(completions, 0) - succeeded))
    return (("main", n),)


def raycluster_sizes(rc: dict[str, Any]) -> Sizes:
    """What KubeRay keeps: the head (pod set ``head``) and per worker group (Kueue's pod set: the
    group's name in lower case) its replicas clamped to [minReplicas, maxReplicas] times
    numOfHosts; 0 everywhere while suspended, 0 for a suspended group."""
    spec = rc.get("spec") or {}
    suspended = spec.get("suspend") is True
    out = [("head", 0 if suspended else 1)]
    for group in spec.get("workerGroupSpecs") or ():
        name = str(group.get("groupName", "")).lower()
        if suspended or group.get("suspend") is True:
            out.append((name, 0))
            continue
        low = _count(group.get("minReplicas"), 0)
        n = max(low, _count(group.get("replicas"), low))
        high = group.get("maxReplicas")
        if high is not None:
            n = min(n, _count(high, 0))
        out.append((name, n * _count(group.get("numOfHosts"), 1)))
    return tuple(out)


#: owner resource plural -> its own size per pod set, from its raw object
OWNER_SIZES: dict[str, Callable[[dict[str, Any]], Sizes]] = {
    "jobs": job_sizes,
    "rayclusters": raycluster_sizes,
}


def _rv(obj: dict[str, Any]) -> int:
    rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
    return int(rv) if rv.isdigit() else -1


def _owner(obj: dict[str, Any]) -> str:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or ():
        if ref.get("controller"):
            return str(ref.get("uid"))
    return ""


class Timeline:
    def __init__(self, client: KubeClient, namespace: str, owners: Sequence[Resource] = ()) -> None:
        """``owners``: the owner resources (of ``OWNER_SIZES``) whose events are recorded too."""
        unknown = [r.plural for r in owners if r.plural not in OWNER_SIZES]
        if unknown:
            raise ValueError(f"timeline: no owner size known for {unknown}")
        self.client = client
        self.namespace = namespace
        self.owners = tuple(owners)
        self.pods: dict[str, PodTrack] = {}
        self.slices: dict[str, SliceTrack] = {}
        self.events: list[PodEvent | SliceEvent | OwnerEvent] = []
        self.gaps: list[Gap] = []  # history not seen (``bench.gapwatch``): no judgement
        self.settings = WATCHES
        self.synced = anyio.Event()
        self._synced: set[str] = set()
        self._changed = anyio.Event()

    # -- recording -----------------------------------------------------------------------------

    def _pod(self, etype: str, pod: dict[str, Any], now: float) -> None:
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        track = self.pods.get(uid)
        gates = _gates(pod)
        if track is None:
            labels = meta.get("labels") or {}
            index = (meta.get("annotations") or {}).get(_INDEX, labels.get(_INDEX, "-1"))
            owner = str(labels.get(CONTROLLER_UID, "")) or _owner(pod)
            track = PodTrack(uid, str(meta.get("name")), owner, int(index), now, gates)
            track.pod_set = str(labels.get(_POD_SET, ""))
            self.pods[uid] = track
        for gate in track.gates - gates:
            track.removed_at.setdefault(gate, now)
        phase = (pod.get("status") or {}).get("phase")
        if phase == "Succeeded" and track.succeeded_at is None:
            track.succeeded_at = now
        gone = etype == "DELETED" or bool(meta.get("deletionTimestamp"))
        if gone and track.deleted_at is None:
            track.deleted_at = now
        live = not gone and phase not in ("Succeeded", "Failed")
        self.events.append(
            PodEvent(
                _rv(pod),
                uid,
                track.owner,
                track.pod_set,
                frozenset(track.gates),
                frozenset(gates),
                live,
            )
        )

    def _slice(self, etype: str, wl: dict[str, Any], now: float) -> None:
        meta = wl.get("metadata") or {}
        name = str(meta.get("name"))
        track = self.slices.setdefault(name, SliceTrack(name, _owner(wl), now))
        admitted = _admitted(wl) and not _cond(wl, "Evicted") and not _finished_not_replaced(wl)
        counts = _counts(wl)
        if etype != "DELETED" and _admitted(wl) and track.admitted_at is None:
            track.admitted_at = now
            track.count = counts[0][1] if counts else None
        gone = etype == "DELETED"
        event = SliceEvent(
            _rv(wl),
            name,
            track.owner,
            admitted,
            counts,
            gone,
            _spec_counts(wl),
            uid=str(meta.get("uid", "")),
            created=str(meta.get("creationTimestamp", "")),
            key=f"{meta.get('namespace', self.namespace)}/{name}",
            replaces=str((meta.get("annotations") or {}).get(_REPLACES, "")),
        )
        self.events.append(event)

    def _owner_event(self, plural: str, etype: str, obj: dict[str, Any], now: float) -> None:
        uid = str((obj.get("metadata") or {}).get("uid", ""))
        sizes = OWNER_SIZES[plural](obj)
        self.events.append(OwnerEvent(_rv(obj), uid, sizes, etype == "DELETED"))

    async def _watch(self, resource: Resource, apply: Callable[..., None]) -> None:
        def listed(items: list[dict[str, Any]], rv: str) -> None:
            now = time.monotonic()
            try:
                for obj in items:
                    apply("ADDED", obj, now)
            except Exception as exc:
                raise RecorderBroken(f"timeline: {resource.plural} list: {exc!r}") from exc
            self._notify()

        def event(ev: dict[str, Any]) -> str:
            now = time.monotonic()
            try:
                obj = ev["object"]
                apply(str(ev["type"]), obj, now)
                rv = str(obj["metadata"]["resourceVersion"])
            except Exception as exc:
                raise RecorderBroken(f"timeline: {resource.plural} event: {exc!r}") from exc
            self._notify()
            return rv

        def synced() -> None:
            self._synced.add(resource.plural)
            if len(self._synced) == 2 + len(self.owners):
                self.synced.set()

        def down(why: str) -> None:
            log.warning("timeline: %s watch failed (%s)", resource.plural, why)

        await watch_recorded(
            self.client,
            resource,
            self.namespace,
            resource.plural,
            listed=listed,
            event=event,
            gaps=self.gaps,
            settings=self.settings,
            on_synced=synced,
            on_down=down,
        )

    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._watch, PODS, self._pod)
            tg.start_soon(self._watch, WORKLOADS, self._slice)
            for res in self.owners:
                tg.start_soon(self._watch, res, functools.partial(self._owner_event, res.plural))

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    # -- waiting -------------------------------------------------------------------------------

    async def until(self, done: Callable[[], bool], timeout: float, what: str) -> bool:
        """Wait (event-driven) until ``done()``; False after ``timeout`` seconds."""
        with anyio.move_on_after(timeout):
            while not done():
                await self._changed.wait()
            return True
        log.warning("timeline: no %s within %.0fs", what, timeout)
        return False

    def of(self, owner: str, *, live: bool = True) -> list[PodTrack]:
        """The owner's pods (live only, by default), lowest index first."""
        pods = [p for p in self.pods.values() if p.owner == owner and (p.live or not live)]
        return sorted(pods, key=lambda p: (p.index, p.added_at))

    def slices_of(self, owner: str) -> list[SliceTrack]:
        return sorted(
            (s for s in self.slices.values() if s.owner == owner), key=lambda s: s.created_at
        )
