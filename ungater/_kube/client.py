"""The client seam: a small protocol for the few API calls the controller makes.

Everything above this module sees raw JSON dicts and a handful of errors. Tests substitute an
in-memory fake with the same protocol; production uses ``adapter.ApiClientKube``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote

__all__ = [
    "EVENTS",
    "PODS",
    "ApiError",
    "GoneError",
    "KubeClient",
    "Resource",
    "selector_text",
]


def selector_text(labels: Mapping[str, str]) -> str:
    """A label selector of equalities as the API server's query takes it, in key order."""
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


@dataclass(frozen=True, slots=True)
class Resource:
    """An API resource by group, version and plural name."""

    group: str
    version: str
    plural: str
    kind: str = ""
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if namespace and self.namespaced:
            base += f"/namespaces/{quote(namespace, safe='')}"
        base += f"/{self.plural}"
        if name:
            base += f"/{quote(name, safe='')}"
        return base


PODS = Resource("", "v1", "pods", "Pod")
EVENTS = Resource("", "v1", "events", "Event")


class ApiError(Exception):
    """The API server answered with an error status."""

    def __init__(self, status: int, reason: str = "", body: str = "") -> None:
        super().__init__(f"HTTP {status} {reason}".strip())
        self.status = status
        self.reason = reason
        self.body = body


class GoneError(ApiError):
    """410 Gone: the resourceVersion is too old to watch from; relist."""

    def __init__(self, reason: str = "resource version too old") -> None:
        super().__init__(410, reason)


class KubeClient(Protocol):
    """The calls the controller needs. Objects are raw JSON dicts."""

    async def list_objects(
        self, resource: Resource, namespace: str | None, label_selector: str = ""
    ) -> tuple[list[dict[str, Any]], str]:
        """All matching objects and the list's resourceVersion."""
        ...

    def list_pages(
        self, resource: Resource, namespace: str | None, label_selector: str = ""
    ) -> AsyncIterator[tuple[list[dict[str, Any]], str]]:
        """The same list, one page at a time, each with the list's resourceVersion so far (the
        last page's is the list's). Lets a cache keep slim views without holding every raw
        object of a large list at once."""
        ...

    def watch(
        self,
        resource: Resource,
        namespace: str | None,
        resource_version: str,
        label_selector: str = "",
        timeout_seconds: int = 300,
        silence_seconds: float = 90.0,
    ) -> AsyncIterator[dict[str, Any]]:
        """Watch events ({"type", "object"}), with bookmarks. Raises GoneError on 410 and
        TimeoutError when the stream is silent for longer than ``silence_seconds``."""
        ...

    async def get(
        self, resource: Resource, namespace: str | None, name: str
    ) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        ...

    async def json_patch(
        self, resource: Resource, namespace: str | None, name: str, ops: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """Apply a JSON patch (RFC 6902); the patched object."""
        ...

    async def create(
        self, resource: Resource, namespace: str | None, body: dict[str, Any]
    ) -> dict[str, Any]: ...

    async def merge_patch(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        body: dict[str, Any],
        subresource: str = "",
    ) -> dict[str, Any]:
        """A JSON merge patch; with ``metadata.resourceVersion`` it is an optimistic lock (409)."""
        ...

    async def served_versions(self, group: str) -> list[str]:
        """The versions of an API group the server serves (empty if the group is unknown)."""
        ...

    async def close(self) -> None: ...
