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
from ungater._controller.patcher import SKIPPED, Patcher
from ungater._controller.reconciler import Reconciler
from ungater._controller.settling import Settler
from ungater._controller.view import Bounds, ViewReader
from ungater._kube.client import PODS
from ungater._model.views import MalformedObject, parse_pod


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


async def _bounds_on_cached_slices(self: Any, key: Any, rt: Any, owner: Any, slices: Any) -> Bounds:
    """Planted: the view reads the owner but keeps the cached slices (a slice lowered in place
    by Kueue, unseen by the Workload watch, then caps too high)."""
    fresh = await _bounds(self, key, rt, owner, slices)
    return Bounds(tuple(slices), fresh.owner_facts, fresh.owner_error, fresh.vias, fresh.gone)


_bounds = ViewReader.bounds


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


_release = Patcher.release


@contextmanager
def unseen_pod() -> Iterator[None]:
    with (
        mock.patch.object(Settler, "settle_expired", _settle_expired_unseen_dropped),
        mock.patch.object(Reconciler, "_writes_unseen", lambda self, key, rt: False),
    ):
        yield


@contextmanager
def cached_slices() -> Iterator[None]:
    with mock.patch.object(ViewReader, "bounds", _bounds_on_cached_slices):
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


#: fix -> (how to undo it, the scenario that must then break)
REVERTS: dict[str, tuple[Callable[[], Any], str]] = {
    "unseen-pod": (unseen_pod, "term-unseen-pod"),
    "cached-slices": (cached_slices, "touched-slice"),
    "resend": (resend, "other-gate-shrink"),
    "term-start": (term_start, "handover"),
    "first-send": (first_send, "queued-sends"),
}
