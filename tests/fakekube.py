"""An in-memory stand-in for the API server, implementing ``ungater.kube.KubeClient``.

It keeps resourceVersions, replays watch history from a resourceVersion, answers 410 Gone for
compacted history, applies JSON patches with ``test`` semantics (422 when a test fails), and
lets tests inject faults: cut watches, fail or delay patches, drop events.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import anyio.lowlevel

from ungater.kube import ApiError, GoneError, Resource

_CUT = object()


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


def _pointer(path: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in path.lstrip("/").split("/")]


def apply_json_patch(obj: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 subset (test, remove, add, replace); raises ApiError(422) like the API server."""
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
                    raise ApiError(422, "the server rejected our request: test operation failed")
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
            raise ApiError(422, f"invalid patch at {op['path']}: {exc!r}") from exc
    return doc


class FakeKube:
    def __init__(self, served: dict[str, list[str]] | None = None) -> None:
        self.served = served if served is not None else {"kueue.x-k8s.io": ["v1beta2", "v1beta1"]}
        self.rv = 0
        self.objects: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        self.history: list[tuple[int, tuple[str, str], str, dict[str, Any]]] = []
        self.compacted_rv = 0
        self._watchers: list[tuple[tuple[str, str], str | None, str, asyncio.Queue[Any]]] = []
        self._clock = itertools.count(1)
        self.patches: list[tuple[str, str, list[dict[str, Any]]]] = []
        self.before_patch: Callable[[str, str], Any] | None = None  # may raise or be async
        self.drop_events = False
        self.requests = 0

    # -- test helpers --------------------------------------------------------------------------

    @staticmethod
    def _rkey(resource: Resource) -> tuple[str, str]:
        return (resource.group, resource.plural)

    def _emit(self, rkey: tuple[str, str], ns: str, etype: str, obj: dict[str, Any]) -> None:
        event = {"type": etype, "object": copy.deepcopy(obj)}
        self.history.append((self.rv, rkey, ns, event))
        if self.drop_events:
            return
        for wkey, wns, sel, q in self._watchers:
            labels = obj.get("metadata", {}).get("labels") or {}
            if wkey == rkey and (wns is None or wns == ns) and _match(labels, sel):
                q.put_nowait(event)

    def put(self, resource: Resource, obj: dict[str, Any]) -> dict[str, Any]:
        """Create or replace an object (as a controller or kubectl would), emitting the event."""
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        ns = meta.get("namespace", "") if resource.namespaced else ""
        key = (*self._rkey(resource), ns, meta["name"])
        old = self.objects.get(key)
        self.rv += 1
        if old is None:
            meta.setdefault("uid", str(uuid.uuid4()))
            n = next(self._clock)
            stamp = f"2026-01-01T{n // 3600 % 24:02d}:{n // 60 % 60:02d}:{n % 60:02d}Z"
            meta.setdefault("creationTimestamp", stamp)
        else:
            meta["uid"] = old["metadata"]["uid"]
            meta["creationTimestamp"] = old["metadata"]["creationTimestamp"]
        meta["resourceVersion"] = str(self.rv)
        obj.setdefault("apiVersion", resource.api_version)
        obj.setdefault("kind", resource.kind)
        self.objects[key] = obj
        self._emit(key[:2], ns, "ADDED" if old is None else "MODIFIED", obj)
        return copy.deepcopy(obj)

    def read(self, resource: Resource, ns: str, name: str) -> dict[str, Any] | None:
        obj = self.objects.get((*self._rkey(resource), ns, name))
        return copy.deepcopy(obj) if obj else None

    def delete(self, resource: Resource, ns: str, name: str) -> None:
        obj = self.objects.pop((*self._rkey(resource), ns, name), None)
        if obj is not None:
            self.rv += 1
            obj["metadata"]["resourceVersion"] = str(self.rv)
            self._emit(self._rkey(resource), ns, "DELETED", obj)

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

    def cut_watches(self) -> None:
        for *_, q in self._watchers:
            q.put_nowait(_CUT)

    def bookmark(self) -> None:
        for *_, q in self._watchers:
            q.put_nowait(
                {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": str(self.rv)}}}
            )

    # -- KubeClient -------------------------------------------------------------------------

    async def list_objects(
        self, resource: Resource, namespace: str | None, label_selector: str = ""
    ) -> tuple[list[dict[str, Any]], str]:
        self.requests += 1
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
        q: asyncio.Queue[Any] = asyncio.Queue()
        rk = self._rkey(resource)
        for rv, hk, ns, event in self.history:
            labels = event["object"].get("metadata", {}).get("labels") or {}
            if (
                rv > start
                and hk == rk
                and (namespace is None or ns == namespace)
                and _match(labels, label_selector)
            ):
                q.put_nowait(event)
        entry = (rk, namespace, label_selector, q)
        self._watchers.append(entry)
        try:
            with anyio.move_on_after(timeout_seconds):
                while True:
                    with anyio.fail_after(silence_seconds):
                        event = await q.get()
                    if event is _CUT:
                        raise ConnectionResetError("watch connection cut (fake)")
                    yield copy.deepcopy(event)
        finally:
            self._watchers.remove(entry)

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
        self.patches.append((namespace or "", name, ops))
        return self.put(resource, patched)

    async def create(
        self, resource: Resource, namespace: str | None, body: dict[str, Any]
    ) -> dict[str, Any]:
        body = copy.deepcopy(body)
        body.setdefault("metadata", {}).setdefault("namespace", namespace or "")
        if not body["metadata"].get("name"):
            body["metadata"]["name"] = (
                f"{body['metadata'].get('generateName', 'obj-')}{uuid.uuid4().hex[:5]}"
            )
        return self.put(resource, body)

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
        return self.put(resource, apply_merge_patch(obj, body))


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
