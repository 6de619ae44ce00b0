"""Indexed in-memory caches of Workloads, pods, owners and intermediate objects.

Indexes make one reconcile cost O(pods of that owner): Workloads by their owner's UID, pods by
(namespace, value of the kind's pod label), owners' facts and intermediate objects by UID. The
cache also walks controller ownerReferences upwards, which both proves ownership and maps a pod
event to the owner that must be reconciled. Every index keeps the newer of two versions of an
object (``older``): a relist never takes one back.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ungater._decide.decision import Ownership
from ungater._model.views import Kind, ObjectRef, ObjectView, PodView, WorkloadView

__all__ = [
    "ChainResult",
    "ObjectIndex",
    "OwnerFacts",
    "OwnerIndex",
    "OwnerKey",
    "PodIndex",
    "WorkloadIndex",
    "older",
    "resolve_chain",
]

MAX_CHAIN = 8  # Pod -> Job -> JobSet is two hops; LWS workers four; deeper is not ours


@dataclass(frozen=True, slots=True)
class OwnerKey:
    """What the work queue is keyed by: stable across slice rollovers (owner UID, not a name)."""

    namespace: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.uid}"


class WorkloadIndex:
    """Workloads by UID, and by owner UID."""

    def __init__(self) -> None:
        self.by_uid: dict[str, WorkloadView] = {}
        self._by_owner: dict[str, set[str]] = defaultdict(set)

    def on_change(self, old: WorkloadView | None, new: WorkloadView | None) -> None:
        """Apply a watch event; an update older than the view held is ignored."""
        held = self.by_uid.get(new.uid) if new is not None else None
        if (
            new is not None
            and held is not None
            and older(new.resource_version, held.resource_version)
        ):
            return
        if old is not None:
            self.by_uid.pop(old.uid, None)
            if old.owner is not None:
                bucket = self._by_owner.get(old.owner.uid)
                if bucket is not None:
                    bucket.discard(old.uid)
                    if not bucket:
                        del self._by_owner[old.owner.uid]
        if new is not None:
            self.by_uid[new.uid] = new
            if new.owner is not None:
                self._by_owner[new.owner.uid].add(new.uid)

    def for_owner(self, owner_uid: str) -> list[WorkloadView]:
        return [self.by_uid[u] for u in self._by_owner.get(owner_uid, ())]

    def has_owner(self, owner_uid: str) -> bool:
        return owner_uid in self._by_owner

    def owner_keys(self) -> list[OwnerKey]:
        """Every owner with Workloads, as work queue keys."""
        keys = []
        for uid, wl_uids in self._by_owner.items():
            wl = self.by_uid[next(iter(wl_uids))]
            keys.append(OwnerKey(wl.namespace, uid))
        return keys

    def __len__(self) -> int:
        return len(self.by_uid)


class PodIndex:
    """Pods of one kind's pod watch, by UID and by (namespace, pod label value)."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.by_uid: dict[str, PodView] = {}
        self._by_value: dict[tuple[str, str], set[str]] = defaultdict(set)

    def _key(self, pod: PodView) -> tuple[str, str] | None:
        value = pod.labels.get(self.label)
        return (pod.namespace, value) if value is not None else None

    def on_change(self, old: PodView | None, new: PodView | None) -> None:
        if old is not None:
            self.by_uid.pop(old.uid, None)
            key = self._key(old)
            if key is not None:
                bucket = self._by_value.get(key)
                if bucket is not None:
                    bucket.discard(old.uid)
                    if not bucket:
                        del self._by_value[key]
        if new is not None:
            self.by_uid[new.uid] = new
            key = self._key(new)
            if key is not None:
                self._by_value[key].add(new.uid)

    def select(self, namespace: str, selector: Mapping[str, str]) -> list[PodView]:
        """Pods matching an equality selector; it must contain this index's label."""
        uids = self._by_value.get((namespace, selector[self.label]), ())
        if len(selector) == 1:  # the index's own label: every pod of the bucket matches it
            return [self.by_uid[u] for u in uids]
        pods = (self.by_uid[u] for u in uids)
        return [p for p in pods if all(p.labels.get(k) == v for k, v in selector.items())]

    def __len__(self) -> int:
        return len(self.by_uid)


@dataclass(frozen=True, slots=True)
class ChainResult:
    chain: tuple[ObjectRef, ...]
    ownership: Ownership


def resolve_chain(
    pod_controller: ObjectRef | None,
    owner: ObjectRef,
    objects: Mapping[str, ObjectView],
    intermediate_kinds: frozenset[Kind],
) -> ChainResult:
    """Follow controller references from a pod's controller up to ``owner``.

    Each hop must be a cached object whose UID matches the reference (names can be reused,
    UIDs cannot). Reaching the owner's UID gives a chain the plugin then checks; a hop to an
    intermediate kind that is not cached yet is UNRESOLVED (count it, never release it);
    anything else is FOREIGN.
    """
    chain: list[ObjectRef] = []
    ref = pod_controller
    while ref is not None and len(chain) < MAX_CHAIN:
        chain.append(ref)
        if ref.uid == owner.uid:
            return ChainResult(tuple(chain), Ownership.PROVEN)
        if ref.group_kind not in intermediate_kinds:
            break
        obj = objects.get(ref.uid)
        if obj is None:
            return ChainResult(tuple(chain), Ownership.UNRESOLVED)
        ref = obj.controller
    return ChainResult(tuple(chain), Ownership.FOREIGN)


def ancestors(pod_controller: ObjectRef | None, objects: Mapping[str, ObjectView]) -> list[str]:
    """UIDs of every controller above a pod (or intermediate object), nearest first."""
    out: list[str] = []
    ref = pod_controller
    while ref is not None and len(out) < MAX_CHAIN:
        out.append(ref.uid)
        obj = objects.get(ref.uid)
        ref = obj.controller if obj is not None else None
    return out


def older(resource_version: str, held: str) -> bool:
    """Whether ``resource_version`` is older than the ``held`` one. An etcd-backed API server's
    versions are increasing integers; anything else has no order, and the newcomer is taken."""
    if not (resource_version.isdigit() and held.isdigit()):
        return False
    return int(resource_version) < int(held)


@dataclass(frozen=True, slots=True)
class OwnerFacts:
    """What a plugin extracted from an owner object, kept instead of the object; ``error``
    when the plugin could not read it (the owner's size is then unknown: nothing is released)."""

    namespace: str
    uid: str
    facts: dict[str, Any]
    resource_version: str = ""
    error: str = ""


class OwnerIndex:
    """Each cached owner's facts by UID (the plugin's reading of it, not the object)."""

    def __init__(self) -> None:
        self._by_uid: dict[str, OwnerFacts] = {}

    def keep(self, view: OwnerFacts) -> None:
        held = self._by_uid.get(view.uid)
        if held is not None and older(view.resource_version, held.resource_version):
            return
        self._by_uid[view.uid] = view

    def forget(self, uid: str) -> None:
        self._by_uid.pop(uid, None)

    def get(self, uid: str) -> OwnerFacts | None:
        return self._by_uid.get(uid)

    def __contains__(self, uid: object) -> bool:
        return uid in self._by_uid

    def __len__(self) -> int:
        return len(self._by_uid)


class ObjectIndex:
    """Intermediate objects (a JobSet's Jobs, a RayJob's RayCluster) by UID, and by the UID
    of their controller."""

    def __init__(self) -> None:
        self.by_uid: dict[str, ObjectView] = {}
        self._controlled: dict[str, set[str]] = {}
        #: moves on every change: what was computed from these objects holds while it stands
        self.version = 0

    def keep(self, view: ObjectView) -> None:
        held = self.by_uid.get(view.uid)
        if held is not None:
            if older(view.resource_version, held.resource_version):
                return
            self.forget(held)
        self.version += 1
        self.by_uid[view.uid] = view
        if view.controller is not None:
            self._controlled.setdefault(view.controller.uid, set()).add(view.uid)

    def forget(self, view: ObjectView) -> None:
        self.version += 1
        held = self.by_uid.pop(view.uid, None)
        ctrl = held.controller if held is not None else None
        if ctrl is not None and ctrl.uid in self._controlled:
            self._controlled[ctrl.uid].discard(view.uid)
            if not self._controlled[ctrl.uid]:
                del self._controlled[ctrl.uid]

    def controlled_by(self, uid: str) -> list[ObjectView]:
        return [self.by_uid[u] for u in self._controlled.get(uid, ())]

    def sizes(self) -> dict[str, int]:
        return {"objects": len(self.by_uid), "controllers": len(self._controlled)}

    def __len__(self) -> int:
        return len(self.by_uid)
