"""List-then-watch one resource into a local store, and keep it there through failures.

The loop lists, replaces the store, then watches from the list's resourceVersion with
bookmarks. A 410 Gone relists; any other failure (connection cut, API server restart, a stream
silent for longer than the silence timeout) reconnects with exponential backoff from the last
resourceVersion seen. Every change reaches the owner of the reflector through ``on_change``.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from typing import Any, Generic, TypeVar

import anyio

from ungater._kube.client import ApiError, GoneError, KubeClient, Resource
from ungater._model.views import MalformedObject

__all__ = [
    "Reflector",
    "ReflectorStats",
    "from_list",
]

#: Set while a list (the first, or a relist after 410) replaces the store: a change seen that
#: way shows only the object's last state, so it cannot say when (or by whom) a field changed.
_LISTING: ContextVar[bool] = ContextVar("ungater_reflector_listing", default=False)


def from_list() -> bool:
    """Whether the change being handled comes from a list rather than a watch event: a list
    cannot date a change (a gate removed before or after a moment), only show it done."""
    return _LISTING.get()


V = TypeVar("V")
log = logging.getLogger("ungater.reflector")


class ReflectorStats:
    """Counters a reflector keeps; exported as metrics by the controller."""

    def __init__(self) -> None:
        self.lists = 0
        self.relists_gone = 0
        self.watch_restarts = 0
        self.silent_restarts = 0
        self.events = 0
        self.malformed = 0


class Reflector(Generic[V]):
    """Keeps ``store`` (uid -> view) in sync with the API server for one resource/namespace.

    ``parse`` turns raw JSON into a view, or None to drop objects the controller does not
    care about. ``on_change(old, new)`` is called for every add (old None), update and delete
    (new None), after the store is updated.
    """

    def __init__(
        self,
        client: KubeClient,
        resource: Resource,
        namespace: str | None,
        parse: Callable[[Mapping[str, Any]], V | None],
        on_change: Callable[[V | None, V | None], None],
        label_selector: str = "",
        timeout_seconds: int = 300,
        silence_seconds: float = 90.0,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
    ) -> None:
        self.client = client
        self.resource = resource
        self.namespace = namespace
        self.parse = parse
        self.on_change = on_change
        self.label_selector = label_selector
        self.timeout_seconds = timeout_seconds
        self.silence_seconds = silence_seconds
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.store: dict[str, V] = {}
        self.synced = anyio.Event()
        self.resource_version = ""
        self.stats = ReflectorStats()
        self._relist_wanted = False
        self._watching: anyio.CancelScope | None = None

    @property
    def name(self) -> str:
        where = self.namespace or "*"
        sel = f" [{self.label_selector}]" if self.label_selector else ""
        return f"{self.resource.plural}.{self.resource.group or 'core'}@{where}{sel}"

    def _parse(self, obj: Mapping[str, Any]) -> tuple[str, V | None] | None:
        meta = obj.get("metadata") or {}
        uid = meta.get("uid")
        if not uid:
            return None
        try:
            return str(uid), self.parse(obj)
        except MalformedObject as exc:
            self.stats.malformed += 1
            log.warning("%s: skipping malformed %s: %s", self.name, meta.get("name"), exc)
            return str(uid), None

    def _put(self, uid: str, view: V | None) -> None:
        old = self.store.get(uid)
        if view is None:
            if old is not None:
                del self.store[uid]
                self.on_change(old, None)
            return
        self.store[uid] = view
        self.on_change(old, view)

    def _delete(self, uid: str) -> None:
        old = self.store.pop(uid, None)
        if old is not None:
            self.on_change(old, None)

    def replace(self, items: list[dict[str, Any]]) -> None:
        """Make the store exactly ``items``: deletions for what vanished, then upserts."""
        fresh: dict[str, V | None] = {}
        self._parse_into(fresh, items)
        self._replace_with(fresh)

    def _parse_into(self, fresh: dict[str, V | None], items: list[dict[str, Any]]) -> None:
        # An unchanged object keeps the view already stored: a relist then holds one copy of
        # every view, not the old store and a new one side by side until the swap.
        store = self.store
        for obj in items:
            parsed = self._parse(obj)
            if parsed is None:
                continue
            uid, view = parsed
            old = store.get(uid)
            fresh[uid] = old if old is not None and old == view else view

    def _replace_with(self, fresh: dict[str, V | None]) -> None:
        token = _LISTING.set(True)
        try:
            for uid in [u for u in self.store if fresh.get(u) is None]:
                self._delete(uid)
            for uid, view in fresh.items():
                if view is not None:
                    self._put(uid, view)
        finally:
            _LISTING.reset(token)

    def apply(self, event: Mapping[str, Any]) -> None:
        """Apply one watch event to the store."""
        kind = event.get("type")
        obj = event.get("object") or {}
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if rv:
            self.resource_version = str(rv)
        if kind == "BOOKMARK":
            return
        parsed = self._parse(obj)
        if parsed is None:
            return
        uid, view = parsed
        self.stats.events += 1
        if kind == "DELETED":
            self._delete(uid)
        elif kind in ("ADDED", "MODIFIED"):
            self._put(uid, view)

    async def relist(self) -> None:
        # Page by page: only slim views are kept, each raw page is dropped before the next one
        # arrives, so a large list never holds every raw object in memory at once.
        fresh: dict[str, V | None] = {}
        rv = ""
        async for page, page_rv in self.client.list_pages(
            self.resource, self.namespace, self.label_selector
        ):
            self._parse_into(fresh, page)
            rv = page_rv
        self.stats.lists += 1
        self._replace_with(fresh)
        self.resource_version = rv
        self.synced.set()

    def relist_soon(self) -> None:
        """End the watch and list again: a quorum list brings a quiet cache past a given
        resourceVersion at once, where its watch would only show it at the next change."""
        self._relist_wanted = True
        if self._watching is not None:
            self._watching.cancel()

    async def run(self) -> None:
        """Run until cancelled."""
        backoff = self.backoff_initial
        need_list = True
        while True:
            try:
                if self._relist_wanted:
                    self._relist_wanted = False
                    need_list = True
                if need_list:
                    await self.relist()
                    need_list = False
                try:
                    with anyio.CancelScope() as self._watching:
                        if not self._relist_wanted:  # (asked for while listing)
                            async for event in self.client.watch(
                                self.resource,
                                self.namespace,
                                self.resource_version,
                                self.label_selector,
                                self.timeout_seconds,
                                self.silence_seconds,
                            ):
                                self.apply(event)
                                backoff = self.backoff_initial
                finally:
                    self._watching = None
                continue  # the server ended the stream at timeoutSeconds (or relist_soon)
            except GoneError:
                self.stats.relists_gone += 1
                log.info("%s: resourceVersion %s gone, relisting", self.name, self.resource_version)
                need_list = True
                continue
            except TimeoutError:
                self.stats.silent_restarts += 1
                log.warning("%s: watch silent for %ss, restarting", self.name, self.silence_seconds)
            except (ApiError, OSError, ValueError) as exc:
                log.warning("%s: watch failed (%s), retrying in %.1fs", self.name, exc, backoff)
            except Exception as exc:  # aiohttp errors and the like; never let a watch die
                log.warning("%s: watch error %r, retrying in %.1fs", self.name, exc, backoff)
            self.stats.watch_restarts += 1
            await anyio.sleep(backoff * (0.5 + random.random() / 2))
            backoff = min(self.backoff_max, backoff * 2)
