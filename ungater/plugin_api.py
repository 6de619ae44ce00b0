"""The public API for plugin authors: the hook marker, the data types hooks exchange, helpers.

A plugin imports only this module. Everything here is plain data and pure functions, so a
plugin can be tested with nothing but hand-written pod dictionaries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pluggy

from ungater._model.views import PODSET_LABEL, Kind, ObjectRef, PodView, parse_pod

__all__ = [
    "PODSET_LABEL",
    "VIA_FACTS",
    "Kind",
    "KindSpec",
    "ObjectRef",
    "PodView",
    "ReleaseGroup",
    "ResourceSpec",
    "chain_matches",
    "hookimpl",
    "int_or_none",
    "kueue_pod_set",
    "parse_pod",
]

PROJECT = "ungater"
VIA_FACTS = "ungater.via"
"""The owner-facts key under which a ``select_via`` kind's hooks find, per object in between
(by name), what ``ungater_owner_facts`` extracted from it."""
hookimpl = pluggy.HookimplMarker(PROJECT)
"""Decorate a module-level function with this to implement a hook."""


@dataclass(frozen=True, slots=True)
class ResourceSpec:
    """An API resource the core must list and watch on a plugin's behalf.

    ``label_selector`` narrows the watch on the server, so the cache holds only objects that
    can matter (for example, Jobs that belong to some JobSet).
    """

    group: str
    version: str
    kind: str
    plural: str
    label_selector: str = ""

    @property
    def group_kind(self) -> Kind:
        return Kind(self.group, self.kind)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


@dataclass(frozen=True, slots=True)
class KindSpec:
    """One owner kind a plugin serves.

    - ``pod_label``: a label every pod of such an owner carries, whose value is what
      ``ungater_pod_selector`` puts there; the core watches pods that have it and indexes
      them by its value, so one reconcile touches only that owner's pods.
    - ``intermediates``: kinds that sit between the owner and its pods in the ownerReference
      chain (a JobSet's child Jobs). The core caches them so ownership can be proven.
    - ``owner_resource``: set it when the plugin needs facts from the owner object itself (a
      RayCluster's ``numOfHosts`` per worker group). The core watches these objects, keeps only
      what ``ungater_owner_facts`` extracts, and passes it to ``ungater_release_group``.
    - ``select_via``: when no label of the pods names the owner (a RayJob's pods name only the
      RayCluster it created), the resource of the objects in between. The core caches them,
      and selects the pods of each one whose controller reference carries the owner's UID by
      calling ``ungater_pod_selector`` with *that object's* reference. It keeps what
      ``ungater_owner_facts`` extracts from each such object (the size lives there) and hands
      the hooks ``{VIA_FACTS: {object name: its facts}}``, merged into the owner's own facts.
      Ownership is still proven by the UID chain Pod -> that object -> owner.
    """

    group: str
    kind: str
    pod_label: str
    intermediates: tuple[ResourceSpec, ...] = ()
    owner_resource: ResourceSpec | None = None
    select_via: ResourceSpec | None = None

    @property
    def group_kind(self) -> Kind:
        return Kind(self.group, self.kind)


@dataclass(frozen=True, slots=True)
class ReleaseGroup:
    """Pods that must be released together, or not at all (a multi-host replica).

    ``size`` is how many pods the group has when complete; when it is given, a group with
    fewer pods present waits. ``None`` means "whatever members exist".
    """

    key: str
    size: int | None = None


def kueue_pod_set(pod: PodView) -> str | None:
    """The pod set Kueue stamped on the pod's template at admission, when present."""
    return pod.labels.get(PODSET_LABEL) or None


def int_or_none(value: str | None) -> int | None:
    """Parse a label or annotation holding a non-negative integer; None when it does not."""
    if value is None or not (value.isascii() and value.isdigit()) or len(value) > 18:
        return None  # only plain ASCII digits, and short enough to be an index
    return int(value)


def chain_matches(owner: ObjectRef, chain: Sequence[ObjectRef], kinds: Sequence[Kind]) -> bool:
    """True when ``chain`` is exactly ``kinds`` long, each hop of the expected kind, and ends
    at ``owner`` by UID.

    ``chain`` lists the controller ownerReferences from the pod upwards as the core resolved
    them from its caches: ``chain[0]`` is the pod's controller, ``chain[-1]`` the top.
    """
    if len(chain) != len(kinds) or not chain:
        return False
    for ref, kind in zip(chain, kinds, strict=True):
        if ref.group_kind != kind:
            return False
    top = chain[-1]
    return top.uid == owner.uid and top.group_kind == owner.group_kind
