"""Each fix of issue 33's paths (the issue's four, and two found writing docs/safety.md), undone: the code as it was before the fix, patched in
for the length of a ``with`` block. The explorer must find a violation with each one undone
(tests/explore/test_explore.py), which shows both that the fix is needed and that the
explorer reaches the path by itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import anyio

import tests.explore.world as world_module
from ungater._controller.freshreads import FreshReads
from ungater._controller.patcher import SKIPPED, Patcher
from ungater._controller.reconciler import Reconciler
from ungater._controller.settling import Settler
from ungater._decide.decision import active_slice
from ungater._kube.client import PODS
from ungater._kube.kueue import workload_resource
from ungater._model.views import MalformedObject, parse_pod, parse_workload


async def _settle_expired_unseen_dropped(self: Any, key: Any, rt: Any, uids: Any) -> None:
    """Before: an expectation of a pod the cache does not hold was dropped unread."""
    s = self.s
    s.expectations.expired_total += len(uids)
    for uid in uids:
        pod = rt.pods.by_uid.get(uid)
        s.expectations.observe(uid)
        if pod is None:
            continue
        fresh = await s.client.get(PODS, pod.namespace, pod.name)
        if fresh is None or (fresh.get("metadata") or {}).get("uid") != uid:
            continue
        try:
            view = parse_pod(fresh)
        except MalformedObject:
            continue
        if not view.has_gate(rt.gate) and not view.terminal and not view.deleting:
            s.expectations.expect(key, [uid], rt.kind)


async def _refresh_one_slice(self: Any, key: Any, slices: Any) -> Any:
    """Before: the fence read the active slice only, and used whatever was active after."""
    active = active_slice(slices)
    assert active is not None
    res = workload_resource(self.s.workload_version)
    obj = await self.s.client.get(res, active.namespace, active.name)
    fresh = parse_workload(obj) if obj is not None else None
    if fresh is None or fresh.uid != active.uid:
        self.s.workloads.on_change(active, None)
        return []
    self.s.workloads.on_change(active, fresh)
    return self.s.workloads.for_owner(key.uid)


_release = Patcher.release


async def _resend_whatever_changed(self: Any, r: Any, unchanged: Any = None) -> str:
    """Before: a refused release was resent whatever the caches showed since the decision."""
    return await _release(self, r, lambda: True)


async def _release_all_checking_resends_only(
    self: Any, releases: Any, rt: Any = None, unchanged: Any = lambda: True, key: Any = None
) -> dict[str, str]:
    """Before: a release that waited for a patch slot was sent whatever the caches showed."""
    outcomes: dict[str, str] = {}

    async def one(r: Any) -> None:
        async with self._slots:
            if rt is not None and rt.mode != "release":
                outcomes[r.pod.uid] = SKIPPED
                return
            outcomes[r.pod.uid] = await self.release(r, unchanged)

    async with anyio.create_task_group() as tg:
        for r in releases:
            tg.start_soon(one, r)
    return outcomes


_refresh = FreshReads.refresh


async def _refresh_what_looked_stale(
    self: Any, key: Any, rt: Any, owner: Any, slices: Any, stale_owner: Any, stale_slice: Any
) -> Any:
    """Before: the fence read only the views that looked older than the shrink mark."""
    unproven = self.unproven(key)
    old_owner = self.owner_may_be_stale(key, rt, owner) or (unproven and self.owner_readable(rt))
    old_slice = unproven or self.slice_may_be_stale(key, slices)
    return await _refresh(self, key, rt, owner, slices, old_owner, old_slice)


@contextmanager
def unseen_pod() -> Iterator[None]:
    with (
        mock.patch.object(Settler, "settle_expired", _settle_expired_unseen_dropped),
        mock.patch.object(Reconciler, "_writes_unseen", lambda self, key, rt: False),
    ):
        yield


@contextmanager
def slice_chain() -> Iterator[None]:
    with mock.patch.object(FreshReads, "refresh_slice", _refresh_one_slice):
        yield


@contextmanager
def resend() -> Iterator[None]:
    with mock.patch.object(Patcher, "release", _resend_whatever_changed):
        yield


@contextmanager
def term_start() -> Iterator[None]:
    """Before: the handlers compared a release with the term's start only once the workers
    had started (``State.term_rv``), not from the moment the replica led."""
    with mock.patch.object(world_module, "_term_start", lambda elector, state: state.term_rv):
        yield


@contextmanager
def first_send() -> Iterator[None]:
    with mock.patch.object(Patcher, "release_all", _release_all_checking_resends_only):
        yield


@contextmanager
def slice_with_owner() -> Iterator[None]:
    with mock.patch.object(FreshReads, "refresh", _refresh_what_looked_stale):
        yield


#: fix -> (how to undo it, the scenario that must then break)
REVERTS: dict[str, tuple[Callable[[], Any], str]] = {
    "unseen-pod": (unseen_pod, "term-unseen-pod"),
    "slice-chain": (slice_chain, "slice-chain"),
    "resend": (resend, "other-gate-shrink"),
    "term-start": (term_start, "handover"),
    "first-send": (first_send, "queued-sends"),
    "slice-with-owner": (slice_with_owner, "touched-slice"),
}
