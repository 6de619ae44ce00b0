"""The cost of one reconcile as the caches grow, measured in-process on synthetic caches.

A real ``Controller`` (real plugin registry, real indexes, real decision) with a client that
answers every patch at once; its Workload and pod indexes are filled directly with views parsed
from API-shaped JSON (``ungater._model.views.parse_*`` on ``json.loads`` output, so no string is shared
between objects, as from the wire), so 50k cached pods cost seconds, not a cluster. Timed:
``await controller.reconcile(key)`` for one owner with 10 pods, both when it releases all 10
(expectations reset between calls) and when it has nothing left to release. The baseline in
the same run: the same two reconciles, interleaved call by call, on a second controller that
caches only its two owners, while the first one's caches fill the process. What the first grows
by beyond the second is the cost of the cached pods to a reconcile; what both grow by is the
process's larger heap (the CPU's caches, the garbage collector). Also measured, with
tracemalloc: the bytes the caches hold per pod.

``owner_size_cost``: an idle reconcile of one owner of 100 to 10k pods, as a wave decides again
on every change of its owner's objects, with the plugin's answers reused for pods whose view did
not change (``assess.FactsMemo``) and, interleaved call by call, with a memo that keeps nothing
(every pod asked again): the baseline in the same run.
"""

from __future__ import annotations

import gc
import json
import logging
import time
import tracemalloc
import uuid
from typing import Any

from bench.objects import admission_status, pod_body, workload_body
from ungater._controller.controller import Controller
from ungater._decide.assess import FactsMemo
from ungater._decide.indexes import OwnerKey
from ungater._kube.client import Resource
from ungater._model.config import Config
from ungater._model.views import Kind, parse_pod, parse_workload
from ungater._plugins.registry import PluginRegistry

__all__ = ["owner_size_cost", "reconcile_cost"]

_NS = "bench-synthetic"
_JOB = Kind("batch", "Job")
_PODS_PER_OWNER = 10
_WARMUP = 20  # untimed calls first at each size


class _InstantClient:
    """Answers the calls a reconcile can make, at once (no I/O)."""

    async def json_patch(
        self, resource: Resource, namespace: str | None, name: str, ops: list[dict[str, Any]]
    ) -> dict[str, Any]:
        return {}

    async def get(self, resource: Resource, namespace: str | None, name: str) -> None:
        return None


def _job(index: int) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": f"job-{index}", "namespace": _NS, "uid": str(uuid.uuid4())},
    }


def _wire(obj: dict[str, Any]) -> Any:
    """The object as the reflector gets it: decoded from JSON, sharing no strings."""
    return json.loads(json.dumps(obj))


def _add_owner(ctl: Controller, index: int, gated: bool, size: int = _PODS_PER_OWNER) -> OwnerKey:
    job = _job(index)
    wl = workload_body(job, f"job-{index}-a", size, "synthetic")
    wl["metadata"].update(namespace=_NS, uid=str(uuid.uuid4()))
    wl["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    wl.update(admission_status(size))
    ctl.state.workloads.on_change(None, parse_workload(_wire(wl)))
    pods = ctl.state.kinds[_JOB].pods
    for i in range(size):
        pod = pod_body(job, i, "synthetic", gated=gated)
        pod["metadata"].update(namespace=_NS, uid=str(uuid.uuid4()))
        pod["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
        pods.on_change(None, parse_pod(_wire(pod)))
    return OwnerKey(_NS, job["metadata"]["uid"])


async def _time(
    timed: list[tuple[Controller, OwnerKey]], repeats: int, reset: bool
) -> list[list[float]]:
    """Microseconds per reconcile of each ``(controller, owner)``, the calls interleaved."""
    out: list[list[float]] = [[] for _ in timed]
    for i in range(repeats + _WARMUP):
        for (ctl, key), samples in zip(timed, out, strict=True):
            if reset:
                ctl.state.ledger.expectations.forget_key(key)
            t = time.perf_counter()
            await ctl.reconcile(key)
            if i >= _WARMUP:
                samples.append((time.perf_counter() - t) * 1e6)
    return out


def _controller() -> Controller:
    logging.getLogger("ungater").setLevel(logging.WARNING)  # the harness does not log releases
    config = Config.model_validate(
        {"namespaces": [_NS], "mode": "release", "kinds": [{"group": "batch", "kind": "Job"}]}
    )
    return Controller(config, _InstantClient(), PluginRegistry.discover())  # type: ignore[arg-type]


async def owner_size_cost(sizes: tuple[int, ...], calls: int) -> dict[str, Any]:
    """Microseconds per idle reconcile of one owner of each size (all its pods released, so it
    decides and releases nothing), with the facts memo (``reused``) and without (``asked``),
    the two interleaved; about ``calls`` pods' worth of calls at each size (at least 5)."""
    out: dict[str, Any] = {"reused": {}, "asked": {}}
    for size in sizes:
        ctl = _controller()
        key = _add_owner(ctl, 0, gated=False, size=size)
        memo, none = ctl.reconciler._facts_memo, FactsMemo(owners=0)
        reused: list[float] = []
        asked: list[float] = []
        for i in range(max(5, calls // size) + 2):  # the first two of each untimed
            for kept, samples in ((memo, reused), (none, asked)):
                ctl.reconciler._facts_memo = kept
                t = time.perf_counter()
                await ctl.reconcile(key)
                if i >= 2:
                    samples.append((time.perf_counter() - t) * 1e6)
        out["reused"][str(size)], out["asked"][str(size)] = reused, asked
    return out


async def reconcile_cost(others: tuple[int, ...], repeats: int) -> dict[str, Any]:
    """Microseconds per reconcile of one 10-pod owner while ``others`` pods are cached, and on
    the baseline controller (its two owners only) in the same process at the same moments."""
    ctl, base = _controller(), _controller()
    releasing = [(c, _add_owner(c, 0, gated=True)) for c in (ctl, base)]
    idle = [(c, _add_owner(c, 1, gated=False)) for c in (ctl, base)]
    cached = 0
    owners = 2
    out: dict[str, Any] = {"releasing": {}, "idle": {}, "bytes_per_cached_pod": None}
    out["baseline"] = {"releasing": {}, "idle": {}}
    for target in sorted(others):
        while cached < target:
            _add_owner(ctl, owners, gated=owners % 2 == 0)
            owners += 1
            cached += _PODS_PER_OWNER
        gc.collect()
        for mode, timed in (("releasing", releasing), ("idle", idle)):
            ours, baseline = await _time(timed, repeats, reset=mode == "releasing")
            out[mode][str(target)] = ours
            out["baseline"][mode][str(target)] = baseline
    out["bytes_per_cached_pod"] = _bytes_per_pod(ctl, owners)
    return out


def _bytes_per_pod(ctl: Controller, first: int, owners: int = 100) -> float:
    """Bytes the caches keep per pod (Workloads included), traced over ``owners`` more owners."""
    gc.collect()
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for i in range(first, first + owners):
            _add_owner(ctl, i, gated=True)
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return (after - before) / (owners * _PODS_PER_OWNER)
