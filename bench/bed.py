"""A test bed: one namespace, the harness's API client and pod observer, and helpers that set
up an elastic Job (pods created, slice pending) and clean the namespace between repeats."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from bench.api import BenchApi
from bench.observer import PodObserver

__all__ = ["Bed", "ElasticJob", "bed_on_fresh_plane", "settle_seconds"]


def settle_seconds(pods: int) -> float:
    """Time given to the controller to digest ``pods`` watch events before the trigger."""
    return 0.3 + pods / 1000


@dataclass
class ElasticJob:
    job: dict[str, Any]
    slice_name: str
    pods: list[dict[str, Any]] = field(default_factory=list)

    @property
    def uid(self) -> str:
        return str(self.job["metadata"]["uid"])

    @property
    def namespace(self) -> str:
        return str(self.job["metadata"]["namespace"])

    def pod_uids(self) -> list[str]:
        return [p["metadata"]["uid"] for p in self.pods]


@dataclass
class Bed:
    api: BenchApi
    namespace: str
    kubeconfig: Path
    run: str
    observer: PodObserver
    _names: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def name(self, stem: str) -> str:
        return f"{stem}-{next(self._names)}"

    async def elastic_job(
        self,
        stem: str,
        parallelism: int,
        pods: int | None = None,
        slice_count: int | None = None,
    ) -> ElasticJob:
        """A Job, its first slice (pending) and ``pods`` (default all) gated pods, all seen."""
        name = self.name(stem)
        job = await self.api.create_job(self.namespace, name, parallelism, self.run)
        ej = ElasticJob(job, f"job-{name}-a")
        count = parallelism if slice_count is None else slice_count
        await self.api.create_workload(job, ej.slice_name, count, self.run)
        n = parallelism if pods is None else pods
        if n:
            created = await self.api.create_pods(job, range(n), self.run)
            ej.pods = [p for _, p in created]
            await self.observer.seen(ej.pod_uids(), timeout=60 + n / 10)
        return ej

    async def clean(self, pods_hint: int = 0) -> None:
        """Empty the namespace and wait until the observer (and so the controller) saw it."""
        await self.api.empty_namespace(self.namespace)
        await self.observer.empty(timeout=120 + pods_hint / 200)
        await anyio.sleep(settle_seconds(pods_hint))


@asynccontextmanager
async def bed_on_fresh_plane(namespace: str, run: str) -> AsyncIterator[tuple[Bed, dict[str, int]]]:
    """A bed on a local control plane of its own, started for the block and stopped after it,
    with the plane's processes by name. The scale case's raw loop runs here: at 100k pods,
    emptying the first plane's namespace took the API server longer than the rest of the run."""
    from ungater_devtools.devcluster.environment import LocalControlPlane

    plane = LocalControlPlane()
    try:
        with anyio.CancelScope(shield=True):  # a start cut short would leave its processes
            await anyio.to_thread.run_sync(plane.start)
        api = await BenchApi.connect(plane.kubeconfig_path)
        try:
            await api.ensure_namespace(namespace)
            bed = Bed(api, namespace, plane.kubeconfig_path, run, PodObserver(api.kube, namespace))
            async with anyio.create_task_group() as tg:
                tg.start_soon(bed.observer.run)
                with anyio.fail_after(30):
                    await bed.observer.synced.wait()
                yield bed, plane.pids
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await api.close()
    finally:
        with anyio.CancelScope(shield=True):  # stopped also when the bench is stopped
            await anyio.to_thread.run_sync(plane.stop)
