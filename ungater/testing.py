"""A kit for testing an ungater plugin without ungater's internals.

A plugin author writes raw objects shaped as their controller makes them (dicts, as the API
server returns them) and asks what ungater would do with them:

    plugin = PluginUnderTest.from_module(my_plugin, ("example.com", "Widget"))
    outcome = plugin.decide(owner, pods, [slice_workload(owner, {"main": 4}, {"main": 2})])
    assert outcome.released == ["widget-0", "widget-1"]
    print(outcome.text())           # the same reasons `ungater explain` gives

Every hook is called the way the controller calls it: through pluggy and the checks that turn
a wrong answer into a ``PluginError``, so a test catches what production would reject. The
ownership proof, the release order, the release groups and the cap are ungater's own code, not a
copy. ``slice_workload`` builds a Workload slice as Kueue writes it; ``owner_ref`` and
``new_uid`` help build the ownerReferences chains the proof follows. The real-control-plane
fixtures (``control_plane``, ``kube_namespace``, ``kueue_cluster``) come from the pytest plugin
installed with the dev tools.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Any

from ungater._decide.assess import owner_facts_of, pod_facts, pod_selectors, via_objects
from ungater._decide.decision import Decision, decide
from ungater._model.config import DEFAULT_GATE
from ungater._model.views import (
    Kind,
    ObjectRef,
    ObjectView,
    PodView,
    parse_object,
    parse_pod,
    parse_workload,
)
from ungater._plugins.registry import KindHandler, PluginRegistry
from ungater.plugin_api import KindSpec, ReleaseGroup

__all__ = [
    "GATE",
    "Outcome",
    "PluginUnderTest",
    "new_uid",
    "owner_ref",
    "pod_view",
    "ref_of",
    "slice_workload",
]

GATE = DEFAULT_GATE
Obj = Mapping[str, Any]


def new_uid(*parts: str) -> str:
    """A UID derived from ``parts``: the same parts give the same UID in every run."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, "/".join(parts)))


def owner_ref(obj: Obj, *, controller: bool = True) -> dict[str, Any]:
    """The ownerReference a controller writes into the objects it creates from ``obj``."""
    meta = obj["metadata"]
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": controller,
        "blockOwnerDeletion": True,
    }


def ref_of(obj: Obj) -> ObjectRef:
    """The owner as a hook receives it (for calling a hook function directly)."""
    meta = obj["metadata"]
    return ObjectRef(str(obj["apiVersion"]), str(obj["kind"]), meta["name"], meta["uid"], True)


def pod_view(pod: Obj) -> PodView:
    """A raw pod as a hook receives it (for calling a hook function directly)."""
    return parse_pod(pod)


def slice_workload(
    owner: Obj,
    pod_sets: Mapping[str, int],
    admitted: Mapping[str, int] | None = None,
    *,
    name: str | None = None,
    replaces: str | None = None,
    finished: bool = False,
) -> dict[str, Any]:
    """A Workload slice of ``owner`` as Kueue writes it: the elastic annotation, the slice
    annotations, the owner as controller, ``pod_sets`` asked for, and with ``admitted`` an
    admission of those counts (``QuotaReserved`` and ``Admitted`` true)."""
    meta = owner["metadata"]
    wl_name = name or f"{str(owner['kind']).lower()}-{meta['name']}-{new_uid(meta['uid'])[:5]}"
    annotations = {
        "kueue.x-k8s.io/elastic-job": "true",
        "kueue.x-k8s.io/workload-slice-name": wl_name,
    }
    if replaces:
        annotations["kueue.x-k8s.io/workload-slice-replacement-for"] = (
            f"{meta.get('namespace', '')}/{replaces}"
        )
    wl: dict[str, Any] = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": wl_name,
            "namespace": meta.get("namespace", ""),
            "uid": new_uid("workload", meta["uid"], wl_name),
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "annotations": annotations,
            "ownerReferences": [owner_ref(owner)],
        },
        "spec": {"podSets": [{"name": n, "count": c} for n, c in pod_sets.items()]},
        "status": {"conditions": []},
    }
    conditions = wl["status"]["conditions"]
    if admitted is not None:
        wl["status"]["admission"] = {
            "clusterQueue": "cluster-queue",
            "podSetAssignments": [{"name": n, "count": c} for n, c in admitted.items()],
        }
        conditions += [_condition("QuotaReserved"), _condition("Admitted")]
    if finished:
        conditions.append(_condition("Finished", "WorkloadSliceReplaced"))
    return wl


def _condition(kind: str, reason: str = "") -> dict[str, str]:
    return {
        "type": kind,
        "status": "True",
        "reason": reason or kind,
        "message": "",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }


@dataclass(frozen=True)
class Outcome:
    """What ungater would do with the objects: the pods it would release now, in order, and
    why each other gated pod waits."""

    active_slice: str | None
    summary: str
    released: list[str]
    waiting: dict[str, str]
    caps: dict[str, int] = field(default_factory=dict)
    decision: Decision | None = None  # the core's own record, for what the above leaves out

    def text(self) -> str:
        """A short explanation in the words of ``ungater explain``."""
        d = self.decision
        lines = [f"slice: {self.active_slice or '-'} ({self.summary})"]
        for report in d.pod_sets if d is not None else ():
            lines.append(
                f"pod set {report.name}: cap {report.cap}, released {report.live_ungated}, "
                f"releasing {len(report.chosen)}"
            )
        lines += [f"  {pod}: waits: {why}" for pod, why in self.waiting.items()]
        return "\n".join(lines)


class PluginUnderTest:
    """One kind of one plugin, loaded as ``ungater run`` loads it."""

    def __init__(self, registry: PluginRegistry, kind: Kind) -> None:
        failures = {p.name: p.error for p in registry.failures}
        if failures:
            raise AssertionError(f"the plugin was rejected: {failures}")
        self.registry = registry
        self.kind = kind
        self._handler: KindHandler = registry.handler(kind)

    @classmethod
    def from_module(
        cls, module: ModuleType | object, kind: tuple[str, str], name: str = "plugin-under-test"
    ) -> PluginUnderTest:
        """The plugin ``module`` (not installed), registered under ``name``."""
        return cls(PluginRegistry.from_modules({name: module}), Kind(*kind))

    @classmethod
    def installed(cls, name: str, kind: tuple[str, str]) -> PluginUnderTest:
        """The plugin installed under entry point ``name`` (proves the packaging too)."""
        return cls(PluginRegistry.discover(allow=[name]), Kind(*kind))

    @property
    def spec(self) -> KindSpec:
        return self._handler.spec

    @property
    def distribution(self) -> str:
        """The installed distribution that provides the plugin ("" when not installed)."""
        return self._handler.plugin.distribution

    # -- the hooks, as the controller calls them --------------------------------------------

    def pod_selector(self, owner: Obj) -> dict[str, str]:
        return self._handler.pod_selector(ref_of(owner))

    def pod_set(self, owner: Obj, pod: Obj) -> str | None:
        return self._handler.pod_set(ref_of(owner), parse_pod(pod))

    def sort_key(self, owner: Obj, pod: Obj) -> tuple[int | str, ...]:
        return self._handler.sort_key(ref_of(owner), parse_pod(pod))

    def release_group(
        self, owner: Obj, pod: Obj, intermediates: Iterable[Obj] = ()
    ) -> ReleaseGroup | None:
        facts = self._owner_facts(owner, self._objects(intermediates))
        return self._handler.release_group(ref_of(owner), parse_pod(pod), facts)

    def desired_counts(
        self, owner: Obj, intermediates: Iterable[Obj] = ()
    ) -> dict[str, int] | None:
        """The owner's own size per pod set (for a ``select_via`` kind: from the objects between
        among ``intermediates``)."""
        facts = self._owner_facts(owner, self._objects(intermediates))
        return self._handler.desired_counts(facts) if facts is not None else None

    def pod_selectors(self, owner: Obj, intermediates: Iterable[Obj] = ()) -> list[dict[str, str]]:
        """The selectors the controller finds ``owner``'s candidate pods with."""
        objects = self._objects(intermediates)
        vias = via_objects(self._handler, ref_of(owner), objects.values())
        return pod_selectors(self._handler, ref_of(owner), vias)

    def ownership(
        self, owner: Obj, pods: Sequence[Obj], intermediates: Iterable[Obj] = ()
    ) -> list[str]:
        """Per pod: ``proven``, ``foreign`` (not the owner's) or ``unresolved`` (a hop of its
        ownerReferences chain is not among ``intermediates``)."""
        facts = self._facts(owner, pods, intermediates)
        return [f.ownership.value for f in facts]

    # -- whole decisions ----------------------------------------------------------------------

    def decide(
        self,
        owner: Obj,
        pods: Sequence[Obj],
        workloads: Sequence[Obj],
        intermediates: Iterable[Obj] = (),
        *,
        gate: str = GATE,
        owner_size: bool = True,
    ) -> Outcome:
        """What the controller would release now for ``owner``, given these objects in its
        caches (``owner_size``: bound the cap by the plugin's desired counts, as it does)."""
        intermediates = list(intermediates)
        facts = self._facts(owner, pods, intermediates)
        desired = self.desired_counts(owner, intermediates) if owner_size else None
        decision = decide([parse_workload(w) for w in workloads], facts, gate, desired=desired)
        waiting = {w.pod: w.reason for r in decision.pod_sets for w in r.waiting}
        waiting.update({w.pod: w.reason for w in decision.unmapped})
        return Outcome(
            decision.active_slice,
            decision.summary,
            decision.released_names,
            waiting,
            {r.name: r.cap for r in decision.pod_sets},
            decision,
        )

    def _objects(self, intermediates: Iterable[Obj]) -> dict[str, ObjectView]:
        """The intermediates as the core caches them (with the plugin's facts of those that
        pods are selected through)."""
        via = self.spec.select_via
        out = {}
        for raw in intermediates:
            view = parse_object(raw)
            if via is not None and view.group_kind == via.group_kind:
                view = replace(view, facts=self._handler.owner_facts(raw))
            out[view.uid] = view
        return out

    def _owner_facts(self, owner: Obj, objects: Mapping[str, ObjectView]) -> Any:
        if self.spec.select_via is None:
            return self._handler.owner_facts(owner)
        own = self._handler.owner_facts(owner) if self.spec.owner_resource else None
        vias = via_objects(self._handler, ref_of(owner), objects.values())
        return owner_facts_of(self._handler, own, vias)

    def _facts(self, owner: Obj, pods: Sequence[Obj], intermediates: Iterable[Obj]) -> Any:
        objects = self._objects(intermediates)
        owner_facts = self._owner_facts(owner, objects)
        return pod_facts(
            self._handler, ref_of(owner), [parse_pod(p) for p in pods], objects, owner_facts
        )
