"""The event record both integration cap oracles keep (``monitor.CapMonitor``,
``realpeers.SliceWatch``): every event of some resources of one namespace, through
``bench.gapwatch``'s loop, so both share its discipline (a 410, an ``ERROR`` event, running out
of watch rounds or being stopped with the watch down is a :class:`Gap`; a gap makes any
judgement of the record refuse), and a way to end the record at the server's present
(``caught_up``) instead of after a fixed wait. After a 410 it first reads the revisions it
missed back from etcd's history (``Kube.list_at``): an API server restarted under a test
answers 410 from its fresh watch cache while etcd still holds every revision, and a gap read
back whole is no gap; a compacted one stays."""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import anyio
from anyio.abc import TaskGroup

from bench.gapwatch import Gap, RecorderBroken, WatchSettings, refuse_gaps, watch_recorded
from tests.integration.capjudge import Event
from tests.integration.k8s import Kube
from ungater._kube.client import Resource

SYNC_SECONDS = 15.0  # every first list, at most


@dataclass
class Record:
    kube: Kube
    ns: str
    _: KW_ONLY
    events: list[Event] = field(default_factory=list)
    gaps: list[Gap] = field(default_factory=list)  # non-empty: every judgement refuses
    relists: dict[str, int] = field(default_factory=dict)  # per resource, after the first list
    interruptions: dict[str, int] = field(default_factory=dict)  # per resource: failed rounds
    recovered: int = 0  # revisions read back after a 410 (``bench.gapwatch``): no gap
    synced: anyio.Event = field(default_factory=anyio.Event)  # every source started listed
    settings: WatchSettings = field(default_factory=WatchSettings)
    # per source name: (resource, label selector); filled by ``start`` or ``_watch``
    sources: dict[str, tuple[Resource, str]] = field(default_factory=dict)
    _listed_once: set[str] = field(default_factory=set)
    # per source: uid -> the object as last recorded (what a relist is compared with)
    _known: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return not self.gaps

    def check_complete(self) -> None:
        """Raise ``IncompleteHistory``, naming every gap, unless the record is whole."""
        refuse_gaps(self.gaps)

    async def start(
        self, tg: TaskGroup, sources: dict[str, tuple[Resource, str]], timeout: float = SYNC_SECONDS
    ) -> None:
        """Record each source (name -> (resource, selector)) in ``tg``; return once every one
        has been listed, so that nothing the caller does next happens before the record."""
        self.sources.update(sources)
        for name, (res, selector) in sources.items():
            tg.start_soon(self._watch, res, name, selector)
        with anyio.fail_after(timeout):
            await self.synced.wait()

    def _record(self, name: str, ev: Any) -> str:
        """Record one watch event; the resourceVersion to resume from."""
        try:
            kind = ev["type"]
            obj = ev["object"]
            rv = str(obj["metadata"]["resourceVersion"])
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                self.events.append(Event(int(rv), name, kind, obj))
                known = self._known.setdefault(name, {})
                if kind == "DELETED":
                    known.pop(obj["metadata"]["uid"], None)
                else:
                    known[obj["metadata"]["uid"]] = obj
            return rv
        except Exception as exc:
            raise RecorderBroken(f"the recorder failed on a {name} event: {exc!r}") from exc

    def _listed(self, name: str, items: list[dict[str, Any]], list_rv: str) -> None:
        """Record a list: each object new or changed since it was last recorded (all of them,
        the first time, as the record's start), and each recorded one the list no longer has,
        gone by ``list_rv``."""
        try:
            first = name not in self._known
            known = self._known.setdefault(name, {})
            listed = {obj["metadata"]["uid"]: obj for obj in items}
            for uid, obj in listed.items():
                before = known.get(uid)
                rv = obj["metadata"]["resourceVersion"]
                if before is None or before["metadata"]["resourceVersion"] != rv:
                    kind = "ADDED" if before is None else "MODIFIED"
                    self.events.append(
                        Event(int(rv), name, kind, obj, relisted=not first, initial=first)
                    )
            for uid, obj in known.items():
                if uid not in listed:
                    self.events.append(Event(int(list_rv), name, "DELETED", obj, relisted=True))
            self._known[name] = listed
            if not first:
                self.relists[name] = self.relists.get(name, 0) + 1
        except Exception as exc:
            raise RecorderBroken(f"the recorder failed on a {name} list: {exc!r}") from exc

    def _started(self, name: str) -> None:
        self._listed_once.add(name)
        if self._listed_once >= set(self.sources):
            self.synced.set()

    async def _watch(self, res: Resource, name: str, selector: str = "") -> None:
        """Record ``res`` (its objects matching ``selector``) as ``name``."""
        self.sources.setdefault(name, (res, selector))
        await watch_recorded(
            self.kube.client,
            res,
            self.ns,
            name,
            listed=lambda items, rv: self._listed(name, items, rv),
            event=lambda ev: self._record(name, ev),
            gaps=self.gaps,
            selector=selector,
            settings=self.settings,
            on_synced=lambda: self._started(name),
            on_down=lambda why: self._down(name),
            recover=lambda after, until: self._recover(res, selector, after, until),
        )

    async def _recover(
        self, res: Resource, selector: str, after: int, until: int
    ) -> list[tuple[str, list[dict[str, Any]]]] | None:
        """Each state of ``res`` after ``after`` up to ``until``, read at that revision
        exactly; None when one cannot be read (compacted): the gap then stays."""
        states = []
        for rv in range(after + 1, until + 1):
            items = await self.kube.list_at(res, self.ns, selector, rv)
            if items is None:
                return None
            states.append((str(rv), items))
        self.recovered += until - after
        return states

    def _down(self, name: str) -> None:
        self.interruptions[name] = self.interruptions.get(name, 0) + 1

    async def finish(self, timeout: float = 30.0) -> None:
        """Wait until the record has caught up with the server (``caught_up``). A gap already
        recorded ends the wait (no judgement of the record will be made); not catching up
        within ``timeout`` (the server away, a watch stuck) is a gap of its own, since the
        record then ends at an unknown distance before the present."""
        with anyio.move_on_after(timeout):
            while not self.gaps:
                try:
                    if await self.caught_up():
                        return
                except Exception:  # the server away: not caught up yet
                    pass
                await anyio.sleep(0.05)
            return
        last = max((e.rv for e in self.events), default=0)
        why = f"the record did not catch up with the server within {timeout:g} s"
        self.gaps.append(Gap(",".join(self.sources), last, None, why))

    async def caught_up(self) -> bool:
        """The record has reached a fresh list of every source: each listed object recorded at
        its resourceVersion or a newer one, and each recorded object the list lacks newer than
        the list (created after it; one deleted before it must have had its DELETED
        recorded). Poll it before stopping the watches, so that the record ends with everything
        written up to now instead of whatever arrived in a fixed wait."""
        for name, (res, selector) in self.sources.items():
            items, list_rv = await self.kube.client.list_objects(res, self.ns, selector)
            known = self._known.get(name, {})
            listed = {o["metadata"]["uid"]: int(o["metadata"]["resourceVersion"]) for o in items}
            for uid, rv in listed.items():
                held = known.get(uid)
                if held is None or int(held["metadata"]["resourceVersion"]) < rv:
                    return False
            for uid, obj in known.items():
                if uid not in listed and int(obj["metadata"]["resourceVersion"]) <= int(list_rv):
                    return False
        return True
