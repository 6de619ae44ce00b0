"""What the explorer judges, from the server's objects only (never a replica's caches).

- **The cap** (``judge``), as every release of ours lands: the owner's live released pods per
  pod set (gate gone, neither Succeeded nor Failed, not being deleted) against its TRUE cap at
  that moment: min(the active slice's spec and admitted counts, the owner's own size), the
  active slice chosen by the product's rule (``decision.active_slice``) and the size read by
  the kind's real plugin from the server's owner (or, for a ``select_via`` kind, from the
  objects between). Two excuses, each a named rule that a test turns off (``Rules``):

  - ``handover-window``: Kueue finishes the old slice and admits its replacement in two
    writes; between them no slice is active. A release landing then is judged against
    min(the finished slice's cap, the pending replacement's count).
  - ``unknowable``: the decision was right at one moment of its reconcile, and a write after
    that moment made it wrong. At some version v from the reconcile's start to the last read
    (GET or LIST) it had answered before sending the patch (our own patches' answers tell it
    nothing of the bounds), the pods live and released at v, plus our other releases live now,
    plus the pods this reconcile released (each there and gated at v), fit the cap at v: the
    decision, taken atomically at v, kept the promise (its reads answered at different moments, one bound lowered between
    them, are then excused; pods taken after a bound was read, missing victims that a lowering
    took away, are not: the victims count at v).

  Nothing else is excused.
- **Foreign reports** (``check_reports``): a replica may call a release foreign only if another
  writer made it, or if it is a release of ours that landed after the reporter's term began
  and that the reporter saw through a watch event (a list cannot date a removal).
- **Liveness** (``check_liveness``): after ``World.quiesce``, no pod that the pure decision
  (``decision.decide``) would release on the server's true state is still gated.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from tests.objects import WORKLOADS
from tests.unit.podfactory import NAMESPACE
from ungater._decide.assess import owner_facts_of, pod_facts, pod_selectors, via_objects
from ungater._decide.decision import active_slice, decide, pod_set_caps
from ungater._kube.client import PODS
from ungater._model.views import (
    Kind,
    ObjectRef,
    ObjectView,
    WorkloadView,
    parse_object,
    parse_pod,
    parse_workload,
)
from ungater._plugins.registry import PluginRegistry

GATE = "kueue.x-k8s.io/elastic-job"
FINISHED = "Finished"


class Violation(AssertionError):
    """The cap broken, a false foreign-release report, or a releasable pod left gated."""


@dataclass(frozen=True)
class Sent:
    """A releasing patch of ours as it left: who sent it, the pod, the server's version then,
    and the server's version at the last read its reconcile had answered before it (its
    horizon)."""

    replica: str
    pod: str
    sent_rv: int
    horizon: int
    #: the sender's cache of the owner's size was behind the server's (``owner_lag`` only)
    owner_behind: bool = False
    #: the requests its reconcile had answered before it, each with the version it was
    #: served at (for a violation's report)
    reads: tuple[tuple[str, int], ...] = ()
    #: the server's version when its reconcile began, and which reconcile it was
    began: int = 0
    reconcile: int = 0


@dataclass
class Rules:
    """The excuses the cap oracle allows (each on by default; a test turns one off)."""

    handover_window: bool = True
    unknowable: bool = True
    #: NOT a rule of the promise: the old design's open item (an owner's shrink that the
    #: sender's owner cache had not shown yet, and what follows it), off unless asked for, to
    #: tell the old design's other failures from that one (``--excuse owner-lag``): any
    #: release sent while the sender's cache of the owner's size was behind is excused
    owner_lag: bool = False
    #: the foreign-report oracle (not an excuse; off only to let the liveness oracle show
    #: what false reports lead to)
    reports: bool = True


def _truth_registry() -> PluginRegistry:
    from tests.explore import world

    return world.registry()


_TRUTH: list[PluginRegistry] = []


def truth_registry() -> PluginRegistry:
    """The real plugins, whatever the controller runs with (a planted bug swaps those)."""
    if not _TRUTH:
        _TRUTH.append(_truth_registry())
    return _TRUTH[0]


# -- the server's objects, now or as they were ------------------------------------------------

Objects = dict[tuple[str, str, str, str], dict[str, Any]]


def objects_at(world: Any, rv: int | None = None) -> Objects:
    """The server's objects now (``rv`` None), or as of resourceVersion ``rv`` (replayed from
    the fake's history, which every execution keeps whole)."""
    if rv is None:
        return world.fake.objects  # type: ignore[no-any-return]
    out: Objects = {}
    for at, rkey, ns, etype, obj, _old in world.fake.history:
        if at > rv:
            break
        key = (*rkey, ns, obj["metadata"]["name"])
        if etype == "DELETED":
            out.pop(key, None)
        else:
            out[key] = obj
    return out


def _of(objects: Objects, group: str, plural: str) -> list[dict[str, Any]]:
    return [o for k, o in objects.items() if k[0] == group and k[1] == plural]


def owner_uid(world: Any, owner: str) -> str:
    obj = world.fake.objects.get(
        (world.kind.resource.group, world.kind.resource.plural, NAMESPACE, owner)
    )
    return "" if obj is None else str(obj["metadata"]["uid"])


@dataclass
class Truth:
    """One owner on the server at one moment."""

    active: WorkloadView | None
    caps: dict[str, int]  # per pod set of the active slice
    live: dict[str, int]  # live released pods per pod set ("?": none the plugin names)
    releasable: list[str]  # gated pods the pure decision would release now
    slices: list[WorkloadView]
    desired: dict[str, int] | None = None  # the owner's own size per pod set
    live_pods: dict[str, set[str]] = field(default_factory=dict)  # the live released, by name


def truth(world: Any, owner: str, objects: Objects) -> Truth:
    kind = world.kind
    handler = truth_registry().handler(Kind(kind.group, kind.kind))
    res = kind.resource
    obj = objects.get((res.group, res.plural, NAMESPACE, owner))
    if obj is None:
        return Truth(None, {}, {}, [], [], None, {})
    uid = obj["metadata"]["uid"]
    ref = ObjectRef(obj["apiVersion"], obj["kind"], obj["metadata"]["name"], uid, controller=True)
    slices = [
        parse_workload(w)
        for w in _of(objects, WORKLOADS.group, WORKLOADS.plural)
        if any(r.get("uid") == uid for r in w["metadata"].get("ownerReferences") or [])
    ]
    intermediates: dict[str, ObjectView] = {}
    for spec in (*handler.spec.intermediates, *filter(None, [handler.spec.select_via])):
        for o in _of(objects, spec.group, spec.plural):
            view = parse_object(o)
            if spec is handler.spec.select_via:
                view = replace(view, facts=dict(handler.owner_facts(o)))
            intermediates[view.uid] = view
    vias = via_objects(handler, ref, intermediates.values())
    own = handler.owner_facts(obj) if handler.spec.owner_resource is not None else None
    facts_in = owner_facts_of(handler, own, vias)
    desired = handler.desired_counts(facts_in) if facts_in is not None else None
    pods = [
        parse_pod(p)
        for p in _of(objects, PODS.group, PODS.plural)
        if any(
            all((p["metadata"].get("labels") or {}).get(k) == v for k, v in sel.items())
            for sel in pod_selectors(handler, ref, vias)
        )
    ]
    facts = pod_facts(handler, ref, pods, intermediates, facts_in)
    live: dict[str, int] = {}
    live_pods: dict[str, set[str]] = {}
    for f in facts:
        p = f.pod
        if not p.has_gate(GATE) and not p.terminal and not p.deleting:
            ps = f.pod_set or "?"
            live[ps] = live.get(ps, 0) + 1
            live_pods.setdefault(ps, set()).add(p.name)
    active = active_slice(slices)
    caps = {name: c.cap for name, c in pod_set_caps(active, desired).items()} if active else {}
    size_unknown = "" if desired is not None or handler.spec.owner_resource is None else "?"
    decision = decide(slices, facts, GATE, (), desired=desired, size_unknown=size_unknown)
    releasable = [r.pod.name for r in decision.releases]
    return Truth(active, caps, live, releasable, slices, dict(desired or {}) or None, live_pods)


def owner_of_pod(world: Any, pod: str) -> str | None:
    from tests.explore.kinds import pods_of

    for owner in world.owners:
        if owner_uid(world, owner) and any(
            p["metadata"]["name"] == pod for p in pods_of(world, owner)
        ):
            return owner
    return None


# -- the cap ----------------------------------------------------------------------------------


def _window_cap(t: Truth, pod_set: str, desired_cap: int | None) -> int | None:
    """In Kueue's hand-over window (no active slice; a finished slice with an unadmitted
    replacement naming it): min(the finished slice's cap, the replacement's count)."""
    if t.active is not None:
        return None
    for old in t.slices:
        cond = old.conditions.get(FINISHED)
        if cond is None or cond.status != "True" or old.assignments is None:
            continue
        for new in t.slices:
            if new.replacement_for != old.key or new.assignments is not None:
                continue
            old_caps = pod_set_caps(old)
            new_counts = {ps.name: ps.count for ps in new.pod_sets}
            if pod_set not in old_caps or new_counts.get(pod_set) is None:
                continue
            cap = min(old_caps[pod_set].cap, new_counts[pod_set] or 0)
            return cap if desired_cap is None else min(cap, desired_cap)
    return None


def owner_cache_behind(world: Any, rep: Any, pod: str) -> bool:
    """Whether ``rep``'s cache of the object holding the owner's size is behind the server's
    (for ``Rules.owner_lag``): it has not shown the latest write to it."""
    kind = world.kind
    owner = owner_of_pod(world, pod)
    if owner is None:
        return False
    res, name = kind.sized(owner)
    obj = world.fake.objects.get((res.group, res.plural, NAMESPACE, name))
    if obj is None:
        return False
    uid, rv = obj["metadata"]["uid"], obj["metadata"]["resourceVersion"]
    for r in rep.reflectors:
        if (r.resource.group, r.resource.plural) == (res.group, res.plural):
            view = r.store.get(uid)
            return getattr(view, "resource_version", None) != rv
    return False


def linearizable_at(world: Any, owner: str, ps: str, sent: Sent, now: Truth) -> int | None:
    """A version from the reconcile's start to its last read at which the decision, taken
    atomically, fit the cap (``Rules.unknowable``), or None."""
    mine = {p for p, r in world.released_by.items() if r == sent.reconcile}
    live_now = now.live_pods.get(ps, set())
    ours_other = {p for p in live_now if p in world.ours and p not in mine}
    taken = len(mine & live_now)
    versions = sorted(
        {sent.began} | {at for at, *_ in world.fake.history if sent.began < at <= sent.horizon}
    )
    chosen = {p: _uid(world.fake.objects, p) for p in mine & live_now}
    for v in versions:
        objects = objects_at(world, v)
        if any(not _gated_at(objects, p, uid) for p, uid in chosen.items()):
            continue  # a decision taken at v could not release a pod that was not there, gated
        then = truth(world, owner, objects)
        if len(then.live_pods.get(ps, set()) | ours_other) + taken <= then.caps.get(ps, 0):
            return v
    return None


def _uid(objects: Objects, pod: str) -> str | None:
    obj = objects.get((PODS.group, PODS.plural, NAMESPACE, pod))
    return None if obj is None else str(obj["metadata"]["uid"])


def _gated_at(objects: Objects, pod: str, uid: str | None) -> bool:
    obj = objects.get((PODS.group, PODS.plural, NAMESPACE, pod))
    if obj is None or obj["metadata"]["uid"] != uid:
        return False
    return any(g.get("name") == GATE for g in obj["spec"].get("schedulingGates") or [])


def judge(world: Any, sent: Sent, what: str) -> None:
    """A release of ours just landed: its owner's live released pods per pod set must be at
    most the true cap now, or what an excuse rule allows."""
    owner = owner_of_pod(world, sent.pod)
    if owner is None:
        return
    now = truth(world, owner, objects_at(world))
    for ps, live in sorted(now.live.items()):
        cap = now.caps.get(ps, 0)
        if live <= cap:
            continue
        allowed, why = cap, "the true cap"
        if world.rules.handover_window:
            w = _window_cap(now, ps, (now.desired or {}).get(ps))
            if w is not None and w > allowed:
                allowed, why = w, "handover-window"
        if world.rules.unknowable and live > allowed:
            at = linearizable_at(world, owner, ps, sent, now)
            if at is not None:
                allowed, why = live, f"unknowable (right at version {at}, after its start)"
        if world.rules.owner_lag and sent.owner_behind:
            allowed, why = live, "owner-lag (the sender's owner cache was behind)"
        if live > allowed:
            raise Violation(
                f"after {what}: {owner} pod set {ps} has {live} live released, true cap {cap}"
                f" (allowed {allowed} by {why}; the patch left at version {sent.sent_rv},"
                f" its reconcile's last read at {sent.horizon}; answered before it: "
                f"{', '.join(f'{w} at {at}' for w, at in sent.reads) or 'nothing'})"
            )


# -- foreign reports --------------------------------------------------------------------------


def check_reports(world: Any) -> None:
    """A replica may call a release foreign only if another writer made it, or if it is one
    of ours that landed after the reporter's term began and that it saw in a watch event."""
    if not world.rules.reports:
        return
    for rep in world.replicas:
        term = rep.elector.term
        start = int(term.resource_version) if term is not None else None
        for pod, how in rep.reports:
            at = world.ours.get(pod)
            if at is None:
                continue  # another writer's
            if how == "watch" and start is not None and at > start:
                continue  # indistinguishable from another writer's, and datable
            raise Violation(
                f"{rep.name} reported {pod} released by another writer (seen in a {how}); "
                f"a replica of ours released it at version {at}, its term began at {start}"
            )


# -- liveness ---------------------------------------------------------------------------------


def releasable(world: Any) -> bool:
    objects = objects_at(world)
    return any(truth(world, owner, objects).releasable for owner in world.owners)


def check_liveness(world: Any) -> None:
    """After ``World.quiesce``: nothing the pure decision would release on the server's true
    state is still gated (a kind that stood down to audit is stuck the same)."""
    objects = objects_at(world)
    for owner in world.owners:
        t = truth(world, owner, objects)
        if t.releasable:
            modes = {
                rep.name: sorted(
                    f"{k}:{getattr(rt, 'mode', '?')}" for k, rt in rep.ctl.state.kinds.items()
                )
                for rep in world.replicas
            }
            raise Violation(
                f"stuck: {owner}'s {', '.join(t.releasable)} releasable on the server and "
                f"still gated after {world.bounds.rounds} rounds of reconciles (modes {modes})"
            )
