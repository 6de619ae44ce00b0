"""Test-side API helpers on top of ungater's own client: what the tests do in Kueue's and the
operators' stead (status writes, merge patches, deletes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ungater._kube.adapter import ApiClientKube, connect
from ungater._kube.client import GoneError, Resource

JOBSETS = Resource("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet")
RAYCLUSTERS = Resource("ray.io", "v1", "rayclusters", "RayCluster")


class Kube:
    def __init__(self, client: ApiClientKube) -> None:
        self.client = client

    @classmethod
    async def connect(cls, kubeconfig: Path) -> Kube:
        return cls(await connect(kubeconfig, qps=1000, burst=1000))

    async def close(self) -> None:
        await self.client.close()

    async def create(self, res: Resource, ns: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self.client.create(res, ns, body)

    async def get(self, res: Resource, ns: str, name: str) -> dict[str, Any] | None:
        return await self.client.get(res, ns, name)

    async def list(self, res: Resource, ns: str, selector: str = "") -> list[dict[str, Any]]:
        items, _ = await self.client.list_objects(res, ns, selector)
        return items

    async def list_at(
        self, res: Resource, ns: str, selector: str, rv: int
    ) -> list[dict[str, Any]] | None:
        """The objects as they were at revision ``rv`` exactly (read from etcd's history:
        ``resourceVersionMatch=Exact``); None once that revision is compacted (410), or when
        the client cannot ask (a client that offers ``list_at`` itself is asked instead)."""
        own = getattr(self.client, "list_at", None)
        if own is not None:
            found: list[dict[str, Any]] | None = await own(res, ns, selector, rv)
            return found
        if not isinstance(self.client, ApiClientKube):
            return None
        query = [("resourceVersion", str(rv)), ("resourceVersionMatch", "Exact")]
        if selector:
            query.append(("labelSelector", selector))
        try:
            data = await self.client._json(await self.client._request("GET", res.path(ns), query))
        except GoneError:
            return None
        return list(data.get("items") or [])

    async def merge_patch(
        self, res: Resource, ns: str, name: str, body: dict[str, Any], subresource: str = ""
    ) -> dict[str, Any]:
        return await self.client.merge_patch(res, ns, name, body, subresource)

    async def delete(self, res: Resource, ns: str, name: str) -> bool:
        return await self.client.delete(res, ns, name)

    async def json_patch(
        self, res: Resource, ns: str, name: str, ops: list[dict[str, Any]]
    ) -> dict[str, Any]:
        return await self.client.json_patch(res, ns, name, ops)


def dump(obj: Any) -> str:
    return json.dumps(obj, indent=1, sort_keys=True)[:4000]
