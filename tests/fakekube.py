"""An in-memory stand-in for the API server, implementing ``ungater._kube.KubeClient``.

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

Tests inject the rest: fail or delay patches (``before_patch``), drop events (``drop_events``).
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.lowlevel

from ungater._kube import ApiError, GoneError, Resource

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
        parts = _pointer(op["path"])
        parent: Any = doc
        try:
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
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            raise ApiError(422, f"{_PATCH_422}: doc is missing path: {op['path']}") from exc
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


@dataclass(eq=False)
class _Watch:
    rkey: tuple[str, str]
    namespace: str | None
    selector: str
    queue: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    last_due: float = 0.0
    fault: str = ""  # "cut", "gone" or "stall"


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
        if self.max_delay > 0 or lag > 0:
            delay = lag + self.rng.uniform(0, self.max_delay)
            due = max(w.last_due, time.monotonic() + delay)
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

    def _write(self, resource: Resource, obj: dict[str, Any], validate: bool) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        ns = meta.get("namespace", "") if resource.namespaced else ""
        key = (*self._rkey(resource), ns, meta["name"])
        old = self.objects.get(key)
        if old is None:
            meta.setdefault("uid", str(uuid.uuid4()))
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
            return copy.deepcopy(obj)
        self.objects[key] = obj
        self._emit(key[:2], ns, "ADDED" if old is None else "MODIFIED", obj, old)
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
            return
        del self.objects[key]
        self.rv += 1
        meta["resourceVersion"] = str(self.rv)
        self._emit(key[:2], ns, "DELETED", obj)

    def finalize(self, resource: Resource, ns: str, name: str) -> None:
        """Remove every finalizer (as their controllers would): a terminating object goes."""
        obj = self.read(resource, ns, name)
        if obj is not None and obj["metadata"].get("finalizers"):
            obj["metadata"]["finalizers"] = []
            self._write(resource, obj, validate=False)

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
                hit += 1
        return hit

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

    async def watch(
        self,
        resource: Resource,
        namespace: str | None,
        resource_version: str,
        label_selector: str = "",
        timeout_seconds: int = 300,
        silence_seconds: float = 90.0,
    ) -> AsyncIterator[dict[str, Any]]:
        self.requests += 1
        start = int(resource_version or 0)
        if start < self.compacted_rv:
            raise GoneError()
        self.watches_opened += 1
        rk = self._rkey(resource)
        w = _Watch(rk, namespace, label_selector)
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
        """The watch's next event, once its delay has passed; raises on a fault."""
        while True:
            await self._check_fault(w)
            if self.bookmark_interval is not None and w.queue.empty():
                with anyio.move_on_after(self.bookmark_interval):
                    due, item = await w.queue.get()
                    break
                if w.queue.empty() and not w.fault:
                    return self._bookmark_event()  # everything sent so far was delivered
                continue
            due, item = await w.queue.get()
            break
        wait = due - time.monotonic()
        if wait > 0:
            await anyio.sleep(wait)
        await self._check_fault(w)
        if item is _WAKE:
            return await self._next(w)
        return item  # type: ignore[no-any-return]

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
        self.requests += 1
        if self.before_patch is not None:
            result = self.before_patch(namespace or "", name)
            if asyncio.iscoroutine(result):
                await result
        await anyio.lowlevel.checkpoint()
        key = (*self._rkey(resource), namespace or "", name)
        obj = self.objects.get(key)
        if obj is None:
            raise ApiError(404, "not found")
        patched = apply_json_patch(obj, ops)
        out = self._write(resource, patched, validate=True)
        self.patches.append((namespace or "", name, ops))
        return out

    async def create(
        self, resource: Resource, namespace: str | None, body: dict[str, Any]
    ) -> dict[str, Any]:
        self.requests += 1
        body = copy.deepcopy(body)
        meta = body.setdefault("metadata", {})
        meta.setdefault("namespace", namespace or "")
        if not meta.get("name"):
            meta["name"] = f"{meta.get('generateName', 'obj-')}{uuid.uuid4().hex[:5]}"
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
        return self._write(resource, apply_merge_patch(obj, body), validate=True)


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
