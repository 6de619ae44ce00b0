"""Settling what the controller cannot know from its caches: releases whose answer never came
(fenced so that they can no longer land) and expectations the watch did not confirm in time.

Both ask the API server for the pod as it is, and leave the bookkeeping as if the watch had
shown it: a release that landed counts until seen, one that cannot land any more does not.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import anyio

from ungater._controller.state import KindRuntime, Stats
from ungater._decide.freshness import version_number
from ungater._decide.indexes import OwnerKey
from ungater._decide.ledger import Ledger, Uncertain
from ungater._decide.patches import fence_patch
from ungater._kube.client import PODS, ApiError, KubeClient
from ungater._model.views import MalformedObject, parse_pod

__all__ = ["UNSETTLED_RETRY_SECONDS", "Settler"]

log = logging.getLogger("ungater.controller")

#: How soon an owner comes back when one of its unanswered releases could not be settled.
UNSETTLED_RETRY_SECONDS = 1.0


class Settler:
    """Given only what settling reads and writes: the client, the ledger (our writes), the
    pod caches (is a pod held anywhere), and how to forget a pod and name an owner."""

    def __init__(
        self,
        client: KubeClient,
        ledger: Ledger,
        *,
        concurrency: int,
        stats: Stats,
        held: Callable[[str], bool],
        forget_pod: Callable[[str], None],
        describe: Callable[[OwnerKey], str],
    ) -> None:
        self.client = client
        self.ledger = ledger
        self.concurrency = concurrency
        self.stats = stats
        self.held = held  # whether any kind's pod cache holds this pod UID
        self.forget_pod = forget_pod
        self.describe = describe

    async def settle_uncertain(self, key: OwnerKey, rt: KindRuntime) -> bool:
        """Settle each release of this owner whose outcome is unknown, for good: it counts as
        released until the server shows the pod at another version (the patch tests the one
        it was decided on, so it can no longer land) or gone. False while one is unsettled
        (still in flight: decide on that, and come back to settle it)."""
        unsettled = 0
        for uid, u in self.ledger.uncertain_of(key):
            if await self.fence(key, rt, uid, u):
                self.ledger.answered(uid)
            else:
                unsettled += 1
        return not unsettled

    async def fence(self, key: OwnerKey, rt: KindRuntime, uid: str, u: Uncertain) -> bool:
        """True once the release sent as ``u`` can never land (and, if it did, it is counted)."""
        for _ in range(3):  # each round either settles or saw the pod change meanwhile
            try:
                obj = await self.client.get(PODS, u.namespace, u.name)
            except (ApiError, OSError, TimeoutError) as exc:
                log.warning("pod %s/%s: cannot settle a release yet: %r", u.namespace, u.name, exc)
                return False
            if obj is None or (obj.get("metadata") or {}).get("uid") != uid:
                # gone (a pod of the same name is not at the tested version); the release may
                # have landed first, and a lagging watch may still show it: not someone else's
                self.ledger.went(uid)
                return True
            view = parse_pod(obj)
            if view.resource_version != u.resource_version:
                if not view.has_gate(rt.gate) and not view.terminal and not view.deleting:
                    # released, by that patch or another writer: counted until seen
                    self.ledger.expectations.expect(key, [uid], rt.kind)
                    self.ledger.mine(uid, u.namespace, u.name)
                    written = version_number(view.resource_version)
                    if written is not None:
                        self.ledger.wrote(uid, written)
                return True
            # unchanged since the decision: the patch has not landed, and still could;
            # change the pod, so that it cannot
            fence = fence_patch(u.resource_version, bool(view.annotations))
            try:
                await self.client.json_patch(PODS, u.namespace, u.name, fence)
            except ApiError as exc:
                if exc.status == 404:
                    self.ledger.went(uid)  # gone since the read: as above
                    return True
                if exc.status in (409, 422):
                    continue  # it changed under the fence: look again
                log.warning("pod %s/%s: the fence was refused: %s", u.namespace, u.name, exc)
                return False  # refused or failed: the release stays in flight
            except (OSError, TimeoutError) as exc:
                log.warning("pod %s/%s: the fence failed: %r", u.namespace, u.name, exc)
                return False
            self.stats.fences += 1
            log.info("pod %s/%s: an unanswered release can no longer land", u.namespace, u.name)
            return True
        return False

    async def settle_expired(self, key: OwnerKey, rt: KindRuntime, uids: frozenset[str]) -> bool:
        """The watch has not shown our patches in time: ask the API server for the truth.

        A pod that is released keeps counting as in flight (re-armed) until the cache catches up;
        one that is gone or still gated no longer does. A pod whose read fails keeps its
        expectation, expired, so it still counts and is settled again at the owner's next turn
        (soon: False says one was not read): only an answer may drop it.
        """
        self.ledger.expectations.expired_total += len(uids)
        unread = 0
        # a big wave's expectations expire together: read them at once, as many in flight as
        # the patches may be (one after the other, thousands of reads took minutes)
        slots = anyio.CapacityLimiter(max(1, self.concurrency))

        async def settle(uid: str) -> None:
            nonlocal unread
            pod = rt.pods.by_uid.get(uid)
            # a pod the deciding cache never held (released on a new term's quorum reads) is
            # read all the same: dropping its expectation unread would count it as nothing
            where = (pod.namespace, pod.name) if pod is not None else self.ledger.locate(uid)
            if where is None:
                self.ledger.expectations.observe(uid)
                return
            try:
                async with slots:
                    fresh = await self.client.get(PODS, *where)
            except (ApiError, OSError, TimeoutError) as exc:
                log.warning("pod %s/%s: cannot settle an expectation yet: %r", *where, exc)
                unread += 1
                return
            self.ledger.expectations.observe(uid)
            if fresh is None or (fresh.get("metadata") or {}).get("uid") != uid:
                if pod is None and not self.held(uid):
                    self.forget_pod(uid)  # gone before any cache held it: nothing to count
                return
            try:
                view = parse_pod(fresh)
            except MalformedObject:
                return
            if not view.has_gate(rt.gate) and not view.terminal and not view.deleting:
                self.ledger.expectations.expect(key, [uid], rt.kind)

        async with anyio.create_task_group() as tg:
            for uid in uids:
                tg.start_soon(settle, uid)
        log.warning(
            "%s: %d expectation(s) expired; %d settled from the API server",
            self.describe(key),
            len(uids),
            len(uids) - unread,
        )
        return not unread
