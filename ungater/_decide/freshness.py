"""Freshness: when a cached view is fresh enough to decide on, and when it must be read anew.

Caches lag the API server. Two marks say when a lag can matter (docs/safety.md):

- ``shrink_rv``: per owner, the newest resourceVersion at which it may have shrunk (one of its
  pods ended or went, or its own object's facts changed). An owner view or an active slice
  older than that may predate the shrink (Kueue lowers a shrunk owner's slice in place, after
  its pods went): a release is then decided on quorum reads of both (the fence);
- the term: ``term_rv`` is where this replica's leadership term began (the Lease write), and
  ``proven`` the owners whose cached pods a quorum read has matched since. Until every cache
  has seen past ``term_rv`` (``cache_versions``), an unproven owner's first release is decided
  on quorum reads: the previous leader's writes may not be in the caches yet.

``owner_rv`` is the version each cached owner was read at (by watch or by fresh read; the newer
wins). ``term_start`` gives the term's start from the moment this replica leads, before its
workers run, for telling the previous leader's releases from another writer's. All the
resourceVersion comparisons assume an etcd-backed API server (increasing integers across all
resources); where a version is not an integer, the mark is not set and nothing is compared.
No I/O here.
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
        self.shrink_rv: dict[OwnerKey, int] = {}
        self.owner_rv: dict[str, int] = {}
        self.term_rv = 0
        self.proven: set[OwnerKey] | None = None  # None: no proof needed (no term changed)
        self.cache_versions: Callable[[], Iterable[str]] = lambda: ()
        self.term_start: Callable[[], int] = lambda: self.term_rv

    def may_have_shrunk(self, key: OwnerKey, resource_version: int | None) -> None:
        """The owner may have shrunk at this version: views older than it may predate it."""
        if resource_version is not None:
            self.shrink_rv[key] = max(resource_version, self.shrink_rv.get(key, 0))

    def predates_shrink(self, key: OwnerKey, resource_version: int | None) -> bool:
        """Whether a view at ``resource_version`` may predate the owner's last shrink (a view
        whose version cannot be ordered may)."""
        freed = self.shrink_rv.get(key)
        return freed is not None and (resource_version is None or resource_version < freed)

    def begin_term(self, resource_version: int) -> None:
        """A term starts: every owner is unproven until a read or the caches show otherwise."""
        self.term_rv = resource_version
        self.proven = set()

    def unproven(self, key: OwnerKey) -> bool:
        """Whether this term has yet to show that the caches hold what the last leader did,
        for this owner: by a quorum read that matched them, or by every cache having seen
        past the term's start (then no owner needs a read any more)."""
        if self.proven is None or key in self.proven:
            return False
        seen = [version_number(v) for v in self.cache_versions()]
        if self.term_rv and seen and all(v is not None and v >= self.term_rv for v in seen):
            self.proven = None
            return False
        return True

    def prove(self, key: OwnerKey) -> None:
        if self.proven is not None:
            self.proven.add(key)
