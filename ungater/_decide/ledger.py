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
- ``foreign_seen``: pods another writer released, reported once;
- ``gone``: pods lately seen deleted, so a lagging watch's replay of their past is old news.

What a pod's view cannot tell (how fresh the owner, the slice or a whole cache is) is
``ungater._decide.freshness``'s. No I/O here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ungater._decide.expectations import Expectations
from ungater._decide.indexes import OwnerKey

__all__ = ["GONE_REMEMBERED", "Ledger", "Uncertain"]

#: How many deleted pods ``Ledger.gone`` remembers: far more than a lagging watch replays.
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
    def __init__(self, expectations_timeout: float, clock: Callable[[], float]) -> None:
        self.expectations = Expectations(expectations_timeout, clock)
        self.uncertain: dict[str, Uncertain] = {}
        self.written: dict[str, int] = {}
        self.ours: set[str] = set()
        self.where: dict[str, tuple[str, str]] = {}
        self.foreign_seen: set[str] = set()
        self.gone: dict[str, None] = {}

    def sending(
        self, key: OwnerKey, pods: Iterable[tuple[str, str, str, str]], view: object
    ) -> None:
        """Releases about to be sent, as (uid, namespace, name, tested resourceVersion): each
        is expected in ``view`` and uncertain until its request is answered."""
        pods = list(pods)
        self.expectations.expect(key, [uid for uid, *_ in pods], view)
        for uid, namespace, name, rv in pods:
            self.mine(uid, namespace, name)
            self.uncertain[uid] = Uncertain(key, namespace, name, rv)

    def mine(self, uid: str, namespace: str, name: str) -> None:
        """A pod whose gate we removed or may remove: its release is never another writer's."""
        self.ours.add(uid)
        self.where[uid] = (namespace, name)

    def not_mine(self, uid: str) -> None:
        """A release of ours that did not happen (refused, gone, never sent)."""
        self.ours.discard(uid)

    def wrote(self, uid: str, resource_version: int) -> None:
        """Our release produced this version of the pod: older views have not seen it."""
        self.written[uid] = max(resource_version, self.written.get(uid, 0))

    def behind(self, uid: str, resource_version: int | None) -> bool:
        """Whether a view of the pod at ``resource_version`` predates our release of it."""
        written = self.written.get(uid)
        return written is not None and (resource_version or -1) < written

    def released_unseen(self, uid: str, resource_version: int | None) -> bool:
        """Whether a view of the pod at ``resource_version`` has not shown a release this
        replica knows of: ours (``written``), or another writer's that any of its views has
        shown (``foreign_seen``; a gate never comes back, so the pod stays released)."""
        return uid in self.foreign_seen or self.behind(uid, resource_version)

    def locate(self, uid: str) -> tuple[str, str] | None:
        return self.where.get(uid)

    def forget_pod(self, uid: str) -> None:
        """A pod no view holds any more: drop what we kept about it, remember that it went."""
        self.ours.discard(uid)
        self.where.pop(uid, None)
        self.written.pop(uid, None)
        self.foreign_seen.discard(uid)
        self.uncertain.pop(uid, None)  # a release patch cannot land on a pod gone
        self.went(uid)

    def went(self, uid: str) -> None:
        """The pod is gone from the server: a lagging watch may still replay its past, and a
        gate removal there is old news (maybe our own unanswered release)."""
        self.gone.pop(uid, None)
        self.gone[uid] = None
        if len(self.gone) > GONE_REMEMBERED:
            del self.gone[next(iter(self.gone))]
