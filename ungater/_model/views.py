"""Plain, immutable views of the Kubernetes objects the ungater reasons about.

The controller caches these slim views instead of whole API objects: they are what plugins and
the decision function receive, they cost a fraction of the memory of a full pod, and parsing
them from raw JSON is a pure function that can be tested without a cluster.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ungater._model.interning import Shared

__all__ = [
    "ADMITTED",
    "ELASTIC_ANNOTATION",
    "EVICTED",
    "FINISHED",
    "PODSET_LABEL",
    "SLICE_NAME_ANNOTATION",
    "SLICE_REPLACEMENT_ANNOTATION",
    "Condition",
    "Kind",
    "MalformedObject",
    "ObjectRef",
    "ObjectView",
    "PodSetAssignment",
    "PodSetSpec",
    "PodSetUpdate",
    "PodView",
    "WorkloadView",
    "parse_object",
    "parse_pod",
    "parse_workload",
]

ELASTIC_ANNOTATION = "kueue.x-k8s.io/elastic-job"
SLICE_NAME_ANNOTATION = "kueue.x-k8s.io/workload-slice-name"
SLICE_REPLACEMENT_ANNOTATION = "kueue.x-k8s.io/workload-slice-replacement-for"
PODSET_LABEL = "kueue.x-k8s.io/podset"
ADMITTED = "Admitted"
FINISHED = "Finished"
EVICTED = "Evicted"


class MalformedObject(ValueError):
    """Raised when an API object lacks a field the ungater cannot do without."""


@dataclass(frozen=True, slots=True)
class Kind:
    """An owner kind: API group (empty for the core group) and kind name."""

    group: str
    kind: str

    @classmethod
    def from_api_version(cls, api_version: str, kind: str) -> Kind:
        group = api_version.rpartition("/")[0] if "/" in api_version else ""
        return cls(group, kind)

    def __str__(self) -> str:
        return f"{self.kind}.{self.group}" if self.group else self.kind


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """An ownerReference: enough to name an object and prove identity by UID."""

    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool = False

    @property
    def group_kind(self) -> Kind:
        return Kind.from_api_version(self.api_version, self.kind)


@dataclass(frozen=True, slots=True)
class PodView:
    """What the ungater needs to know of a pod, and nothing more."""

    namespace: str
    name: str
    uid: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    owner_refs: tuple[ObjectRef, ...]
    creation_timestamp: str
    phase: str
    deleting: bool
    gates: tuple[str, ...]
    resource_version: str = ""
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()

    @property
    def controller(self) -> ObjectRef | None:
        return _controller_of(self.owner_refs)

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    def has_gate(self, gate: str) -> bool:
        return gate in self.gates


@dataclass(frozen=True, slots=True)
class ObjectView:
    """An intermediate owner (say a Job between a JobSet and its pods): identity and owners.

    ``facts``: what the plugin extracted from it when pods are selected through it (a RayJob's
    RayCluster holds the size); ``resource_version``: which version of it those facts are;
    ``facts_error``: why the plugin could not extract them (the size is then unknown)."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str
    labels: Mapping[str, str]
    owner_refs: tuple[ObjectRef, ...]
    resource_version: str = ""
    facts: Mapping[str, Any] = field(default_factory=dict)
    facts_error: str = ""

    @property
    def controller(self) -> ObjectRef | None:
        return _controller_of(self.owner_refs)

    @property
    def group_kind(self) -> Kind:
        return Kind.from_api_version(self.api_version, self.kind)

    @property
    def ref(self) -> ObjectRef:
        """The object as an ownerReference would name it."""
        return ObjectRef(self.api_version, self.kind, self.name, self.uid, True)


@dataclass(frozen=True, slots=True)
class Condition:
    status: str
    reason: str = ""
    transition_time: str = ""  # lastTransitionTime, RFC 3339


@dataclass(frozen=True, slots=True)
class PodSetSpec:
    name: str
    count: int | None  # None: the object did not say (malformed); the cap is then 0


@dataclass(frozen=True, slots=True)
class PodSetAssignment:
    name: str
    count: int | None  # None: absent, meaning "the pod set's spec count"
    invalid: bool = False  # a count was given but is not a non-negative integer


@dataclass(frozen=True, slots=True)
class PodSetUpdate:
    """What one admission check wants on the pods of one pod set (``podSetUpdates[]``)."""

    check: str
    pod_set: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class WorkloadView:
    """One Kueue Workload (one slice of an elastic job's chain)."""

    namespace: str
    name: str
    uid: str
    creation_timestamp: str
    annotations: Mapping[str, str]
    owner: ObjectRef | None
    pod_sets: tuple[PodSetSpec, ...]
    assignments: tuple[PodSetAssignment, ...] | None
    conditions: Mapping[str, Condition]
    resource_version: str = ""
    pod_set_updates: tuple[PodSetUpdate, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def replacement_for(self) -> str | None:
        return self.annotations.get(SLICE_REPLACEMENT_ANNOTATION)

    @property
    def elastic(self) -> bool:
        return self.annotations.get(ELASTIC_ANNOTATION) == "true"

    def condition_true(self, kind: str) -> bool:
        cond = self.conditions.get(kind)
        return cond is not None and cond.status == "True"


_T = TypeVar("_T")


def _total(parse: Callable[[Mapping[str, Any]], _T]) -> Callable[[Mapping[str, Any]], _T]:
    """Make a parser total: ill-typed input is a MalformedObject, never a stray TypeError
    that would stop a cache from syncing."""

    @functools.wraps(parse)
    def wrapper(obj: Mapping[str, Any]) -> _T:
        if not isinstance(obj, Mapping):
            raise MalformedObject(f"expected an object, got {type(obj).__name__}")
        try:
            return parse(obj)
        except MalformedObject:
            raise
        except (TypeError, AttributeError, ValueError, KeyError) as exc:
            raise MalformedObject(f"ill-typed field: {type(exc).__name__}: {exc}") from exc

    return wrapper


def _controller_of(refs: tuple[ObjectRef, ...]) -> ObjectRef | None:
    for ref in refs:
        if ref.controller:
            return ref
    return None


# values repeated across many views (label keys, owner names and uids, the namespace) are kept
# once; see ungater/_model/interning.py
_SHARED = Shared()
_text = _SHARED.text


def _str_map(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping) or not value:
        return _SHARED.mapping({})
    # keys and values shared, not the whole map: a pod's labels are often its own (an index)
    return {_text(str(k)): _text(str(v)) for k, v in value.items()}


def _owner_refs(meta: Mapping[str, Any]) -> tuple[ObjectRef, ...]:
    refs = []
    for raw in meta.get("ownerReferences") or ():
        if not isinstance(raw, Mapping):
            continue
        try:
            refs.append(
                ObjectRef(
                    api_version=_text(str(raw["apiVersion"])),
                    kind=_text(str(raw["kind"])),
                    name=_text(str(raw["name"])),
                    uid=_text(str(raw["uid"])),
                    controller=bool(raw.get("controller", False)),
                )
            )
        except KeyError:
            continue  # a reference without identity proves nothing
    return _SHARED.value(tuple(refs))  # frozen, so one copy serves every pod of an owner


def _metadata(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or not meta.get("name") or not meta.get("uid"):
        raise MalformedObject("metadata.name and metadata.uid are required")
    return meta


@_total
def parse_pod(obj: Mapping[str, Any]) -> PodView:
    """Build a PodView from a pod as the API serves it (camelCase JSON)."""
    meta = _metadata(obj)
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    gates = _SHARED.value(
        tuple(
            _text(str(g["name"]))
            for g in spec.get("schedulingGates") or ()
            if isinstance(g, Mapping) and "name" in g
        )
    )
    tolerations = tuple(
        _SHARED.mapping(t) for t in spec.get("tolerations") or () if isinstance(t, Mapping)
    )
    return PodView(
        namespace=_text(str(meta.get("namespace", ""))),
        name=str(meta["name"]),
        uid=str(meta["uid"]),
        labels=_str_map(meta.get("labels")),
        annotations=_str_map(meta.get("annotations")),
        owner_refs=_owner_refs(meta),
        creation_timestamp=_text(str(meta.get("creationTimestamp", ""))),
        phase=_text(str(status.get("phase", "Pending"))),
        deleting=bool(meta.get("deletionTimestamp")),
        gates=gates,
        resource_version=str(meta.get("resourceVersion", "")),
        node_selector=_str_map(spec.get("nodeSelector")),
        tolerations=tolerations,
    )


@_total
def parse_object(obj: Mapping[str, Any]) -> ObjectView:
    """Build an ObjectView of an intermediate owner from its raw JSON."""
    meta = _metadata(obj)
    return ObjectView(
        api_version=str(obj.get("apiVersion", "")),
        kind=str(obj.get("kind", "")),
        namespace=str(meta.get("namespace", "")),
        name=str(meta["name"]),
        uid=str(meta["uid"]),
        labels=_str_map(meta.get("labels")),
        owner_refs=_owner_refs(meta),
        resource_version=str(meta.get("resourceVersion", "")),
    )


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


@_total
def parse_workload(obj: Mapping[str, Any]) -> WorkloadView:
    """Build a WorkloadView from a v1beta2 or v1beta1 Workload.

    The fields read here have the same shape in both versions. Missing or ill-typed counts are
    kept as None so the decision can report them instead of guessing.
    """
    meta = _metadata(obj)
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    if not isinstance(spec, Mapping) or not isinstance(status, Mapping):
        raise MalformedObject("spec and status must be objects")
    pod_sets = tuple(
        PodSetSpec(name=str(ps.get("name") or "main"), count=_count(ps.get("count")))
        for ps in spec.get("podSets") or ()
        if isinstance(ps, Mapping)
    )
    assignments: tuple[PodSetAssignment, ...] | None = None
    admission = status.get("admission")
    if isinstance(admission, Mapping):
        assignments = tuple(
            PodSetAssignment(
                name=str(a.get("name") or "main"),
                count=_count(a.get("count")),
                invalid=a.get("count") is not None and _count(a.get("count")) is None,
            )
            for a in admission.get("podSetAssignments") or ()
            if isinstance(a, Mapping)
        )
    conditions = {
        str(c["type"]): Condition(
            status=str(c.get("status", "")),
            reason=str(c.get("reason", "")),
            transition_time=str(c.get("lastTransitionTime", "")),
        )
        for c in status.get("conditions") or ()
        if isinstance(c, Mapping) and "type" in c
    }
    updates = tuple(
        PodSetUpdate(
            check=str(check.get("name", "")),
            pod_set=str(u.get("name") or "main"),
            labels=_str_map(u.get("labels")),
            annotations=_str_map(u.get("annotations")),
            node_selector=_str_map(u.get("nodeSelector")),
            tolerations=tuple(t for t in u.get("tolerations") or () if isinstance(t, Mapping)),
        )
        for check in status.get("admissionChecks") or ()
        if isinstance(check, Mapping)
        for u in check.get("podSetUpdates") or ()
        if isinstance(u, Mapping)
    )
    refs = _owner_refs(meta)
    return WorkloadView(
        namespace=str(meta.get("namespace", "")),
        name=str(meta["name"]),
        uid=str(meta["uid"]),
        creation_timestamp=str(meta.get("creationTimestamp", "")),
        annotations=_str_map(meta.get("annotations")),
        owner=_controller_of(refs),
        pod_sets=pod_sets,
        assignments=assignments,
        conditions=conditions,
        resource_version=str(meta.get("resourceVersion", "")),
        pod_set_updates=updates,
    )
