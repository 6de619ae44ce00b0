"""The harness's own API client: what it does in Kueue's and the Job controller's stead.

It is ungater's ``ApiClientKube`` on a kubernetes-asyncio ``ApiClient`` without a client-side
rate limit, plus ``deletecollection`` (one request empties a namespace of pods) for clean-up.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import anyio

from bench.objects import (
    JOBS,
    PODS,
    WORKLOADS,
    admission_status,
    finished_status,
    job_body,
    pod_body,
    workload_body,
)
from ungater._kube.adapter import ApiClientKube
from ungater._kube.client import ApiError, Resource

__all__ = ["BenchApi", "bounded_gather"]

NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
T = TypeVar("T")
_DELETE_ATTEMPTS = 10


async def bounded_gather(
    calls: Sequence[Callable[[], Awaitable[T]]], concurrency: int = 32
) -> list[T]:
    """Run ``calls`` with at most ``concurrency`` at once; results in order."""
    results: list[Any] = [None] * len(calls)
    slots = anyio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with slots:
            results[i] = await calls[i]()

    async with anyio.create_task_group() as tg:
        for i in range(len(calls)):
            tg.start_soon(one, i)
    return results


class BenchApi:
    def __init__(self, api_client: Any) -> None:
        self._api = api_client
        self.kube = ApiClientKube(api_client, limiter=None, request_timeout=60.0)

    @classmethod
    async def connect(
        cls, kubeconfig: Path, pool_size: int = 64, as_user: str | None = None
    ) -> BenchApi:
        """``as_user``: every request impersonates that user (the kubeconfig's may)."""
        from kubernetes_asyncio import client, config

        cfg = client.Configuration()
        await config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
        cfg.connection_pool_maxsize = pool_size
        api_client = client.ApiClient(configuration=cfg)
        if as_user is not None:
            api_client.set_default_header("Impersonate-User", as_user)
        return cls(api_client)

    async def close(self) -> None:
        await self._api.close()

    # -- namespaces and clean-up ---------------------------------------------------------------

    async def ensure_namespace(self, name: str, labels: dict[str, str] | None = None) -> None:
        meta: dict[str, Any] = {"name": name} | ({"labels": labels} if labels else {})
        try:
            await self.kube.create(NAMESPACES, None, {"metadata": meta})
        except ApiError as exc:
            if exc.status != 409:
                raise

    async def delete_namespace(self, name: str) -> None:
        await self.kube.delete(NAMESPACES, None, name)

    async def empty_namespace(self, ns: str) -> None:
        """Delete every pod, Workload and Job in ``ns`` (pods first: they go at once, unbound)."""
        from kubernetes_asyncio import client

        core = client.CoreV1Api(self._api)
        custom = client.CustomObjectsApi(self._api)
        batch = client.BatchV1Api(self._api)
        await _until_through(
            lambda: core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
        )
        await _until_through(
            lambda: custom.delete_collection_namespaced_custom_object(
                WORKLOADS.group, WORKLOADS.version, ns, WORKLOADS.plural
            )
        )
        await _until_through(
            lambda: batch.delete_collection_namespaced_job(ns, propagation_policy="Background")
        )

    async def count_pods(self, ns: str) -> int:
        items, _ = await self.kube.list_objects(PODS, ns)
        return len(items)

    # -- playing the Job controller -------------------------------------------------------------

    async def create_job(self, ns: str, name: str, parallelism: int, run: str) -> dict[str, Any]:
        return await self.kube.create(JOBS, ns, job_body(name, parallelism, run))

    async def create_pods(
        self, job: dict[str, Any], indexes: Sequence[int], run: str, concurrency: int = 32
    ) -> list[tuple[float, dict[str, Any]]]:
        """Create pods ``indexes`` of ``job``; each with the moment its request was sent."""
        ns = job["metadata"]["namespace"]

        def call(i: int) -> Callable[[], Awaitable[tuple[float, dict[str, Any]]]]:
            async def go() -> tuple[float, dict[str, Any]]:
                sent = time.monotonic()
                return sent, await self.kube.create(PODS, ns, pod_body(job, i, run))

            return go

        return await bounded_gather([call(i) for i in indexes], concurrency)

    async def scale_job(self, job: dict[str, Any], parallelism: int) -> None:
        meta = job["metadata"]
        body = {"spec": {"parallelism": parallelism, "completions": parallelism}}
        await self.kube.merge_patch(JOBS, meta["namespace"], meta["name"], body)

    async def set_pod_phase(self, ns: str, name: str, phase: str) -> None:
        await self.kube.merge_patch(PODS, ns, name, {"status": {"phase": phase}}, "status")

    # -- playing Kueue ---------------------------------------------------------------------------

    async def create_workload(
        self, job: dict[str, Any], name: str, count: int, run: str, replaces: str | None = None
    ) -> dict[str, Any]:
        ns = job["metadata"]["namespace"]
        return await self.kube.create(WORKLOADS, ns, workload_body(job, name, count, run, replaces))

    async def admit(self, ns: str, name: str, count: int) -> float:
        """Write the slice's admission; returns the moment the request was sent."""
        sent = time.monotonic()
        await self.kube.merge_patch(WORKLOADS, ns, name, admission_status(count), "status")
        return sent

    async def finish(self, ns: str, name: str) -> None:
        await self.kube.merge_patch(WORKLOADS, ns, name, finished_status(), "status")


async def _until_through(request: Callable[[], Awaitable[Any]]) -> None:
    """Send a delete-collection again (bounded) until one gets through. 100k pods take the API
    server longer than its request timeout: a 504, a dropped connection or a reply cut short
    ends the request, not the deletion, which the next request carries on."""
    from kubernetes_asyncio import client

    for attempt in range(1, _DELETE_ATTEMPTS + 1):
        try:
            await request()
            return
        except (client.ApiException, aiohttp.ClientError, TimeoutError) as exc:
            status = getattr(exc, "status", None)
            cut = not isinstance(exc, client.ApiException) or not status or status >= 500
            if not cut or attempt == _DELETE_ATTEMPTS:
                raise
