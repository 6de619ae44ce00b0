"""Release patches sent, and what came of each: the only place a pod's gate is removed.

One guarded JSON patch per pod (``patches.release_patch``), at most
``client.patchConcurrency`` at once, none once leadership is lost or the kind has turned to
audit (``mode: auto`` after a guard check, or a stand-down). Each request ends in one
outcome the reconciler acts on: ``released``, ``deleting`` (it landed on a pod being deleted:
no release), ``blocked`` (refused for good: the pod backs off), ``gone``, ``conflict`` (changed
under us: re-decide), ``skipped`` (not leading) or ``error`` (it may have landed).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import anyio

from ungater._controller.notices import Notices
from ungater._controller.state import KindRuntime, Stats
from ungater._decide.decision import Release
from ungater._decide.freshness import version_number
from ungater._decide.indexes import OwnerKey
from ungater._decide.ledger import Ledger
from ungater._decide.patches import release_patch, resend
from ungater._decide.refusals import (
    BlockedReleases,
    PatchOutcome,
    classify_patch_error,
    server_message,
)
from ungater._kube.client import PODS, ApiError, KubeClient
from ungater._model.views import MalformedObject, PodView, parse_pod
from ungater._observe.metrics import Metrics
from ungater._observe.trace import Tracer

__all__ = ["Patcher"]

log = logging.getLogger("ungater.controller")  # one logger for the controller's parts


class Patcher:
    """Given only what a release reads and writes: the client, the ledger (our writes), the
    refusals, the stats and metrics, and whether this replica still leads."""

    def __init__(
        self,
        client: KubeClient,
        ledger: Ledger,
        blocked: BlockedReleases,
        notices: Notices,
        *,
        leading: Callable[[], bool],
        concurrency: int,
        stats: Stats,
        metrics: Metrics | None = None,
        trace: Tracer | None = None,
    ) -> None:
        self.client = client
        self.ledger = ledger
        self.blocked = blocked
        self.notices = notices
        self.leading = leading
        self.stats = stats
        self.metrics = metrics
        self.trace = trace or Tracer()
        self._slots = anyio.Semaphore(concurrency)
        self._senders = max(1, concurrency)  # tasks per wave: no more than can send at once
        # pods read after a refusal that could not be resent, until check_foreign_release
        self._refused_at: dict[str, PodView] = {}

    async def release_all(
        self,
        releases: Sequence[Release],
        rt: KindRuntime | None = None,
        unchanged: Callable[[], bool] = lambda: True,
        key: OwnerKey | None = None,
    ) -> dict[str, PatchOutcome]:
        """Patch every pod of ``releases`` (bounded concurrency); the outcome per pod UID.
        Each patch not yet sent is skipped once ``rt`` (the owner's kind) stops releasing; a
        patch is sent (and a refused one resent) only while ``unchanged()`` says the decision's
        other inputs are as they were (the owner, its slices, no shrink since). ``key``, the
        owner's, names the patches in the trace (``logging.trace``)."""
        outcomes: dict[str, PatchOutcome] = {}
        trace = self.trace
        if trace.on:
            trace.point("release_all", key, pods=len(releases))

        async def one(r: Release) -> None:
            async with self._slots:
                if rt is not None and rt.mode != "release":
                    outcomes[r.pod.uid] = (
                        PatchOutcome.SKIPPED
                    )  # switched to audit since the decision
                    return
                if not unchanged():  # waited for a slot while the caches moved: a send now
                    outcomes[r.pod.uid] = PatchOutcome.SUPERSEDED  # would be an old decision
                    if self.metrics is not None:
                        self.metrics.observe_patch(PatchOutcome.SUPERSEDED)
                    return
                if trace.on:
                    trace.point("patch_sent", key, pod=r.pod.uid)
                outcomes[r.pod.uid] = await self.release(r, unchanged)
                if trace.on:
                    trace.point("patch_answered", key, pod=r.pod.uid, outcome=outcomes[r.pod.uid])

        # at most patchConcurrency tasks take the releases in order, not one task per pod: a
        # wave of a thousand pods spawned a thousand tasks that only waited for a slot
        todo = iter(releases)

        async def sender() -> None:
            for r in todo:  # shared: each release is taken by exactly one sender
                await one(r)

        async with anyio.create_task_group() as tg:
            for _ in range(min(len(releases), self._senders)):
                tg.start_soon(sender)
        return outcomes

    async def release(
        self, r: Release, unchanged: Callable[[], bool] = lambda: True
    ) -> PatchOutcome:
        outcome = await self._send(r)
        if outcome == PatchOutcome.CONFLICT:
            again = await self._resendable(r)
            if again is not None and not unchanged():
                again = None  # the caches moved since the decision: decide again instead
            if again is not None:  # once: a second refusal goes back to the decision
                self.stats.patch_resent += 1
                outcome = await self._send(again)
        return outcome

    async def _resendable(self, r: Release) -> Release | None:
        """After a refusal: the same release on the pod as the server has it now, if only its
        version and other writers' gates changed (``patches.resend``). The pod read is kept
        for ``check_foreign_release``, which would read it again."""
        try:
            obj = await self.client.get(PODS, r.pod.namespace, r.pod.name)
            fresh = parse_pod(obj) if obj is not None else None
        except (ApiError, OSError, TimeoutError, MalformedObject):
            return None
        if fresh is None or fresh.uid != r.pod.uid:
            return None
        again = resend(r, fresh)
        if again is None:
            self._refused_at[r.pod.uid] = fresh
            return None
        self.ledger.resent(r.pod.uid, fresh.resource_version)
        return again

    async def _send(self, r: Release) -> PatchOutcome:
        outcome = await self._release_once(r)
        if self.metrics is not None:
            self.metrics.observe_patch(outcome)
        return outcome

    async def _release_once(self, r: Release) -> PatchOutcome:
        if not self.leading():
            return PatchOutcome.SKIPPED  # leadership lost since the decision: act no more
        try:
            patched = await self.client.json_patch(
                PODS, r.pod.namespace, r.pod.name, release_patch(r)
            )
        except ApiError as exc:
            outcome = classify_patch_error(exc.status, exc.reason, exc.body)
            if outcome == PatchOutcome.GONE:
                self.stats.patch_gone += 1
                return PatchOutcome.GONE
            if outcome == PatchOutcome.BLOCKED:
                self.stats.patch_blocked += 1
                message = server_message(exc.reason, exc.body)
                self.blocked.record(r.pod.uid, r.pod.namespace, r.pod.name, exc.status, message)
                return PatchOutcome.BLOCKED
            if outcome == PatchOutcome.CONFLICT:
                self.stats.patch_conflicts += 1
                log.info(
                    "pod %s/%s changed under us (%s); re-deciding", r.pod.namespace, r.pod.name, exc
                )
                return PatchOutcome.CONFLICT
            self.stats.patch_errors += 1
            log.warning("patching pod %s/%s failed: %s", r.pod.namespace, r.pod.name, exc)
            return PatchOutcome.ERROR
        except (OSError, TimeoutError) as exc:
            self.stats.patch_errors += 1
            log.warning("patching pod %s/%s failed: %r", r.pod.namespace, r.pod.name, exc)
            return PatchOutcome.ERROR
        meta = (patched or {}).get("metadata") or {}
        written = version_number(str(meta.get("resourceVersion") or ""))
        if written is not None:
            self.ledger.wrote(r.pod.uid, written)  # the gate is gone from here on, by our hand
        if meta.get("deletionTimestamp"):
            # the gate is gone, but so is the pod: a terminating pod runs nothing and frees
            # its slot, so this is no release (not counted, logged or announced)
            self.stats.released_deleting += 1
            return PatchOutcome.DELETING
        return PatchOutcome.RELEASED

    async def check_foreign_release(self, r: Release, rt: KindRuntime) -> None:
        """Our guarded patch was refused: if the gate is gone, another writer released the pod."""
        view = self._refused_at.pop(r.pod.uid, None)
        ledger = self.ledger
        if ledger.known_released(r.pod.uid):
            return  # reported already, or the gate went by an earlier write of ours
        if view is None:
            fresh = await self.client.get(PODS, r.pod.namespace, r.pod.name)
            if fresh is None:
                return
            view = parse_pod(fresh)
        if view.uid == r.pod.uid and not view.has_gate(r.gate):
            self.notices.foreign_release(view, rt, ledger.foreign(view.uid))
