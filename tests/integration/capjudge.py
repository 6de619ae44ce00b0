"""The cap judge shared by the integration monitor (``monitor.py``) and the real-peer recorder
(``realpeers.py``): a recorded history of pods, Workloads and owners, replayed in
resourceVersion order (one etcd: one order across every watch), with each release judged
against the cap the server's own objects set at that moment.

The cap of an owner's pod set is min(spec count, admitted count) of the owner's slice, bounded
by the owner's own size. The slice is the product's active slice, chosen by the product's own
ordering (``ungater._decide.decision.order_slices``: creation time, then the replacement
annotation's chain, then UID), so the oracles and the controller can never name different
slices. One allowance, the hand-over (docs/safety.md, "What is left open", item 2): a slice that
Kueue finished because a replacement took its place still bounds the pods until the replacement
is admitted. Before any admission, for a pod whose owner has no slice, and while the owner was
never seen or after it went, the cap is 0.

A release is an event that shows a live pod without the gate when the pod's previous event
showed the gate, or the pod was first seen after the record began. Pods in the record's first
list are what the record starts from: counted, not judged as releases (nothing says when they
were released). The judge refuses a history with a gap (``bench.gapwatch.refuse_gaps``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from bench.gapwatch import Gap, refuse_gaps
from tests.objects import controller_uid, gates_of
from ungater._decide.decision import order_slices
from ungater._model.views import ADMITTED, EVICTED, FINISHED, MalformedObject, parse_workload

REPLACED = "WorkloadSliceReplaced"  # the reason Kueue finishes a slice a new one replaced


@dataclass
class Event:
    rv: int
    resource: str  # "pod", "workload", or an owner resource's name ("owner" by default)
    kind: str  # ADDED, MODIFIED, DELETED
    obj: dict[str, Any]
    at: float = field(default_factory=time.monotonic)  # when the watch received it
    # from a relist after a gap, not a watch: the object's state at the list (a DELETED one:
    # gone by the list's resourceVersion, its ``rv``), not the moment it changed
    relisted: bool = False
    initial: bool = False  # from the record's first list: its state when the record began


def is_live(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed") and not pod[
        "metadata"
    ].get("deletionTimestamp")


def released_by(pods: Iterable[dict[str, Any]], gate: str) -> list[dict[str, Any]]:
    return [p for p in pods if is_live(p) and gate not in gates_of(p)]


def slice_caps(workload: dict[str, Any]) -> dict[str, int]:
    """Per pod set: min(spec count, admitted count) of one admitted slice (an assignment
    without a count admits the spec's)."""
    spec = {p.get("name", "main"): int(p.get("count", 0)) for p in workload["spec"]["podSets"]}
    admission = (workload.get("status") or {}).get("admission") or {}
    caps: dict[str, int] = {}
    for a in admission.get("podSetAssignments") or ():
        name = a.get("name", "main")
        caps[name] = min(spec.get(name, 0), int(a.get("count", spec.get(name, 0))))
    return caps


def owner_slice(
    workloads: Iterable[dict[str, Any]], owner_uid: str, *, handover: bool = True
) -> dict[str, Any] | None:
    """The owner's slice that bounds its pods now: the newest admitted slice, neither evicted
    nor finished, in the product's order; with ``handover``, a slice finished by its replacement
    counts as unfinished (the replacement, when admitted, is newer). ``None``: no slice."""
    raw: dict[str, dict[str, Any]] = {}
    views = []
    for w in workloads:
        if controller_uid(w) != owner_uid:
            continue
        try:
            view = parse_workload(w)
        except MalformedObject:
            continue  # the controller skips it too
        raw[view.uid] = w
        views.append(view)

    def bounds(v: Any) -> bool:
        finished = v.conditions.get(FINISHED)
        ended = v.condition_true(FINISHED) and not (handover and finished.reason == REPLACED)
        return v.condition_true(ADMITTED) and not v.condition_true(EVICTED) and not ended

    live = [v for v in order_slices(views) if bounds(v)]
    return raw[live[-1].uid] if live else None


@dataclass
class Judgement:
    """What a replay judged: every release past the cap (``violations``) and how many releases
    it judged in all (``judged``); a judgement of no release proves nothing."""

    violations: list[str] = field(default_factory=list)
    judged: int = 0


def judge(
    events: Iterable[Event],
    gaps: list[Gap],
    gate: str,
    *,
    owner_of_pod: Callable[[dict[str, Any]], str],
    pod_set_of: Callable[[dict[str, Any]], str],
    size_of: Callable[[str, dict[str, Any]], dict[str, int]],
    only_owner: str | None = None,
) -> Judgement:
    """Replay ``events`` in resourceVersion order and judge every release of ``gate`` (of
    ``only_owner``'s pods, or every owner's) against the cap at that moment. ``size_of(resource,
    owner)``: the owner's own size per pod set. Raises ``IncompleteHistory`` on any gap."""
    refuse_gaps(gaps)
    pods: dict[str, dict[str, Any]] = {}
    workloads: dict[str, dict[str, Any]] = {}
    sizes: dict[str, dict[str, int]] = {}  # owner uid -> its own size per pod set
    out = Judgement()
    seen: set[tuple[int, str]] = set()
    for ev in sorted(events, key=lambda e: e.rv):
        uid = ev.obj["metadata"]["uid"]
        if (ev.rv, uid) in seen:
            continue
        seen.add((ev.rv, uid))
        if ev.resource == "workload":
            if ev.kind == "DELETED":
                workloads.pop(uid, None)
            else:
                workloads[uid] = ev.obj
            continue
        if ev.resource != "pod":
            if ev.kind == "DELETED":
                sizes.pop(uid, None)
            else:
                sizes[uid] = size_of(ev.resource, ev.obj)
            continue
        owner = owner_of_pod(ev.obj)
        if only_owner is not None and owner != only_owner:
            continue
        before = pods.get(uid)
        if ev.kind == "DELETED":
            pods.pop(uid, None)
            continue
        pods[uid] = ev.obj
        was_gated = before is None or gate in gates_of(before)
        released = gate not in gates_of(ev.obj) and is_live(ev.obj)
        if ev.initial or not (was_gated and released):
            continue
        out.judged += 1
        pod_set = pod_set_of(ev.obj)
        mine = [p for p in pods.values() if owner_of_pod(p) == owner]
        n = sum(1 for p in released_by(mine, gate) if pod_set_of(p) == pod_set)
        active = owner_slice(workloads.values(), owner) if owner else None
        cap = slice_caps(active).get(pod_set, 0) if active is not None else 0
        size = sizes.get(owner, {}).get(pod_set, 0)
        if n > min(cap, size):
            named = active["metadata"]["name"] if active is not None else "no slice"
            out.violations.append(
                f"rv {ev.rv}: {gate} off {ev.obj['metadata']['name']} -> {n} live released "
                f"in {pod_set} > min(cap {cap} of {named}, owner size {size})"
            )
    return out
