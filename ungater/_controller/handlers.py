"""Watch events to owner keys: the reflectors' wiring and what each calls when its cache changes.

Every handler is synchronous and does no I/O: it updates an index, does the bookkeeping that
must happen in event order (an expectation observed, a release by another writer spotted, the
resourceVersion at which a released pod freed its slot, the moment a pod became releasable) and
enqueues the owners the change concerns. Pod updates that change nothing the decision reads
enqueue nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ungater._controller.notices import Notices
from ungater._controller.state import KindRuntime, State
from ungater._decide.freshness import version_number
from ungater._decide.indexes import OwnerFacts, OwnerKey
from ungater._kube.client import PODS, KubeClient, Resource
from ungater._kube.kueue import workload_resource
from ungater._kube.reflector import Reflector, from_list
from ungater._model.views import (
    ADMITTED,
    ObjectView,
    PodView,
    WorkloadView,
    parse_object,
    parse_pod,
    parse_workload,
)
from ungater.plugin_api import ResourceSpec

__all__ = ["EventHandlers"]


class EventHandlers:
    def __init__(self, state: State, notices: Notices) -> None:
        self.s = state
        self.notices = notices
        #: Told of each owner whose admission changed (the controller cuts its reads short).
        self.on_admission: Callable[[OwnerKey], object] = lambda key: None
        #: Told of each owner queued (a reconcile with a wave out decides again at once).
        self.on_change: Callable[[OwnerKey], object] = lambda key: None

    def _queue(self, key: OwnerKey) -> None:
        self.s.queue.add(key)
        self.on_change(key)

    def reflectors(
        self, client: KubeClient, workload_version: str, namespaces: Sequence[str | None]
    ) -> list[Reflector[Any]]:
        """One reflector per watched resource and namespace, each wired to its handler:
        Workloads, each kind's pods (by the kind's pod label), owners, intermediates."""
        w = self.s.config.watch
        common: dict[str, Any] = {
            "timeout_seconds": w.timeout_seconds,
            "silence_seconds": w.silence_seconds,
            "backoff_initial": w.backoff_initial_seconds,
            "backoff_max": w.backoff_max_seconds,
        }
        out: list[Reflector[Any]] = []

        def watch(res: Resource, ns: str | None, parse: Any, on_change: Any, sel: str) -> None:
            out.append(Reflector(client, res, ns, parse, on_change, label_selector=sel, **common))

        kinds = self.s.kinds.values()
        # each intermediate resource once; one that pods are selected through keeps its facts
        intermediates: dict[tuple[str, str, str, str], tuple[ResourceSpec, Any]] = {}
        for rt in kinds:
            for spec in rt.handler.spec.intermediates:
                key = (spec.group, spec.version, spec.plural, spec.label_selector)
                intermediates.setdefault(key, (spec, parse_object))
        for rt in kinds:
            via = rt.handler.spec.select_via
            if via is not None:
                key = (via.group, via.version, via.plural, via.label_selector)
                intermediates[key] = (via, self.via_parser(rt))
        for ns in namespaces:
            wl_res = workload_resource(workload_version)
            out.append(
                Reflector(client, wl_res, ns, self.parse_workload, self.on_workload, **common)
            )
            for rt in kinds:
                watch(PODS, ns, parse_pod, self.pod_handler(rt), rt.handler.spec.pod_label)
            for rt in kinds:
                o = rt.handler.spec.owner_resource
                if o is not None:
                    res = Resource(o.group, o.version, o.plural, o.kind)
                    watch(res, ns, self.owner_parser(rt), self.on_owner, o.label_selector)
            for spec, parse in intermediates.values():
                res = Resource(spec.group, spec.version, spec.plural, spec.kind)
                watch(res, ns, parse, self.on_object, spec.label_selector)
        return out

    # -- Workloads ------------------------------------------------------------------------------

    def parse_workload(self, obj: Mapping[str, Any]) -> WorkloadView | None:
        """Only elastic Workloads of a configured kind are cached at all."""
        wl = parse_workload(obj)
        if wl.owner is None or wl.owner.group_kind not in self.s.kinds:
            return None
        if self.s.config.require_elastic_annotation and not wl.elastic:
            return None
        return wl

    def on_workload(self, old: WorkloadView | None, new: WorkloadView | None) -> None:
        s = self.s
        s.workloads.on_change(old, new)
        if s.trace.on:
            _trace_workload(s, old, new)
        for wl in (old, new):
            if wl is not None and wl.owner is not None:
                self._queue(OwnerKey(wl.namespace, wl.owner.uid))
        if new is not None and new.owner is not None and _admission_changed(old, new):
            key = OwnerKey(new.namespace, new.owner.uid)
            s.releasable.room_made(key)
            self.on_admission(key)  # queued above: a view read for the old one is moot

    # -- owner objects and intermediates ---------------------------------------------------------

    def owner_parser(self, rt: KindRuntime) -> Callable[[Mapping[str, Any]], OwnerFacts | None]:
        return lambda obj: self.s.parse_owner(rt, obj)

    def on_owner(self, old: OwnerFacts | None, new: OwnerFacts | None) -> None:
        s = self.s
        if new is not None:
            if old is None or old.facts != new.facts:  # its size may have grown
                s.releasable.room_made(OwnerKey(new.namespace, new.uid))
            s.owners.keep(new)
        elif old is not None:
            s.owners.forget(old.uid)
            s.releasable.owner_gone(OwnerKey(old.namespace, old.uid))
        view = new or old
        if view is not None and s.workloads.has_owner(view.uid):
            self._queue(OwnerKey(view.namespace, view.uid))

    def via_parser(self, rt: KindRuntime) -> Callable[[Mapping[str, Any]], ObjectView]:
        return lambda obj: self.s.parse_via(rt, obj)

    def on_object(self, old: ObjectView | None, new: ObjectView | None) -> None:
        s = self.s
        if new is not None:
            s.objects.keep(new)
        elif old is not None:
            s.objects.forget(old)
        view = new or old
        if view is not None:
            ctrl = view.controller
            grew = new is not None and bool(new.facts) and (old is None or old.facts != new.facts)
            for key in s.owners_of(view.namespace, ctrl.uid if ctrl else None):
                if grew:  # the size of a select_via owner lives here
                    s.releasable.room_made(key)
                self._queue(key)

    # -- pods ------------------------------------------------------------------------------------

    def pod_handler(self, rt: KindRuntime) -> Callable[[PodView | None, PodView | None], None]:
        """The handler of one kind's pod watch (the same pod may be in several kinds' watches)."""
        s, gate = self.s, rt.gate

        def on_pod(old: PodView | None, new: PodView | None) -> None:
            rt.pods.on_change(old, new)
            pod = new or old
            if pod is None:
                return
            if new is not None:
                s.releasable.pod_seen(new.uid)
            settled = new is None or not new.has_gate(gate) or new.terminal or new.deleting
            expected = None
            if settled:
                # only this kind's own view clears what this kind's reconcile expects
                expected = s.ledger.expectations.observe(pod.uid, rt.kind)
                s.blocked.clear(pod.uid)
            if (  # the cheap tests first: every release of ours stops at is_ours
                old is not None
                and new is not None
                and old.has_gate(gate)
                and not new.has_gate(gate)
                and not s.ledger.is_ours(pod.uid)
                and not s.ledger.is_gone(pod.uid)  # a lagging watch replaying a gone pod's past
                and s.leading()  # a standby sees the leader's releases: not foreign
                and not from_list()  # a list shows a gate gone, not when it went
                and _after(pod, s.freshness.term_start())  # nor one older than this term
            ):
                if rt.mode == "release":
                    self.notices.foreign_release(new, rt, s.ledger.foreign(pod.uid))
                elif rt.stood_down:  # the other releaser is still at work: stay down longer
                    s.stand_down.still_at_work(str(rt.kind))
            if new is None and not any(pod.uid in k.pods.by_uid for k in s.kinds.values()):
                s.forget_pod(pod.uid)  # no view holds it any more
            if old is not None and new is not None and not _relevant_change(old, new):
                return
            # our own release, now shown: its pod counted in flight and now counts as released,
            # the same in every decision, so the owner needs no new one
            own = expected is not None and old is not None and _only_released(old, new, gate)
            ctrl = pod.controller
            keys = s.owners_of(pod.namespace, ctrl.uid if ctrl else None)
            freed = _released_live(old, gate) and not _released_live(new, gate)
            for key in keys:
                if s.trace.on:
                    s.trace.point("pod_event", key, pod=pod.uid, gone=new is None, ours=own)
                if own:
                    continue
                if freed:
                    s.releasable.room_made(key)
                self._queue(key)

        return on_pod


def _trace_workload(s: State, old: WorkloadView | None, new: WorkloadView | None) -> None:
    """A Workload event, as each owner it concerns sees it (``logging.trace``)."""
    keys = {OwnerKey(w.namespace, w.owner.uid) for w in (old, new) if w and w.owner}
    wl = new or old
    for key in keys:
        assert wl is not None
        s.trace.point(
            "workload_event",
            key,
            workload=wl.name,
            rv=wl.resource_version,
            admitted=new is not None and new.condition_true(ADMITTED),
            deleted=new is None,
        )


def _only_released(old: PodView, new: PodView | None, gate: str) -> bool:
    """The change is ``gate`` gone from a live pod, and nothing else the decision reads."""
    return (
        new is not None
        and _live(old)
        and _live(new)
        and gate in old.gates
        and tuple(g for g in old.gates if g != gate) == tuple(new.gates)
        and old.labels == new.labels
        and old.owner_refs == new.owner_refs
    )


def _relevant_change(old: PodView, new: PodView) -> bool:
    return (
        old.gates != new.gates
        or old.terminal != new.terminal
        or old.deleting != new.deleting
        or old.labels != new.labels
        or old.owner_refs != new.owner_refs
    )


def _admission_changed(old: WorkloadView | None, new: WorkloadView) -> bool:
    """An admitted slice that was not admitted before, or is admitted for other counts."""
    if not new.condition_true(ADMITTED):
        return False
    return old is None or not old.condition_true(ADMITTED) or old.assignments != new.assignments


def _released_live(pod: PodView | None, gate: str) -> bool:
    return _live(pod) and pod is not None and not pod.has_gate(gate)


def _live(pod: PodView | None) -> bool:
    return pod is not None and not pod.terminal and not pod.deleting


def _after(pod: PodView, resource_version: int) -> bool:
    """Whether this view of the pod is newer than ``resource_version`` (yes if unknowable)."""
    rv = version_number(pod.resource_version)
    return rv is None or rv > resource_version
