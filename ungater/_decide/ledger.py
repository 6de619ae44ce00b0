"""The write ledger: everything this replica knows about writes to the gates of its pods, its
own and other writers', in one place.

A release decision counts a pod as released when the deciding view shows it released *or* the
ledger says a write of ours may have released it and the view has not shown it yet. That is
the one rule the parts below serve (docs/safety.md, "Our own writes"):

- ``expectations``: releases answered "done" that the deciding pod index has not shown yet;
  while one is pending the owner is not decided on at all;
- ``uncertain``: releases sent whose answer never came; they may land at any time, until a
  read shows the pod at another version than the one the patch tests (or a fence makes it so);
- ``written``: the resourceVersion each release of ours produced; a view of the pod older
  than that has not seen our write, whatever watch it came from;
- ``ours`` and ``where``: the pods we patch or patched, and where they are (namespace, name),
  so that a pod the deciding cache never held can still be read back from the API server;
- ``foreign``: pods another writer released, reported once;
- ``gone``: pods lately seen deleted, so a lagging watch's replay of their past is old news.

What a pod's view cannot tell (how fresh the owner, the slice or a whole cache is) is
``ungater._decide.freshness``'s. No I/O here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from ungater._decide.expectations import Expectations
from ungater._decide.indexes import OwnerKey

__all__ = ["GONE_REMEMBERED", "Ledger", "Uncertain"]

#: How many deleted pods the ledger remembers: far more than a lagging watch replays.
GONE_REMEMBERED = 4096


@dataclass(frozen=True, slots=True)
class Uncertain:
    """A release patch sent whose outcome we do not know (no answer yet, a timeout, a 5xx, a
    cancelled request). It counts as released until a read proves it cannot land."""

    key: OwnerKey
    namespace: str
    name: str
    resource_version: str  # the one the patch tests: it can land only on the pod at this version


class Ledger:
    """The records above, each private to the ledger and changed only through its methods."""

    def __init__(self, expectations_timeout: float, clock: Callable[[], float]) -> None:
        self.expectations = Expectations(expectations_timeout, clock)
        self._uncertain: dict[str, Uncertain] = {}
        self._written: dict[str, int] = {}
        self._ours: set[str] = set()
        self._where: dict[str, tuple[str, str]] = {}
        self._foreign: set[str] = set()
        self._gone: dict[str, None] = {}

    # -- our releases --------------------------------------------------------------------------

    def sending(
        self, key: OwnerKey, pods: Iterable[tuple[str, str, str, str]], view: object
    ) -> None:
        """Releases about to be sent, as (uid, namespace, name, tested resourceVersion): each
        is expected in ``view`` and uncertain until its request is answered."""
        pods = list(pods)
        self.expectations.expect(key, [uid for uid, *_ in pods], view)
        for uid, namespace, name, rv in pods:
            self.mine(uid, namespace, name)
            self._uncertain[uid] = Uncertain(key, namespace, name, rv)

    def mine(self, uid: str, namespace: str, name: str) -> None:
        """A pod whose gate we removed or may remove: its release is never another writer's."""
        self._ours.add(uid)
        self._where[uid] = (namespace, name)

    def not_mine(self, uid: str) -> None:
        """A release of ours that did not happen (refused, gone, never sent)."""
        self._ours.discard(uid)

    def is_ours(self, uid: str) -> bool:
        return uid in self._ours

    def wrote(self, uid: str, resource_version: int) -> None:
        """Our release produced this version of the pod: older views have not seen it."""
        self._written[uid] = max(resource_version, self._written.get(uid, 0))

    def written(self, uid: str) -> int | None:
        """The version our release of the pod produced, if a release of ours landed."""
        return self._written.get(uid)

    def behind(self, uid: str, resource_version: int | None) -> bool:
        """Whether a view of the pod at ``resource_version`` predates our release of it."""
        written = self._written.get(uid)
        return written is not None and (resource_version or -1) < written

    def locate(self, uid: str) -> tuple[str, str] | None:
        return self._where.get(uid)

    # -- releases whose answer never came --------------------------------------------------------

    def uncertain(self, uid: str) -> Uncertain | None:
        return self._uncertain.get(uid)

    def uncertain_of(self, key: OwnerKey) -> list[tuple[str, Uncertain]]:
        """This owner's unanswered releases, as (pod uid, what was sent)."""
        return [(uid, u) for uid, u in self._uncertain.items() if u.key == key]

    def uncertain_pods(self) -> frozenset[str]:
        """Every pod with an unanswered release: in flight, for any owner's decision."""
        return frozenset(self._uncertain)

    def resent(self, uid: str, resource_version: str) -> None:
        """A refused release sent again on the pod at ``resource_version``: the refused one
        never lands, the one resent may."""
        u = self._uncertain.get(uid)
        if u is not None:
            self._uncertain[uid] = replace(u, resource_version=resource_version)

    def answered(self, uid: str) -> None:
        """The release's outcome is known (an answer came, or a read settled it)."""
        self._uncertain.pop(uid, None)

    # -- other writers' releases, and pods gone ----------------------------------------------------

    def foreign(self, uid: str) -> bool:
        """Another writer released this pod; True the first time it is noted (report it once)."""
        if uid in self._foreign:
            return False
        self._foreign.add(uid)
        return True

    def released_unseen(self, uid: str, resource_version: int | None) -> bool:
        """Whether a view of the pod at ``resource_version`` has not shown a release this
        replica knows of: ours (``written``), or another writer's that any of its views has
        shown (a gate never comes back, so the pod stays released)."""
        return uid in self._foreign or self.behind(uid, resource_version)

    def known_released(self, uid: str) -> bool:
        """Whether the gate is known gone: by another writer's hand, or by a write of ours."""
        return uid in self._foreign or uid in self._written

    def is_gone(self, uid: str) -> bool:
        return uid in self._gone

    def forget_pod(self, uid: str) -> None:
        """A pod no view holds any more: drop what we kept about it, remember that it went."""
        self._ours.discard(uid)
        self._where.pop(uid, None)
        self._written.pop(uid, None)
        self._foreign.discard(uid)
        self._uncertain.pop(uid, None)  # a release patch cannot land on a pod gone
        self.went(uid)

    def went(self, uid: str) -> None:
        """The pod is gone from the server: a lagging watch may still replay its past, and a
        gate removal there is old news (maybe our own unanswered release)."""
        self._gone.pop(uid, None)
        self._gone[uid] = None
        if len(self._gone) > GONE_REMEMBERED:
            del self._gone[next(iter(self._gone))]

    # -- read-only copies, for tools and tests ----------------------------------------------------

    def ours(self) -> frozenset[str]:
        return frozenset(self._ours)

    def written_pods(self) -> frozenset[str]:
        return frozenset(self._written)

    def foreign_pods(self) -> frozenset[str]:
        return frozenset(self._foreign)

    def sizes(self) -> dict[str, int]:
        """How many entries each record holds (``gone`` is bounded by ``GONE_REMEMBERED``)."""
        return {
            "expectations": len(self.expectations),
            "ours": len(self._ours),
            "where": len(self._where),
            "written": len(self._written),
            "uncertain": len(self._uncertain),
            "foreign": len(self._foreign),
            "gone": len(self._gone),
        }
