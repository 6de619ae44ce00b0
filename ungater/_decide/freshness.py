"""Freshness: whether a new term may trust its caches.

A new leader's caches may lag the previous leader's releases. ``term_rv`` is where this
replica's term began (the Lease write), and ``confirmed`` the owners whose cached pods a quorum
LIST has matched since. Until every cache has seen past ``term_rv`` (``cache_versions``), an
unconfirmed owner's release is decided on a quorum LIST of its pods (``view.quorum_snapshot``),
not on the pod cache. ``term_start`` gives the term's start from the moment this replica leads,
before its workers run, for telling the previous leader's releases from another writer's.

The comparisons assume an etcd-backed API server (increasing integers across all resources);
where a version is not an integer nothing is compared. No I/O here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ungater._decide.indexes import OwnerKey

__all__ = ["Freshness", "version_number"]


def version_number(resource_version: str) -> int | None:
    """An etcd-backed API server's resourceVersions are increasing integers across all
    resources; anything else cannot be ordered."""
    return int(resource_version) if resource_version.isdigit() else None


class Freshness:
    def __init__(self) -> None:
        self.term_rv = 0
        self.confirmed: set[OwnerKey] | None = None  # None: no proof needed (no term changed)
        self.cache_versions: Callable[[], Iterable[str]] = lambda: ()
        self.term_start: Callable[[], int] = lambda: self.term_rv

    def begin_term(self, resource_version: int) -> None:
        """A term starts: every owner is unconfirmed until a read or the caches show otherwise."""
        self.term_rv = resource_version
        self.confirmed = set()

    def unconfirmed(self, key: OwnerKey) -> bool:
        """Whether this term has yet to show that the caches hold what the last leader did,
        for this owner: by a quorum read that matched them, or by every cache having seen
        past the term's start (then no owner needs a read any more)."""
        if self.confirmed is None or key in self.confirmed:
            return False
        seen = [version_number(v) for v in self.cache_versions()]
        if self.term_rv and seen and all(v is not None and v >= self.term_rv for v in seen):
            self.confirmed = None
            return False
        return True

    def confirm(self, key: OwnerKey) -> None:
        if self.confirmed is not None:
            self.confirmed.add(key)
