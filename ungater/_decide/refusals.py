"""Release patches the API server refuses for good, and the per-pod backoff that follows.

A guarded release patch can fail for two very different reasons. Our view was stale (409, or a
JSON-patch ``test`` that no longer holds, which the API server reports as a generic 422): the
next decision, on a fresher view, fixes it. Or something in the admission chain refuses the
change itself (another webhook, a ValidatingAdmissionPolicy, RBAC, pod validation: 403, 400,
or a 422 that is *not* a JSON-patch failure): retrying at once only repeats the refusal for
ever (kueue#9492). ``classify_patch_error`` tells them apart; ``BlockedReleases`` remembers each
refused pod with an exponential backoff up to a long ceiling, so the decision leaves it gated
(and uncounted) while other pods and owners keep moving. Pure apart from an injected clock.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

__all__ = [
    "BlockedPod",
    "BlockedReleases",
    "PatchOutcome",
    "classify_patch_error",
    "server_message",
]


class PatchOutcome(StrEnum):
    """What became of one release patch (the values are the ``outcome`` label of
    ``ungater_patches_total``)."""

    RELEASED = "released"
    DELETING = "deleting"  # it landed on a pod already being deleted: no release
    BLOCKED = "blocked"  # refused for good: the pod backs off
    GONE = "gone"
    CONFLICT = "conflict"  # changed under us: re-decide
    SKIPPED = "skipped"  # not sent: leadership lost, or the kind turned to audit
    SUPERSEDED = "superseded"  # not sent: the caches moved since the decision (decide again)
    ERROR = "error"  # no answer, or a transient one: it may have landed


#: What the API server says when a JSON patch cannot be applied to the object as it is now
#: (a failed ``test``, a path that no longer exists): ``NewGenericServerResponse`` for 422.
_GENERIC_422 = "the server rejected our request due to an error in our request"
#: Words of the JSON-patch library's errors, found in the Status causes of such a 422.
_PATCH_APPLY_WORDS = ("testing value", "test failed", "doc is missing", "unable to remove")


def _status(body: str) -> Mapping[str, Any]:
    try:
        data = json.loads(body) if body else {}
    except ValueError:
        return {}
    return data if isinstance(data, Mapping) else {}


def server_message(message: str, body: str) -> str:
    """The most telling text of an error answer: the Status message, plus its causes."""
    status = _status(body)
    text = str(status.get("message") or message or "")
    causes = (status.get("details") or {}).get("causes") or ()
    extra = [str(c.get("message", "")) for c in causes if isinstance(c, Mapping)]
    extra = [c for c in extra if c and c not in text]
    return "; ".join([text, *extra]) if extra else text


def classify_patch_error(status: int, message: str = "", body: str = "") -> PatchOutcome:
    """``gone``, ``conflict`` (stale view: re-decide soon), ``blocked`` (refused for good:
    back off long) or ``error`` (transient: retry with the key's backoff)."""
    if status == 404:
        return PatchOutcome.GONE
    if status == 409:
        return PatchOutcome.CONFLICT
    if status == 422:
        full = server_message(message, body)
        lowered = full.lower()
        if lowered.startswith(_GENERIC_422) or any(w in lowered for w in _PATCH_APPLY_WORDS):
            return PatchOutcome.CONFLICT
        return PatchOutcome.BLOCKED
    if status in (400, 403):
        return PatchOutcome.BLOCKED
    return PatchOutcome.ERROR


@dataclass(frozen=True, slots=True)
class BlockedPod:
    namespace: str
    name: str
    status: int
    message: str
    failures: int
    retry_at: float  # clock time of the next attempt

    def reason(self, now: float) -> str:
        wait = max(0.0, self.retry_at - now)
        return (
            f"release refused by the API server (HTTP {self.status}, {self.failures} time"
            f"{'' if self.failures == 1 else 's'}): {self.message}; next try in {wait:.0f}s"
        )


class BlockedReleases:
    """Pods whose release patch was refused for good, by UID, with a per-pod backoff
    (``initial`` seconds, doubling up to ``ceiling``)."""

    def __init__(
        self,
        initial: float = 5.0,
        ceiling: float = 900.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.initial = initial
        self.ceiling = ceiling
        self.clock = clock
        self._pods: dict[str, BlockedPod] = {}
        self.total = 0

    def __len__(self) -> int:
        return len(self._pods)

    def __contains__(self, uid: object) -> bool:
        return uid in self._pods

    def get(self, uid: str) -> BlockedPod | None:
        return self._pods.get(uid)

    def record(self, uid: str, namespace: str, name: str, status: int, message: str) -> BlockedPod:
        """One more refusal of this pod's release; returns its entry (with the next try)."""
        previous = self._pods.get(uid)
        failures = previous.failures + 1 if previous is not None else 1
        delay = min(self.ceiling, self.initial * (2 ** min(failures - 1, 62)))
        entry = BlockedPod(namespace, name, status, message, failures, self.clock() + delay)
        self._pods[uid] = entry
        self.total += 1
        return entry

    def clear(self, uid: str) -> None:
        """The pod was released, lost the gate or is gone: nothing is blocked any more."""
        self._pods.pop(uid, None)

    def waiting(self, uids: Any = None) -> dict[str, str]:
        """UID -> reason of the pods still in backoff (of ``uids``, if given): the decision
        leaves them gated and uncounted. A pod whose backoff has run out is tried again."""
        if not self._pods:  # the usual case: nothing refused, nothing to look up per pod
            return {}
        now = self.clock()
        pods = self._pods.items() if uids is None else ((u, self._pods.get(u)) for u in uids)
        return {u: p.reason(now) for u, p in pods if p is not None and p.retry_at > now}

    def next_retry(self, uids: Any) -> float | None:
        """Seconds until the first of ``uids`` may be tried again; None if none is blocked."""
        if not self._pods:
            return None
        now = self.clock()
        times = [p.retry_at for u in uids if (p := self._pods.get(u)) is not None]
        return max(0.0, min(times) - now) if times else None
