"""Positive signals that the controller has seen a state, for tests that then assert it did
nothing about it.

"Nothing was released after a while" also passes when the controller is merely slow. So such a
test first waits until the controller's caches hold the state (each object at the
resourceVersion the API server gave it, or a newer one), then asks for a reconcile of the owner
and waits until one taken after the request is done (its patches included); only then is
"nothing happened" worth asserting.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

import anyio

from tests.polling import eventually
from ungater._controller.controller import Controller
from ungater._decide.decision import Decision
from ungater._decide.indexes import OwnerKey


def _rv(value: object) -> int:
    text = str(value or "")
    return int(text) if text.isdigit() else -1


def cached(ctl: Controller, plural: str, uid: str, selector: str = "") -> list[Any]:
    """The views of object ``uid`` that the controller's ``plural`` caches hold (one per
    cache; only the caches whose label selector contains ``selector``)."""
    return [
        r.store[uid]
        for r in ctl.reflectors
        if r.resource.plural == plural and selector in r.label_selector and uid in r.store
    ]


def cache_holds(
    ctl: Controller, plural: str, objs: Iterable[Mapping[str, Any]], selector: str = ""
) -> bool:
    """Each object (as the API server returned it) is in a cache, there at its
    resourceVersion or newer, in every cache (of those matching ``selector``) that has it."""
    for obj in objs:
        meta = obj["metadata"]
        views = cached(ctl, plural, meta["uid"], selector)
        if not views or any(_rv(v.resource_version) < _rv(meta["resourceVersion"]) for v in views):
            return False
    return True


def cache_lacks(ctl: Controller, plural: str, uids: Iterable[str]) -> bool:
    """None of the objects is in any ``plural`` cache any more (their deletion was seen)."""
    return not any(cached(ctl, plural, uid) for uid in uids)


def owner_key(owner: Mapping[str, Any]) -> OwnerKey:
    return OwnerKey(owner["metadata"]["namespace"], owner["metadata"]["uid"])


async def reconciled(
    ctl: Controller, key: OwnerKey, *, decided: bool = False, timeout: float = 10.0
) -> Decision | None:
    """Queue ``key`` and wait until a reconcile of it taken after this call is done; the
    decision that reconcile made, or None if it made none (its expectations were pending).
    With ``decided``, queue it again until one decides."""
    deadline = time.monotonic() + timeout
    for _ in range(1000):
        before = ctl.state.decisions.get(key)
        ctl.state.queue.add(key)
        left = max(0.1, deadline - time.monotonic())
        await eventually(
            lambda: not ctl.state.queue.busy(key), timeout=left, what=f"reconcile {key}"
        )
        after = ctl.state.decisions.get(key)
        if after is not before and after is not None:
            return after
        if not decided:
            return None
        if time.monotonic() > deadline:
            break
        await anyio.sleep(0.05)
    raise AssertionError(f"no reconcile of {key} decided within {timeout}s")


def waiting(decision: Decision | None) -> dict[str, str]:
    """The gated pods a decision keeps waiting (in a pod set, or unmapped), by name, with the
    reason it gives."""
    if decision is None:
        return {}
    kept = [w for ps in decision.pod_sets for w in ps.waiting] + list(decision.unmapped)
    return {w.pod: w.reason for w in kept}


async def seen_then_reconciled(
    ctl: Controller, owner: Mapping[str, Any], plural: str, objs: Iterable[Mapping[str, Any]]
) -> Decision | None:
    """The sync point before a "nothing happened" check: the caches hold ``objs`` (as the API
    server returned them; the watch handlers ran with them), then a reconcile of ``owner``
    taken after that is done (``reconciled``); its decision, or None."""
    held = list(objs)
    await eventually(lambda: cache_holds(ctl, plural, held), what=f"the {plural} cached")
    return await reconciled(ctl, owner_key(owner))
