"""Indexed in-memory caches of Workloads, pods and intermediate owners.

Indexes make one reconcile cost O(pods of that owner): Workloads by their owner's UID, pods by
(namespace, value of the kind's pod label), intermediate owners by UID. The cache also walks
controller ownerReferences upwards, which both proves ownership and maps a pod event to the
owner that must be reconciled.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ungater._decide.decision import Ownership
from ungater._model.views import Kind, ObjectRef, ObjectView, PodView, WorkloadView

__all__ = ["ChainResult", "OwnerKey", "PodIndex", "WorkloadIndex", "resolve_chain"]

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
        """Apply a watch event; an update older than the view held (a fresh read got ahead of
        the watch) is ignored, so a quorum read is never undone by a late event."""
        if new is not None and _older(new, self.by_uid.get(new.uid)):
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

    def owners(self) -> Iterable[str]:
        return list(self._by_owner)

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


def _older(view: WorkloadView, held: WorkloadView | None) -> bool:
    if held is None:
        return False
    try:
        return int(view.resource_version) < int(held.resource_version)
    except ValueError:  # not an etcd integer: no order known, take the event
        return False
