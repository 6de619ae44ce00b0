"""An in-memory stand-in for the API server, implementing ``ungater._kube.client.KubeClient``.

It keeps resourceVersions, replays watch history from a resourceVersion, answers 410 Gone for
compacted history, applies JSON and merge patches (422 when a JSON patch ``test`` fails), and
behaves as a real API server does where a controller can tell the difference:

- each watch delivers its events in order, but late: every event waits a random delay (from a
  seeded RNG, ``max_delay``), so two watches of the same object disagree for a while, as two
  real watch streams do;
- an object that stops matching a watch's label selector arrives as DELETED on that watch
  (its previous state at the new resourceVersion), one that starts matching as ADDED;
- watches can be cut (connection reset), expired mid-stream (410 Gone, the history compacted
  under them) or stalled (open but silent, until the client's silence timeout fires), and send
  a bookmark after ``bookmark_interval`` seconds of quiet;
- ``create`` of an existing name is 409 AlreadyExists;
- a pod update is validated as the API server validates one: scheduling gates can only be
  removed, never added; ``nodeSelector`` may only gain keys while the pod is gated, and is
  frozen once it is not; the rest of the spec (bar images, tolerations, activeDeadlineSeconds)
  and the identity fields are immutable. Patches are always validated; ``put`` (the tests' own
  writes, standing in for other controllers) only with ``strict=True``;
- deleting an object with finalizers only marks it terminating (``deletionTimestamp``); it goes
  when its last finalizer is removed (``finalize``).

- each client of the server can be its own view (``client(name)``: a ``KubeClient`` whose watches
  and patches carry its name), and one watch stream can lag alone (``lag_watches``: held back
  until released, or delayed by a fixed time; chosen by resource, client and label selector),
  so two pod watches of one pod disagree for as long as a test wants;
- a pod patch can be refused (403 or 422 from an admission webhook: never committed), fail
  (500: not committed) or time out (``PatchFault``): the client sees ``TimeoutError`` or a 504
  after ``answer_after`` seconds, and the write commits at a time of the fault's choosing:
  before the answer, after it (``lands_after``), when the test says (``LatePatch.land``), or
  never. A patch sent with a server timeout (the request's ``timeout``, as the API server
  honours it) never commits after that deadline has passed;
- another writer can remove our gate (``foreign_release``), as Kueue's own ungater would;
- every committed write is reported to ``observers`` (``Committed``: what, by whom, when the
  request was sent), so a test can check an invariant after each one, not only after ours.

Time is the running event loop's (``loop.time()``), so under ``VirtualTimeLoop`` every delay,
lag and timeout here, and the controller's own timers, run on a virtual clock that only moves
when every task waits: a loaded machine slows a test down but cannot change what it sees.

Tests inject the rest: fail or delay patches (``before_patch``), drop events (``drop_events``).
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import random
import selectors
import time
import uuid
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.lowlevel

from ungater._kube.client import PODS, ApiError, GoneError, Resource

_WAKE = object()  # wakes a watch so that it looks at its fault flag
_POD_SPEC_MUTABLE = ("schedulingGates", "nodeSelector", "activeDeadlineSeconds", "tolerations")


def _match(labels: dict[str, str], selector: str) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "=" in term:
            k, _, v = term.partition("=")
            if labels.get(k.rstrip("=")) != v.lstrip("="):
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def _labels(obj: dict[str, Any] | None) -> dict[str, str]:
    return ((obj or {}).get("metadata") or {}).get("labels") or {}


def _pointer(path: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in path.lstrip("/").split("/")]


# how the API server words a JSON patch that cannot be applied (a failed test, a missing path)
_PATCH_422 = "the server rejected our request due to an error in our request"


def apply_json_patch(obj: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 subset (test, remove, add, replace); raises ApiError(422) worded like the API
    server's (its JSON-patch library's text after the generic 422 message)."""
    doc = copy.deepcopy(obj)
    for op in ops:
        parent: Any = doc
        try:
            parts = _pointer(op["path"])
            for p in parts[:-1]:
                parent = parent[int(p)] if isinstance(parent, list) else parent[p]
            last = parts[-1]
            if op["op"] == "test":
                cur = parent[int(last)] if isinstance(parent, list) else parent[last]
                if cur != op["value"]:
                    raise ApiError(
                        422, f"{_PATCH_422}: testing value {op['path']} failed: test failed"
                    )
            elif op["op"] == "remove":
                if isinstance(parent, list):
                    parent.pop(int(last))
                else:
                    del parent[last]
            elif op["op"] in ("add", "replace"):
                if isinstance(parent, list):
                    if last == "-":
                        parent.append(op["value"])
                    elif op["op"] == "add":
                        parent.insert(int(last), op["value"])
                    else:
                        parent[int(last)] = op["value"]
                else:
                    parent[last] = op["value"]
            else:  # the API server refuses an operation it does not know
                raise ApiError(422, f"{_PATCH_422}: Unexpected kind: {op['op']}")
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            where = op.get("path", "(no path)")
            raise ApiError(422, f"{_PATCH_422}: doc is missing path: {where}") from exc
    return doc


def _gate_names(pod: dict[str, Any]) -> list[str]:
    return [g.get("name") for g in (pod.get("spec") or {}).get("schedulingGates") or []]


def validate_pod_update(old: dict[str, Any], new: dict[str, Any]) -> None:
    """Raise ApiError(422) for a pod update the API server refuses (ValidatePodUpdate's rules
    that matter to a gate releaser)."""
    name = old["metadata"].get("name")
    for key in ("name", "namespace", "uid"):
        if (new.get("metadata") or {}).get(key) != old["metadata"].get(key):
            raise ApiError(422, f"Pod {name!r} is invalid: metadata.{key}: field is immutable")
    old_spec, new_spec = old.get("spec") or {}, new.get("spec") or {}
    old_gates = _gate_names(old)
    added = [g for g in _gate_names(new) if g not in old_gates]
    if added:
        raise ApiError(
            422,
            f"Pod {name!r} is invalid: spec.schedulingGates: Forbidden: only deletion is "
            f"allowed, but found new scheduling gate {added[0]!r}",
        )
    old_sel, new_sel = old_spec.get("nodeSelector") or {}, new_spec.get("nodeSelector") or {}
    if old_gates:
        changed = [k for k, v in old_sel.items() if new_sel.get(k) != v]
        if changed:
            raise ApiError(
                422,
                f"Pod {name!r} is invalid: spec.nodeSelector: Invalid value: only additions to "
                f"spec.nodeSelector are allowed (no mutations or deletions): {changed[0]!r}",
            )
    elif old_sel != new_sel:
        raise ApiError(
            422,
            f"Pod {name!r} is invalid: spec: Forbidden: pod updates may not "
            "change fields other than ... (spec.nodeSelector of an ungated pod)",
        )

    def frozen(spec: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in spec.items() if k not in _POD_SPEC_MUTABLE}
        for part in ("containers", "initContainers"):
            if part in out:
                out[part] = [{k: v for k, v in c.items() if k != "image"} for c in out[part]]
        return out

    if frozen(old_spec) != frozen(new_spec):
        raise ApiError(
            422,
            f"Pod {name!r} is invalid: spec: Forbidden: pod updates may not change fields "
            "other than `spec.containers[*].image`, `spec.activeDeadlineSeconds`, "
            "`spec.tolerations` (only additions), `spec.schedulingGates` (only deletions) ...",
        )


def _now() -> float:
    """The running loop's clock (virtual under ``VirtualTimeLoop``), else the monotonic one."""
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return time.monotonic()


class _VirtualSelector(selectors.DefaultSelector):
    loop: VirtualTimeLoop | None = None

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if ready or self.loop is None or (timeout is not None and timeout <= 0):
            return ready
        if timeout is None:
            return super().select(None)  # nothing scheduled: only I/O (a thread) can wake us
        self.loop.virtual_now += timeout  # nothing ready: jump to the next timer
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An asyncio loop whose clock is virtual: when no callback is ready and no I/O is waiting,
    time jumps to the next timer instead of sleeping until it. Every ``sleep``, timeout and
    ``call_later`` (the fake's delays, the controller's expectations, backoffs and silence
    timeouts) then runs in virtual seconds: a run is as fast as its CPU work, and a loaded
    machine cannot stretch one part of it against another (with wall time, a starved loop
    lands a patch "late" or misses a deadline that the code under test never missed). Only for
    code without threads: a thread's work would not hold the clock back."""

    def __init__(self) -> None:
        selector = _VirtualSelector()
        super().__init__(selector)
        self.virtual_now = 0.0
        selector.loop = self

    def time(self) -> float:
        return self.virtual_now


_watch_serial = itertools.count(1)


@dataclass(eq=False)
class _Watch:
    rkey: tuple[str, str]
    namespace: str | None
    selector: str
    client: str = ""
    queue: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    last_due: float = 0.0
    fault: str = ""  # "cut", "gone" or "stall"
    changed: asyncio.Event = field(default_factory=asyncio.Event)  # a fault or a lag released
    serial: int = field(default_factory=lambda: next(_watch_serial))


@dataclass(eq=False)
class WatchLag:
    """A lag on the watch streams it matches: held back (``delay`` None: nothing is delivered,
    bookmarks neither, until ``release()``), or each event delayed by ``delay`` seconds more.
    Chosen by ``plural``, ``client`` (the name given to ``FakeKube.client``) and a part of the
    label ``selector``; with ``streams`` only the watches open when it was made (a reconnect
    escapes it), else also those opened later. Order within a stream is kept either way."""

    fake: FakeKube
    plural: str | None
    client: str | None
    selector: str
    delay: float | None
    streams: frozenset[int] | None = None
    released: bool = False

    def matches(self, w: _Watch) -> bool:
        return (
            not self.released
            and (self.plural is None or w.rkey[1] == self.plural)
            and (self.client is None or w.client == self.client)
            and self.selector in w.selector
            and (self.streams is None or w.serial in self.streams)
        )

    def release(self) -> None:
        """Let held events flow again (in order); later events are not delayed by it."""
        self.released = True
        if self in self.fake._lags:
            self.fake._lags.remove(self)
        for w in self.fake._watches:
            w.changed.set()


@dataclass(frozen=True)
class PatchFault:
    """What becomes of one pod patch instead of a plain success.

    ``status``: what the client is told: 403 or 422 (an admission webhook's refusal), 500 (a
    server error), 504 (the server's timeout), or None for the client's own ``TimeoutError``;
    ``answer_after``: seconds before it is told. ``lands_after``: seconds from the request's
    arrival until the write commits anyway (0: at once, the answer lost; more than
    ``answer_after``: after the client gave up); None: it never commits on its own.
    ``held``: kept in ``FakeKube.late_patches`` for the test to ``land()`` or ``drop()``."""

    status: int | None
    message: str = ""
    answer_after: float = 0.0
    lands_after: float | None = None
    held: bool = False

    @classmethod
    def refused(cls, status: int = 403, message: str = "") -> PatchFault:
        """An admission webhook said no: nothing is committed."""
        return cls(
            status,
            message
            or 'admission webhook "pods.policy.example.com" denied the request: '
            "scheduling gates are managed by policy",
        )

    @classmethod
    def errored(cls, status: int = 500) -> PatchFault:
        """A server error before the write: nothing is committed."""
        return cls(status, "Internal error occurred: etcdserver: leader changed")

    @classmethod
    def timed_out(
        cls,
        answer_after: float = 0.0,
        lands_after: float | None = None,
        *,
        status: int | None = None,
        held: bool = False,
    ) -> PatchFault:
        """The client gives up (``TimeoutError``, or a 504 with ``status``); the write may
        commit before that, after it, when the test says, or never."""
        message = "Timeout: request did not complete within requested timeout" if status else ""
        return cls(status, message, answer_after, lands_after, held)


@dataclass(eq=False)
class LatePatch:
    """A patch whose client was told it failed, while the server may still commit it.
    ``state``: pending, landed, failed (it no longer applies: the pod changed or went),
    expired (its server-side deadline passed first) or dropped."""

    fake: FakeKube
    resource: Resource
    namespace: str
    name: str
    ops: list[dict[str, Any]]
    client: str
    sent_at: float
    sent_rv: int
    deadline: float | None = None  # the server's own request deadline, when the client sent one
    state: str = "pending"

    def land(self) -> dict[str, Any] | None:
        """Commit it now, as the server would, if it still can; the written object or None."""
        if self.state != "pending":
            return None
        if self.deadline is not None and _now() >= self.deadline:
            self.state = "expired"  # the server abandoned the request at its deadline
            return None
        try:
            out = self.fake._commit_patch(
                self.resource,
                self.namespace,
                self.name,
                self.ops,
                f"late:{self.client}",
                (self.sent_at, self.sent_rv),
            )
        except ApiError:
            self.state = "failed"
            return None
        self.state = "landed"
        return out

    def drop(self) -> None:
        """It never commits."""
        if self.state == "pending":
            self.state = "dropped"


@dataclass(frozen=True)
class Committed:
    """One write the server committed, as ``FakeKube.observers`` see it. ``by``: "put" (a
    test's own write, standing in for other controllers), "delete", "patch:<client>",
    "late:<client>" (a patch committed after its client was told it failed), "foreign" or
    "merge"; ``sent_at``, ``sent_rv``: when a patch's request arrived, and the newest
    resourceVersion then (every write up to it came first); None for other writes."""

    rv: int
    plural: str
    etype: str
    obj: dict[str, Any]
    old: dict[str, Any] | None
    by: str
    sent_at: float | None = None
    sent_rv: int | None = None


class FakeKube:
    def __init__(
        self,
        served: dict[str, list[str]] | None = None,
        *,
        seed: int | None = None,
        max_delay: float = 0.0,
        bookmark_interval: float | None = None,
        strict: bool = False,
        lag: Mapping[str, float] | None = None,
    ) -> None:
        """``max_delay``: each watch event arrives after up to this many seconds (order kept
        within one watch, not between watches); ``seed`` makes the delays repeatable;
        ``bookmark_interval``: a quiet watch sends a bookmark this often; ``strict``: ``put``
        validates pod updates too, as if the test's writer went through the API server;
        ``lag``: a fixed extra delay for the watches of some plurals (a slow stream)."""
        self.served = served if served is not None else {"kueue.x-k8s.io": ["v1beta2", "v1beta1"]}
        self.rv = 0
        self.objects: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        # (rv, resource key, namespace, type, object, previous object)
        self.history: list[
            tuple[int, tuple[str, str], str, str, dict[str, Any], dict[str, Any] | None]
        ] = []
        self.compacted_rv = 0
        self._watches: list[_Watch] = []
        self._clock = itertools.count(1)
        self.rng = random.Random(seed)
        self._ids = random.Random(seed)  # UIDs and generated names: a seed replays them too
        self.max_delay = max_delay
        self.lag: Mapping[str, float] = dict(lag or {})
        self.bookmark_interval = bookmark_interval
        self.strict = strict
        self.patches: list[tuple[str, str, list[dict[str, Any]]]] = []
        self.before_patch: Callable[[str, str], Any] | None = None  # may raise or be async
        # True, or the plurals whose events the open watches never get
        self.drop_events: bool | Collection[str] = False
        self.requests = 0
        self.watches_opened = 0
        self.lists = 0
        self._lags: list[WatchLag] = []
        # one-shot faults for the next matching pod patch: (pod name or None, client or None)
        self._patch_faults: list[tuple[str | None, str | None, PatchFault]] = []
        # asked for every pod patch no one-shot fault took: (namespace, name, client)
        self.patch_policy: Callable[[str, str, str], PatchFault | None] | None = None
        self.late_patches: list[LatePatch] = []
        self.observers: list[Callable[[Committed], None]] = []

    # -- test helpers --------------------------------------------------------------------------

    @staticmethod
    def _rkey(resource: Resource) -> tuple[str, str]:
        return (resource.group, resource.plural)

    @staticmethod
    def _event_for(
        selector: str, etype: str, obj: dict[str, Any], old: dict[str, Any] | None
    ) -> dict[str, Any] | None:
        """What a watch with ``selector`` sees of a change (None: nothing)."""
        now_in = _match(_labels(obj), selector)
        if etype != "MODIFIED":
            return {"type": etype, "object": obj} if now_in else None
        was_in = old is not None and _match(_labels(old), selector)
        if now_in:
            return {"type": "MODIFIED" if was_in else "ADDED", "object": obj}
        if was_in and old is not None:
            gone = copy.deepcopy(old)  # the last state it matched in, at the new version
            gone["metadata"]["resourceVersion"] = obj["metadata"]["resourceVersion"]
            return {"type": "DELETED", "object": gone}
        return None

    def _push(self, w: _Watch, item: Any) -> None:
        lag = self.lag.get(w.rkey[1], 0.0)
        lag += sum(x.delay for x in self._lags if x.delay is not None and x.matches(w))
        if self.max_delay > 0 or lag > 0:
            delay = lag + self.rng.uniform(0, self.max_delay)
            due = max(w.last_due, _now() + delay)
        else:
            due = 0.0
        w.last_due = due
        w.queue.put_nowait((due, item))

    def _emit(
        self,
        rkey: tuple[str, str],
        ns: str,
        etype: str,
        obj: dict[str, Any],
        old: dict[str, Any] | None = None,
    ) -> None:
        obj, old = copy.deepcopy(obj), copy.deepcopy(old)
        self.history.append((self.rv, rkey, ns, etype, obj, old))
        if self.drop_events is True or (
            not isinstance(self.drop_events, bool) and rkey[1] in self.drop_events
        ):
            return  # lost on the way to the open watches (a reconnect replays the history)
        for w in self._watches:
            if w.rkey == rkey and (w.namespace is None or w.namespace == ns) and not w.fault:
                event = self._event_for(w.selector, etype, obj, old)
                if event is not None:
                    self._push(w, event)

    def _stamp(self) -> str:
        n = next(self._clock)
        return f"2026-01-01T{n // 3600 % 24:02d}:{n // 60 % 60:02d}:{n % 60:02d}Z"

    def put(self, resource: Resource, obj: dict[str, Any]) -> dict[str, Any]:
        """Create or replace an object (as a controller or kubectl would), emitting the event.
        With ``strict``, a pod update the API server would refuse raises ApiError(422)."""
        return self._write(resource, obj, validate=self.strict)

    def _observe(
        self,
        resource: Resource | tuple[str, str],
        etype: str,
        obj: dict[str, Any],
        old: dict[str, Any] | None,
        by: str,
        sent: tuple[float, int] | None,
    ) -> None:
        plural = resource[1] if isinstance(resource, tuple) else resource.plural
        at, rv = sent if sent is not None else (None, None)
        for observer in list(self.observers):
            observer(Committed(self.rv, plural, etype, obj, old, by, at, rv))

    def _write(
        self,
        resource: Resource,
        obj: dict[str, Any],
        validate: bool,
        by: str = "put",
        sent: tuple[float, int] | None = None,
    ) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        ns = meta.get("namespace", "") if resource.namespaced else ""
        key = (*self._rkey(resource), ns, meta["name"])
        old = self.objects.get(key)
        if old is None:
            meta.setdefault("uid", str(uuid.UUID(int=self._ids.getrandbits(128), version=4)))
            meta.setdefault("creationTimestamp", self._stamp())
            meta.pop("deletionTimestamp", None)  # only a delete marks an object terminating
        else:
            meta["uid"] = old["metadata"]["uid"]
            meta["creationTimestamp"] = old["metadata"]["creationTimestamp"]
            if validate:
                # an update cannot set or clear deletionTimestamp: only a delete sets it
                meta.pop("deletionTimestamp", None)
                if old["metadata"].get("deletionTimestamp"):
                    meta["deletionTimestamp"] = old["metadata"]["deletionTimestamp"]
                if resource.plural == "pods" and not resource.group:
                    validate_pod_update(old, obj)
        obj.setdefault("apiVersion", resource.api_version)
        obj.setdefault("kind", resource.kind)
        self.rv += 1
        meta["resourceVersion"] = str(self.rv)
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            # the last finalizer went: the object goes with it
            self.objects.pop(key, None)
            self._emit(key[:2], ns, "DELETED", obj)
            self._observe(resource, "DELETED", copy.deepcopy(obj), old, by, sent)
            return copy.deepcopy(obj)
        self.objects[key] = obj
        etype = "ADDED" if old is None else "MODIFIED"
        self._emit(key[:2], ns, etype, obj, old)
        self._observe(resource, etype, copy.deepcopy(obj), old, by, sent)
        return copy.deepcopy(obj)

    def read(self, resource: Resource, ns: str, name: str) -> dict[str, Any] | None:
        obj = self.objects.get((*self._rkey(resource), ns, name))
        return copy.deepcopy(obj) if obj else None

    def delete(self, resource: Resource, ns: str, name: str) -> None:
        """Delete as the API server does: an object with finalizers only becomes terminating
        (``deletionTimestamp`` set) until they are removed; others go at once."""
        key = (*self._rkey(resource), ns, name)
        obj = self.objects.get(key)
        if obj is None:
            return
        meta = obj["metadata"]
        if meta.get("finalizers"):
            if not meta.get("deletionTimestamp"):
                old = copy.deepcopy(obj)
                self.rv += 1
                meta["deletionTimestamp"] = self._stamp()
                meta["deletionGracePeriodSeconds"] = 0
                meta["resourceVersion"] = str(self.rv)
                self._emit(key[:2], ns, "MODIFIED", obj, old)
                self._observe(key[:2], "MODIFIED", copy.deepcopy(obj), old, "delete", None)
            return
        del self.objects[key]
        self.rv += 1
        meta["resourceVersion"] = str(self.rv)
        self._emit(key[:2], ns, "DELETED", obj)
        self._observe(key[:2], "DELETED", copy.deepcopy(obj), None, "delete", None)

    def finalize(self, resource: Resource, ns: str, name: str) -> None:
        """Remove every finalizer (as their controllers would): a terminating object goes."""
        obj = self.read(resource, ns, name)
        if obj is not None and obj["metadata"].get("finalizers"):
            obj["metadata"]["finalizers"] = []
            self._write(resource, obj, validate=False, by="finalize")

    def items(self, resource: Resource, ns: str | None = None) -> list[dict[str, Any]]:
        rk = self._rkey(resource)
        return [
            copy.deepcopy(o)
            for k, o in self.objects.items()
            if k[:2] == rk and (ns is None or k[2] == ns)
        ]

    def compact(self) -> None:
        """Forget history: watches from an older resourceVersion get 410 Gone."""
        self.compacted_rv = self.rv
        self.history.clear()

    def _fault(self, kind: str, plural: str | None) -> int:
        hit = 0
        for w in self._watches:
            if (plural is None or w.rkey[1] == plural) and not w.fault:
                w.fault = kind
                w.queue.put_nowait((0.0, _WAKE))
                w.changed.set()
                hit += 1
        return hit

    # -- views, lags, faults and other writers -------------------------------------------------

    def client(self, name: str) -> FakeClient:
        """A client of this server named ``name``: a ``KubeClient`` like the server itself,
        whose watches ``lag_watches(client=name)`` can pick and whose patches ``fail_patch`` and
        ``patch_policy`` see by that name (one per controller replica)."""
        return FakeClient(self, name)

    def lag_watches(
        self,
        plural: str | None = None,
        *,
        client: str | None = None,
        selector: str = "",
        delay: float | None = None,
        open_only: bool = False,
    ) -> WatchLag:
        """Hold back (``delay`` None) or slow down the watches of ``plural`` opened by
        ``client`` whose label selector contains ``selector``: one stream, while the others
        of the same objects flow (see ``WatchLag``). ``open_only``: only the streams open now."""
        streams = None
        if open_only:
            streams = frozenset(
                w.serial
                for w in self._watches
                if WatchLag(self, plural, client, selector, None).matches(w)
            )
        lag = WatchLag(self, plural, client, selector, delay, streams)
        self._lags.append(lag)
        return lag

    def open_watches(self, plural: str | None = None, client: str | None = None) -> list[str]:
        """The label selectors of the open watches (of ``plural``, of ``client``)."""
        return [
            w.selector
            for w in self._watches
            if (plural is None or w.rkey[1] == plural) and (client is None or w.client == client)
        ]

    def fail_patch(
        self, fault: PatchFault, name: str | None = None, client: str | None = None
    ) -> None:
        """The next pod patch of ``name`` (any, if None) from ``client`` (any) meets ``fault``."""
        self._patch_faults.append((name, client, fault))

    def foreign_release(self, namespace: str, name: str, gate: str) -> dict[str, Any] | None:
        """Another writer removes ``gate`` from a pod at once (as Kueue's own ungater would),
        with the same guarded patch a releaser sends; None when the pod or the gate is gone."""
        obj = self.objects.get((*self._rkey(PODS), namespace, name))
        if obj is None or gate not in _gate_names(obj):
            return None
        path = f"/spec/schedulingGates/{_gate_names(obj).index(gate)}"
        ops = [
            {"op": "test", "path": f"{path}/name", "value": gate},
            {"op": "remove", "path": path},
        ]
        return self._write(PODS, apply_json_patch(obj, ops), validate=True, by="foreign")

    def cut_watches(self, plural: str | None = None) -> int:
        """Reset the open watch connections (undelivered events are lost with them)."""
        return self._fault("cut", plural)

    def expire_watches(self, plural: str | None = None) -> int:
        """Compact the history and end the open watches with 410 Gone, mid-stream: a client
        must relist, since it cannot watch from its resourceVersion again."""
        self.compact()
        return self._fault("gone", plural)

    def stall_watches(self, plural: str | None = None) -> int:
        """The open watches go silent (the connection stays up, nothing more arrives): only
        the client's own silence timeout can notice."""
        return self._fault("stall", plural)

    def bookmark(self) -> None:
        for w in self._watches:
            self._push(w, self._bookmark_event())

    def _bookmark_event(self) -> dict[str, Any]:
        return {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": str(self.rv)}}}

    # -- KubeClient -------------------------------------------------------------------------

    async def list_objects(
        self, resource: Resource, namespace: str | None, label_selector: str = ""
    ) -> tuple[list[dict[str, Any]], str]:
        self.requests += 1
        self.lists += 1
        await anyio.lowlevel.checkpoint()
        out = [
            o
            for o in self.items(resource, namespace)
            if _match(o["metadata"].get("labels") or {}, label_selector)
        ]
        return out, str(self.rv)

    async def list_pages(
        self, resource: Resource, namespace: str | None, label_selector: str = ""
    ) -> AsyncIterator[tuple[list[dict[str, Any]], str]]:
        items, rv = await self.list_objects(resource, namespace, label_selector)
        for start in range(0, max(len(items), 1), 500):  # pages as the API server cuts them
            yield items[start : start + 500], rv

    def watch(
        self,
        resource: Resource,
        namespace: str | None,
        resource_version: str,
        label_selector: str = "",
        timeout_seconds: int = 300,
        silence_seconds: float = 90.0,
    ) -> AsyncIterator[dict[str, Any]]:
        return self._watch(
            resource, namespace, resource_version, label_selector, timeout_seconds, silence_seconds
        )

    async def _watch(
        self,
        resource: Resource,
        namespace: str | None,
        resource_version: str,
        label_selector: str = "",
        timeout_seconds: float = 300,
        silence_seconds: float = 90.0,
        client: str = "",
    ) -> AsyncIterator[dict[str, Any]]:
        self.requests += 1
        start = int(resource_version or 0)
        if start < self.compacted_rv:
            raise GoneError()
        self.watches_opened += 1
        rk = self._rkey(resource)
        w = _Watch(rk, namespace, label_selector, client)
        for rv, hk, ns, etype, obj, old in self.history:
            if rv > start and hk == rk and (namespace is None or ns == namespace):
                event = self._event_for(label_selector, etype, obj, old)
                if event is not None:
                    self._push(w, event)
        self._watches.append(w)
        try:
            with anyio.move_on_after(timeout_seconds):
                while True:
                    with anyio.fail_after(silence_seconds):
                        event = await self._next(w)
                    yield copy.deepcopy(event)
        finally:
            self._watches.remove(w)

    async def _next(self, w: _Watch) -> dict[str, Any]:
        """The watch's next event, once its delay has passed and no lag holds it; raises on a
        fault."""
        while True:
            await self._check_fault(w)
            await self._unheld(w)
            if self.bookmark_interval is not None and w.queue.empty():
                with anyio.move_on_after(self.bookmark_interval):
                    due, item = await w.queue.get()
                    break
                if w.queue.empty() and not w.fault and not self._held(w):
                    return self._bookmark_event()  # everything sent so far was delivered
                continue
            due, item = await w.queue.get()
            break
        wait = due - _now()
        if wait > 0:
            await anyio.sleep(wait)
        await self._check_fault(w)
        await self._unheld(w)  # held since it was queued: it waits in hand, in order
        await self._check_fault(w)
        if item is _WAKE:
            return await self._next(w)
        return item  # type: ignore[no-any-return]

    def _held(self, w: _Watch) -> bool:
        return any(x.delay is None and x.matches(w) for x in self._lags)

    async def _unheld(self, w: _Watch) -> None:
        while self._held(w) and not w.fault:  # each pass waits for a release or a fault
            w.changed = asyncio.Event()
            await w.changed.wait()

    @staticmethod
    async def _check_fault(w: _Watch) -> None:
        if w.fault == "cut":
            raise ConnectionResetError("watch connection cut (fake)")
        if w.fault == "gone":
            raise GoneError("too old resource version (fake: history compacted)")
        if w.fault == "stall":
            await anyio.sleep_forever()  # until the caller's silence timeout ends the stream

    async def get(
        self, resource: Resource, namespace: str | None, name: str
    ) -> dict[str, Any] | None:
        self.requests += 1
        await anyio.lowlevel.checkpoint()
        return self.read(resource, namespace or "", name)

    async def json_patch(
        self, resource: Resource, namespace: str | None, name: str, ops: list[dict[str, Any]]
    ) -> dict[str, Any]:
        return await self._json_patch(resource, namespace, name, ops)

    async def _json_patch(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        ops: list[dict[str, Any]],
        client: str = "",
        server_timeout: float | None = None,
    ) -> dict[str, Any]:
        self.requests += 1
        if self.before_patch is not None:
            result = self.before_patch(namespace or "", name)
            if asyncio.iscoroutine(result):
                await result
        await anyio.lowlevel.checkpoint()
        ns, sent = namespace or "", (_now(), self.rv)
        fault = self._fault_for(resource, ns, name, client)
        if fault is None:
            return self._commit_patch(resource, ns, name, ops, f"patch:{client}", sent)
        if fault.lands_after is not None or fault.held:
            deadline = None if server_timeout is None else sent[0] + server_timeout
            late = LatePatch(self, resource, ns, name, ops, client, *sent, deadline)
            self.late_patches.append(late)
            if fault.lands_after is not None and fault.lands_after <= 0:
                late.land()  # committed; only the answer is lost
            elif fault.lands_after is not None:
                asyncio.get_running_loop().call_later(fault.lands_after, late.land)
        if fault.answer_after > 0:
            await anyio.sleep(fault.answer_after)
        if fault.status is None:
            raise TimeoutError(f"patch of pod {ns}/{name} timed out (fake)")
        raise ApiError(fault.status, fault.message, f'{{"message": "{fault.message}"}}')

    def _fault_for(
        self, resource: Resource, namespace: str, name: str, client: str
    ) -> PatchFault | None:
        if resource.plural != "pods" or resource.group:
            return None
        for entry in self._patch_faults:
            want_name, want_client, fault = entry
            if want_name in (None, name) and want_client in (None, client):
                self._patch_faults.remove(entry)
                return fault
        return None if self.patch_policy is None else self.patch_policy(namespace, name, client)

    def _commit_patch(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        ops: list[dict[str, Any]],
        by: str,
        sent: tuple[float, int] | None,
    ) -> dict[str, Any]:
        obj = self.objects.get((*self._rkey(resource), namespace, name))
        if obj is None:
            raise ApiError(404, "not found")
        patched = apply_json_patch(obj, ops)
        out = self._write(resource, patched, validate=True, by=by, sent=sent)
        self.patches.append((namespace, name, ops))
        return out

    async def create(
        self, resource: Resource, namespace: str | None, body: dict[str, Any]
    ) -> dict[str, Any]:
        self.requests += 1
        body = copy.deepcopy(body)
        meta = body.setdefault("metadata", {})
        meta.setdefault("namespace", namespace or "")
        if not meta.get("name"):
            meta["name"] = f"{meta.get('generateName', 'obj-')}{self._ids.getrandbits(20):05x}"
        ns = meta["namespace"] if resource.namespaced else ""
        if (*self._rkey(resource), ns, meta["name"]) in self.objects:
            raise ApiError(
                409, f'{resource.plural} "{meta["name"]}" already exists (AlreadyExists)'
            )
        meta.pop("resourceVersion", None)
        return self._write(resource, body, validate=False)

    async def served_versions(self, group: str) -> list[str]:
        return list(self.served.get(group, []))

    async def close(self) -> None:
        return None

    # -- merge patch (added for the Lease and Event writers) ----------------------------------

    # may raise or be async; called with (namespace, name) before a merge patch is applied
    before_merge_patch: Callable[[str, str], Any] | None = None

    async def merge_patch(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        body: dict[str, Any],
        subresource: str = "",
    ) -> dict[str, Any]:
        """RFC 7386 merge patch, like ``ApiClientKube.merge_patch``. A ``metadata.resourceVersion``
        in the body is a precondition: 409 Conflict when the object has moved on."""
        self.requests += 1
        if self.before_merge_patch is not None:
            result = self.before_merge_patch(namespace or "", name)
            if asyncio.iscoroutine(result):
                await result
        await anyio.lowlevel.checkpoint()
        key = (*self._rkey(resource), namespace or "", name)
        obj = self.objects.get(key)
        if obj is None:
            raise ApiError(404, "not found")
        body = copy.deepcopy(body)
        wanted = (body.get("metadata") or {}).pop("resourceVersion", None)
        if wanted is not None and str(wanted) != obj["metadata"]["resourceVersion"]:
            raise ApiError(
                409,
                f"Operation cannot be fulfilled on {resource.plural} {name!r}: the object has "
                "been modified; please apply your changes to the latest version and try again",
            )
        return self._write(resource, apply_merge_patch(obj, body), validate=True, by="merge")


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge key by key, ``null`` deletes a key, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = apply_merge_patch(out.get(k), v)
    return out


class FakeClient:
    """One client's view of a ``FakeKube`` (``FakeKube.client``): the same ``KubeClient``,
    but its watches and patches carry its name, so one replica's pod watch can lag alone and
    its patches can be picked for faults."""

    def __init__(self, fake: FakeKube, name: str) -> None:
        self.fake = fake
        self.name = name

    async def list_objects(
        self, resource: Resource, namespace: str | None, label_selector: str = ""
    ) -> tuple[list[dict[str, Any]], str]:
        return await self.fake.list_objects(resource, namespace, label_selector)

    def list_pages(
        self, resource: Resource, namespace: str | None, label_selector: str = ""
    ) -> AsyncIterator[tuple[list[dict[str, Any]], str]]:
        return self.fake.list_pages(resource, namespace, label_selector)

    def watch(
        self,
        resource: Resource,
        namespace: str | None,
        resource_version: str,
        label_selector: str = "",
        timeout_seconds: int = 300,
        silence_seconds: float = 90.0,
    ) -> AsyncIterator[dict[str, Any]]:
        return self.fake._watch(
            resource,
            namespace,
            resource_version,
            label_selector,
            timeout_seconds,
            silence_seconds,
            self.name,
        )

    async def get(
        self, resource: Resource, namespace: str | None, name: str
    ) -> dict[str, Any] | None:
        return await self.fake.get(resource, namespace, name)

    async def json_patch(
        self, resource: Resource, namespace: str | None, name: str, ops: list[dict[str, Any]]
    ) -> dict[str, Any]:
        return await self.fake._json_patch(resource, namespace, name, ops, self.name)

    async def create(
        self, resource: Resource, namespace: str | None, body: dict[str, Any]
    ) -> dict[str, Any]:
        return await self.fake.create(resource, namespace, body)

    async def merge_patch(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        body: dict[str, Any],
        subresource: str = "",
    ) -> dict[str, Any]:
        return await self.fake.merge_patch(resource, namespace, name, body, subresource)

    async def served_versions(self, group: str) -> list[str]:
        return await self.fake.served_versions(group)

    async def close(self) -> None:
        return None
