"""The reflector alone, on a scripted client: what it lists and watches with, how it applies
each event type, what it counts, and how it backs off, resumes and relists."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import anyio
import pytest

import ungater._kube.reflector as reflector_module
from tests.polling import eventually
from ungater._kube.client import PODS, GoneError
from ungater._kube.reflector import Reflector
from ungater._model.views import MalformedObject


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def obj(uid: str, rv: int, value: str = "v", bad: bool = False) -> dict[str, Any]:
    return {
        "metadata": {"uid": uid, "name": f"n-{uid}", "resourceVersion": str(rv)},
        "value": value,
        "bad": bad,
    }


def parse(o: Mapping[str, Any]) -> str | None:
    if o.get("bad"):
        raise MalformedObject("bad object")
    return None if o.get("value") == "ignored" else str(o["value"])


class Script:
    """Lists return ``lists`` in turn; each watch call plays the next entry of ``watches``: a
    list of events, then the exception to end with (None: the server closed the stream)."""

    def __init__(
        self,
        lists: list[tuple[list[dict[str, Any]], str]],
        watches: list[tuple[list[dict[str, Any]], BaseException | None]],
    ) -> None:
        self.lists = lists
        self.watches = watches
        self.watch_calls: list[tuple[Any, ...]] = []
        self.list_calls: list[tuple[Any, ...]] = []
        self.done = anyio.Event()

    async def list_pages(
        self, resource: Any, namespace: Any, selector: str = ""
    ) -> AsyncIterator[tuple[list[dict[str, Any]], str]]:
        self.list_calls.append((namespace, selector))
        items, rv = self.lists.pop(0)
        yield items[:1], "0"
        yield items[1:], rv

    async def watch(
        self,
        resource: Any,
        namespace: Any,
        rv: str,
        selector: str = "",
        timeout: int = 300,
        silence: float = 90.0,
    ) -> AsyncIterator[dict[str, Any]]:
        self.watch_calls.append((namespace, rv, selector, timeout, silence))
        if not self.watches:
            self.done.set()
            await anyio.sleep_forever()
        events, end = self.watches.pop(0)
        for e in events:
            yield e
        if end is not None:
            raise end


def make(script: Script, changes: list[tuple[Any, Any]]) -> Reflector[str]:
    return Reflector(
        script,
        PODS,
        "ns",
        parse,
        lambda old, new: changes.append((old, new)),  # type: ignore[arg-type]
        label_selector="a=b",
        timeout_seconds=42,
        silence_seconds=7.5,
        backoff_initial=0.5,
        backoff_max=1.5,
    )


@pytest.mark.anyio
async def test_relist_replaces_the_store_and_reports_each_change() -> None:
    changes: list[tuple[Any, Any]] = []
    script = Script(
        [([obj("a", 1), obj("b", 2)], "10"), ([obj("b", 3, "w"), obj("c", 4)], "20")], []
    )
    r = make(script, changes)
    await r.relist()
    assert r.store == {"a": "v", "b": "v"} and r.resource_version == "10" and r.synced.is_set()
    assert changes == [(None, "v"), (None, "v")]
    changes.clear()
    await r.relist()
    assert r.store == {"b": "w", "c": "v"} and r.resource_version == "20"
    assert changes == [("v", None), ("v", "w"), (None, "v")]
    assert r.stats.lists == 2
    assert script.list_calls == [("ns", "a=b"), ("ns", "a=b")]


def test_apply_each_event_type_and_count_only_real_events() -> None:
    changes: list[tuple[Any, Any]] = []
    r = make(Script([], []), changes)
    r.apply({"type": "ADDED", "object": obj("a", 1)})
    r.apply({"type": "MODIFIED", "object": obj("a", 2, "w")})
    r.apply({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "5"}}})
    assert r.resource_version == "5" and r.stats.events == 2
    r.apply({"type": "MODIFIED", "object": obj("a", 6, bad=True)})  # malformed: dropped
    r.apply({"type": "ADDED", "object": obj("z", 6, bad=True)})
    assert r.store == {} and r.stats.malformed == 2 and r.stats.events == 4
    r.apply({"type": "ADDED", "object": obj("b", 7)})
    r.apply({"type": "MODIFIED", "object": obj("b", 8, "ignored")})  # parse says: not ours
    r.apply({"type": "ADDED", "object": obj("c", 9)})
    r.apply({"type": "DELETED", "object": obj("c", 10)})
    r.apply({"type": "DELETED", "object": obj("c", 11)})  # already gone: nothing to report
    r.apply({"type": "ADDED", "object": {"metadata": {"resourceVersion": "12"}}})  # no uid
    assert changes == [
        (None, "v"),
        ("v", "w"),
        ("w", None),
        (None, "v"),
        ("v", None),
        (None, "v"),
        ("v", None),
    ]
    assert r.store == {} and r.resource_version == "12" and r.stats.events == 9


@pytest.mark.anyio
async def test_run_resumes_restarts_backs_off_and_relists_on_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sleeps: list[float] = []

    async def sleep(delay: float) -> None:
        sleeps.append(delay)

    monkeypatch.setattr(reflector_module.anyio, "sleep", sleep)
    monkeypatch.setattr(
        reflector_module.random, "random", lambda: 0.0
    )  # jitter at its bottom: half
    ev = {"type": "ADDED", "object": obj("b", 11)}
    script = Script(
        [([obj("a", 1)], "10"), ([obj("c", 30)], "30"), ([obj("e", 40)], "40")],
        [
            ([ev], None),  # the server closes the stream: watch again, at once, from rv 11
            ([], ConnectionResetError("cut")),  # restart with backoff 0.5
            ([], TimeoutError()),  # silent: restart with backoff 1.0
            ([], TimeoutError()),  # again: 1.5 (capped)
            ([], OSError("refused")),  # still capped
            ([], RuntimeError("aiohttp")),  # still capped
            ([{"type": "ADDED", "object": obj("d", 12)}], ConnectionResetError()),  # reset
            ([], GoneError()),  # relist at once, then watch from the list's rv
            ([], GoneError()),  # and again
        ],
    )
    changes: list[tuple[Any, Any]] = []
    r = make(script, changes)
    async with anyio.create_task_group() as tg:
        tg.start_soon(r.run)
        with anyio.fail_after(5):
            await script.done.wait()
        tg.cancel_scope.cancel()
    rvs = [c[1] for c in script.watch_calls]
    assert rvs == ["10", "11", "11", "11", "11", "11", "11", "12", "30", "40"]
    assert {c[0] for c in script.watch_calls} == {"ns"}
    assert {c[2:] for c in script.watch_calls} == {("a=b", 42, 7.5)}
    assert sleeps == [0.25, 0.5, 0.75, 0.75, 0.75, 0.25]
    assert (r.stats.watch_restarts, r.stats.silent_restarts, r.stats.relists_gone) == (6, 2, 2)
    assert r.stats.lists == 3 and r.store == {"e": "v"}


def test_replace_makes_the_store_exactly_the_items() -> None:
    changes: list[tuple[Any, Any]] = []
    r = make(Script([], []), changes)
    r.replace([obj("a", 1), obj("b", 2)])
    r.replace([obj("b", 3, "w"), obj("c", 4, bad=True)])
    assert r.store == {"b": "w"}
    assert changes == [(None, "v"), (None, "v"), ("v", None), ("v", "w")]


@pytest.mark.anyio
async def test_relist_keeps_the_stored_view_of_an_unchanged_object() -> None:
    """One copy of each view through a relist: an equal view is dropped for the stored one,
    a changed one replaces it; every object is still reported."""
    lists = [([obj("a", 1), obj("b", 2)], "10"), ([obj("a", 1), obj("b", 3, "w")], "20")]
    changes: list[tuple[Any, Any]] = []
    r = Reflector(
        Script(lists, []),
        PODS,
        "ns",
        lambda o: [o["value"]],  # a fresh (unhashable, mutable) object per parse
        lambda old, new: changes.append((old, new)),
    )
    await r.relist()
    first_a, first_b = r.store["a"], r.store["b"]
    changes.clear()
    await r.relist()
    assert r.store["a"] is first_a
    assert r.store["b"] == ["w"] and r.store["b"] is not first_b
    assert changes == [(first_a, first_a), (first_b, ["w"])]


@pytest.mark.anyio
async def test_relist_soon_ends_a_quiet_watch_and_watches_on_from_the_new_list() -> None:
    script = Script([([obj("a", 1)], "10"), ([obj("a", 1), obj("b", 45)], "50")], [])
    changes: list[tuple[Any, Any]] = []
    r = make(script, changes)
    async with anyio.create_task_group() as tg:
        tg.start_soon(r.run)
        with anyio.fail_after(5):
            await script.done.wait()  # watching from the first list, and nothing comes
            assert r.resource_version == "10" and len(script.list_calls) == 1
            r.relist_soon()
            await eventually(lambda: len(script.watch_calls) == 2, what="the second watch")
        tg.cancel_scope.cancel()
    assert [c[1] for c in script.watch_calls] == ["10", "50"]
    assert r.stats.lists == 2 and r.resource_version == "50"
    assert r.store == {"a": "v", "b": "v"}
    assert (None, "v") in changes[1:]  # b, new in the second list, reached on_change
    assert r.stats.watch_restarts == 0  # a relist asked for is not a failure
