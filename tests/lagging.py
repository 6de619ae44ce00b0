"""A client in front of the in-memory API server whose chosen watch streams arrive late."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import anyio

from tests.fakekube import FakeKube
from ungater._kube.client import Resource


class Lagging:
    """A client whose chosen watch streams are held back until released (order kept)."""

    def __init__(self, inner: FakeKube) -> None:
        self.inner = inner
        self.holds: dict[tuple[str, str], anyio.Event] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def hold(self, plural: str, selector_part: str = "") -> anyio.Event:
        """Hold the watches of ``plural`` whose label selector contains ``selector_part``;
        set the returned event to let their events flow again."""
        gate = anyio.Event()
        self.holds[(plural, selector_part)] = gate
        return gate

    async def watch(
        self, resource: Resource, namespace: str | None, resource_version: str, *a: Any, **kw: Any
    ) -> AsyncIterator[dict[str, Any]]:
        selector = str(kw.get("label_selector", a[0] if a else ""))
        stream = self.inner.watch(resource, namespace, resource_version, *a, **kw)
        async with aclosing(stream):  # type: ignore[type-var]
            async for event in stream:
                for (plural, part), gate in list(self.holds.items()):
                    if plural == resource.plural and part in selector:
                        await gate.wait()
                yield event
