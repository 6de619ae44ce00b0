"""Admission checks' pod set updates: merged per pod set, then fitted to each pod. Pure.

A Workload admitted through admission checks (a ProvisioningRequest, say) may require its pods
to carry labels, annotations, node selector entries and tolerations so that they land on the
capacity provisioned for them. They must be applied in the same request that removes the gate,
so a pod never runs without them, and only as far as the API allows on a gated pod:

- labels and annotations may be set or changed (metadata is mutable);
- node selector entries may be added while the pod is gated, never changed or removed;
- tolerations may be added, never removed.

Two checks that disagree about a key make the whole pod set wait; a pod whose existing node
selector holds another value for a key waits alone. Nothing is ever applied in part.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ungater._model.views import PodSetUpdate, PodView

__all__ = ["PodChanges", "fit_to_pod", "merge_updates"]


@dataclass(frozen=True, slots=True)
class PodChanges:
    """What must change on one pod besides removing the gate; empty when nothing does."""

    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.labels or self.annotations or self.node_selector or self.tolerations)


NO_CHANGES = PodChanges()


def _merge_maps(
    what: str, sources: Iterable[tuple[str, Mapping[str, str]]]
) -> tuple[dict[str, str], str]:
    merged: dict[str, str] = {}
    owner: dict[str, str] = {}
    for check, values in sources:
        for k, v in values.items():
            if k in merged and merged[k] != v:
                return {}, (
                    f"admission checks disagree on {what} {k!r}: "
                    f"{owner[k]} wants {merged[k]!r}, {check} wants {v!r}"
                )
            merged[k] = v
            owner.setdefault(k, check)
    return merged, ""


def merge_updates(updates: Sequence[PodSetUpdate], pod_set: str) -> tuple[PodChanges, str]:
    """All checks' updates for ``pod_set`` together, or a reason why they cannot be merged."""
    mine = [u for u in updates if u.pod_set == pod_set]
    if not mine:
        return NO_CHANGES, ""
    parts: dict[str, dict[str, str]] = {}
    for what, attr in (
        ("label", "labels"),
        ("annotation", "annotations"),
        ("node selector", "node_selector"),
    ):
        merged, conflict = _merge_maps(what, ((u.check, getattr(u, attr)) for u in mine))
        if conflict:
            return NO_CHANGES, conflict
        parts[attr] = merged
    tolerations: list[Mapping[str, Any]] = []
    for u in mine:
        for t in u.tolerations:
            if t not in tolerations:
                tolerations.append(t)
    return PodChanges(tolerations=tuple(tolerations), **parts), ""


def fit_to_pod(changes: PodChanges, pod: PodView) -> tuple[PodChanges, str]:
    """The part of ``changes`` the pod lacks, or why it cannot take them.

    Only what differs is applied, so a pod that already carries every update gets a plain gate
    removal; a node selector key the pod holds with another value cannot be changed.
    """
    if not changes:
        return NO_CHANGES, ""
    for k, v in changes.node_selector.items():
        have = pod.node_selector.get(k)
        if have is not None and have != v:
            return NO_CHANGES, (
                f"node selector {k!r} is {have!r} on the pod, the admission wants {v!r} "
                "(a node selector entry cannot change)"
            )
    return PodChanges(
        labels={k: v for k, v in changes.labels.items() if pod.labels.get(k) != v},
        annotations={k: v for k, v in changes.annotations.items() if pod.annotations.get(k) != v},
        node_selector={
            k: v for k, v in changes.node_selector.items() if k not in pod.node_selector
        },
        tolerations=tuple(t for t in changes.tolerations if t not in pod.tolerations),
    ), ""
