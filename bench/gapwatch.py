"""One list-and-watch loop for every cap oracle (the integration monitor, the real-peer recorder,
the benchmark's timeline), and the one rule they share: a history with a gap is not judged.

A watch that fails for a reason the server can serve past (a cut connection, a silent stream, a
5xx, an API server restart) resumes from the last resourceVersion it delivered: the server then
sends every later event, or answers 410. A 410 Gone (on opening or mid-stream), an ``ERROR``
event, or any other refusal to serve from that resourceVersion leaves events between it and the
relist that nothing can recover (a pod released and deleted in between is in neither), so the
loop relists and records a :class:`Gap`. Running out of watch rounds, and being stopped while
the watch is down (after a failure, before the relist or the resumed watch), are gaps too: what
came after the last resourceVersion seen was not seen. A failure of the caller's own recording
raises :class:`RecorderBroken`, which no retry hides.

This lives in ``bench`` because the benchmark cannot import the tests, and the tests' oracles
import it from here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import anyio

from ungater._kube.client import ApiError, KubeClient, Resource

__all__ = [
    "Gap",
    "IncompleteHistory",
    "RecorderBroken",
    "WatchSettings",
    "refuse_gaps",
    "watch_recorded",
]


@dataclass(frozen=True)
class Gap:
    """Events of one resource the recorder cannot have seen: those after ``after_rv`` (the last
    resourceVersion its watch delivered) up to ``until_rv`` (the relist that followed; None: to
    the end of the record)."""

    resource: str
    after_rv: int
    until_rv: int | None
    why: str

    def line(self) -> str:
        until = f"rv {self.until_rv}" if self.until_rv is not None else "the end of the record"
        return f"{self.resource} events after rv {self.after_rv} up to {until} unseen: {self.why}"


class IncompleteHistory(AssertionError):
    """The record has a gap: a judgement of it would judge less than what happened."""


class RecorderBroken(Exception):
    """The recorder's own bookkeeping failed on an event: the record stopped being kept."""


def refuse_gaps(gaps: list[Gap]) -> None:
    """Raise :class:`IncompleteHistory`, naming every gap, unless there is none."""
    if gaps:
        lines = "; ".join(g.line() for g in gaps)
        raise IncompleteHistory(
            f"the recorded history is incomplete, so it cannot be judged: {lines}"
        )


@dataclass(frozen=True)
class WatchSettings:
    rounds: int = 1000  # watches (or relists) per resource; running out is a gap
    watch_seconds: int = 60  # the server ends each watch after this long
    silence_seconds: float = 120.0  # a stream silent for longer is taken for dead
    list_seconds: float = 30.0  # one list, at most
    retry_seconds: float = 0.2  # before a watch is resumed or a relist tried again


#: the states of a resource at each revision after one resourceVersion up to another, in order
#: (each revision, one write to etcd: consecutive states differ by that write alone); None when
#: a revision cannot be read any more (compacted)
Recover = Callable[[int, int], Awaitable["list[tuple[str, list[dict[str, Any]]]] | None"]]
RECOVER_MAX = 300  # revisions a recovery reads at most; a longer gap stays a gap


class _Expired(Exception):
    """The server can no longer serve from the resourceVersion: relist."""


def _bookmark_rv(ev: dict[str, Any]) -> str:
    try:
        return str(ev["object"]["metadata"]["resourceVersion"])
    except Exception as exc:
        raise RecorderBroken(f"the recorder failed on a bookmark: {exc!r}") from exc


async def watch_recorded(
    client: KubeClient,
    resource: Resource,
    namespace: str,
    name: str,
    *,
    listed: Callable[[list[dict[str, Any]], str], None],
    event: Callable[[dict[str, Any]], str],
    gaps: list[Gap],
    selector: str = "",
    settings: WatchSettings = WatchSettings(),
    on_synced: Callable[[], None] = lambda: None,
    on_down: Callable[[str], None] = lambda why: None,
    recover: Recover | None = None,
) -> None:
    """List ``resource`` (``listed(items, list_rv)``), call ``on_synced``, then watch it in at
    most ``settings.rounds`` rounds, handing each event but a bookmark to ``event`` (which
    returns its resourceVersion), resuming from the last resourceVersion seen, or relisting
    when the server cannot serve from it. A :class:`Gap` named ``name`` is in ``gaps`` from the
    moment the server refused (a judgement made meanwhile refuses too) and ends at the relist.
    ``listed`` and ``event`` must raise :class:`RecorderBroken` on their own failures;
    ``on_down`` hears why each round failed. With ``recover``, a gap of at most
    ``RECOVER_MAX`` revisions is read back revision by revision (each state handed to
    ``listed``) before the relist; when every revision is read, nothing was missed and no gap
    stays (a 410 from a restarted API server's fresh watch cache, with etcd's history intact)."""
    s = settings
    with anyio.fail_after(s.list_seconds):
        items, rv = await client.list_objects(resource, namespace, selector)
    listed(items, rv)
    on_synced()
    expired = ""  # why the server can no longer serve from ``rv``: relist before watching
    down = ""  # why the last round failed: until the next watch is asked for
    pending: Gap | None = None  # the gap an expiry opened, in ``gaps`` until the relist ends it

    def open_gap(why: str) -> None:
        nonlocal pending
        pending = Gap(name, int(rv), None, f"{why}; not relisted yet")
        gaps.append(pending)

    def close_gap(until: Gap | None) -> None:
        nonlocal pending
        if pending is not None:
            gaps.remove(pending)
        if until is not None:
            gaps.append(until)
        pending = None

    try:
        for _ in range(s.rounds):
            if expired:
                try:
                    with anyio.fail_after(s.list_seconds):
                        items, list_rv = await client.list_objects(resource, namespace, selector)
                except Exception:  # the API server is away: try again, still expired
                    await anyio.sleep(s.retry_seconds)
                    continue
                changed = int(list_rv) != int(rv)  # else nothing was written since: no gap
                if changed and await _recovered(recover, int(rv), int(list_rv), listed):
                    changed = False  # every revision in between read: nothing unseen
                why = f"relisted after {expired}"
                close_gap(Gap(name, int(rv), int(list_rv), why) if changed else None)
                listed(items, list_rv)
                rv, expired = list_rv, ""
            down = ""
            try:
                stream: Any = client.watch(
                    resource, namespace, rv, selector, s.watch_seconds, s.silence_seconds
                )
                async with aclosing(stream):  # closed here, in this task, even on a failure
                    async for ev in stream:
                        kind = ev.get("type") if isinstance(ev, dict) else None
                        if kind == "ERROR":
                            status = ev.get("object") or {}
                            raise _Expired(f"ERROR event {status.get('code')}")
                        rv = _bookmark_rv(ev) if kind == "BOOKMARK" else event(ev)
            except RecorderBroken:
                raise  # its own failure: no retry hides it
            except _Expired as exc:
                expired = down = str(exc)
                on_down(down)
                open_gap(expired)
            except ApiError as exc:
                if exc.status == 410:  # GoneError: the history past ``rv`` is compacted
                    expired = down = f"410 Gone ({exc.reason})"
                    on_down(down)
                    open_gap(expired)
                else:  # served past ``rv`` again, or a 410 then
                    down = repr(exc)
                    on_down(down)
                    await anyio.sleep(s.retry_seconds)
            except Exception as exc:  # a cut, a silent stream, a restart: resume from rv
                down = repr(exc)
                on_down(down)
                await anyio.sleep(s.retry_seconds)
    except anyio.get_cancelled_exc_class():
        if down:  # stopped before the watch was back: what came after ``rv`` is unseen
            close_gap(Gap(name, int(rv), None, f"stopped with its watch down ({down})"))
        raise
    close_gap(None)
    gaps.append(Gap(name, int(rv), None, f"ran out of its {s.rounds} watch rounds: it stopped"))


async def _recovered(
    recover: Recover | None,
    after: int,
    until: int,
    listed: Callable[[list[dict[str, Any]], str], None],
) -> bool:
    """Read back the states after ``after`` up to ``until``; True when every one was read."""
    if recover is None or until - after > RECOVER_MAX:
        return False
    try:
        states = await recover(after, until)
    except Exception:  # the server away, or refusing: the gap stays
        return False
    if states is None:
        return False
    for rv, items in states:
        listed(items, rv)
    return True
