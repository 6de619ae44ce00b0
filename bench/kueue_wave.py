"""The big wave (``--only kueue-wave``): from admission to the last release, each releaser alone.

Three stories, each on its own ClusterQueue of quota 0 that is raised at once for everything
waiting on it: one Job of 1,000 pods (``job-1k``), one of 10,000 (``job-10k``), 100 Jobs of 100
pods (``jobs-100x100``). As in the each-alone run (``bench.kueue_run``): in one namespace per
story Kueue releases its own gate, in another ungater does (``mode: auto``) behind the shipped
admission policy bound to its namespaces; the two sides of a story run one after the other (the
order flipped every story), never at once. Nothing but Kueue's gate is on the pods.

Each set of client limits runs on a control plane of its own (Kueue reads its
``clientConnection`` at start): ``shipped`` (Kueue's manager config as it ships, qps 300 burst
500; ungater's own defaults) and ``raised`` (both at qps 1000 burst 2000); ``equal`` (both at
qps 50 burst 100) runs only when named.

**Kueue's limiter busy** (``job-1k-busy``, kueue#13683): Kueue's ungater draws on the one client
limiter all of Kueue's controllers share. Through both sides' waves the harness creates Jobs
at a fixed rate (``BUSY``) in a namespace whose queue has no quota, so Kueue's controllers
write a Workload and its status for each; ungater's limiter carries none of that. Run beside
``job-1k`` under ``equal`` limits, the pair shows what the shared limiter costs each releaser.
Kueue's writes to its own objects during a wave (``kueue_writes``, from the API server's
request counter) say how busy its limiter was.

Per story and releaser (``wave_summary``): from the quota change to the first and the last
admission; from the first admission to the last pod created (the Job controller's pace: a pod
is released only once it exists), to the first, median and last release; from the last pod
created to the last release; the release rate over the releases' span. Every process's CPU
(``/proc/PID/stat``, sampled every ``SAMPLE_S``) in cores over the wave, over the pods' creation
and over the tail after it (``cpu_between``). What the API server spent on the wave
(``server_costs``: pod requests by verb, admission webhooks, the flow-control wait; count and
mean). The releases past the cap judged as for every story (``bench.kueue_overcap``). After each side its Jobs and pods are deleted (bounded).
"""

from __future__ import annotations

import os
import re
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio

from bench import kueue_setup as ks
from bench.api import BenchApi, bounded_gather
from bench.controller_proc import ControllerProcess
from bench.kueue_overcap import releases_past_cap
from bench.kueue_policy import KUEUE_USER, RELEASER_LABEL, guarded_policy, remove_policy
from bench.machine import _machine_busy_seconds, _proc_cpu_seconds
from bench.objects import JOBS
from bench.timeline import Timeline

__all__ = [
    "BUSY",
    "DEFAULT_LIMITS",
    "LIMITS",
    "STORIES",
    "cpu_between",
    "kueue_writes",
    "parse_wave_plan",
    "server_costs",
    "wave_rows",
    "wave_run",
    "wave_summary",
]

#: story -> (Jobs, pods each)
STORIES: dict[str, tuple[int, int]] = {
    "job-1k": (1, 1000),
    "jobs-100x100": (100, 100),
    "job-10k": (1, 10_000),
    "job-1k-busy": (1, 1000),  # with BUSY's other work for Kueue's controllers
    "smoke": (2, 5),  # a few pods: a check of the harness, not a measurement
    "smoke-busy": (2, 5),
}
#: story -> Jobs per second the harness creates, through both sides' waves, in a namespace of
#: its own whose queue has no quota: Kueue's other controllers then write a Workload and its
#: status for each, on the client limiter its ungater shares (kueue#13683); ungater's own
#: limiter carries none of it
BUSY: dict[str, float] = {"job-1k-busy": 10.0, "smoke-busy": 2.0}
BUSY_LEAD_S = 5.0  # the other work runs this long before the quota change
#: limits -> releaser -> (qps, burst); None: the releaser's own default, unchanged
LIMITS: dict[str, dict[str, tuple[int, int] | None]] = {
    # Kueue's config/components/manager/controller_manager_config.yaml: clientConnection
    "shipped": {"kueue": (300, 500), "ungater": None},
    "raised": {"kueue": (1000, 2000), "ungater": (1000, 2000)},
    # both releasers on the same limits, a sixth of Kueue's shipped ones: the API server of
    # this two-core machine cannot carry the other work that would keep 300 QPS busy, so the
    # busy story runs at a scale where the limiter, not the server, is what binds
    "equal": {"kueue": (50, 100), "ungater": (50, 100)},
}
#: the limits a STORY without @LIMITS runs under
DEFAULT_LIMITS = ("shipped", "raised")
UNGATER_DEFAULT = (200, 400)  # docs/config.md: client.qps, client.burst
DEFAULT_PLAN = "job-1k,jobs-100x100,job-10k"
SAMPLE_S = 0.5
_POLL_S = 0.25
_SETUP_S = 120.0  # for the Workloads to appear, for a side's pods to be gone
_PER_POD_S = 0.1  # the wave's bound: _SETUP_S plus this per pod


def parse_wave_plan(text: str, limits: Sequence[str] = DEFAULT_LIMITS) -> dict[str, list[str]]:
    """Per limits (``limits`` in order, then the others named), the stories to run, in the
    order given: ``STORY`` runs under each of ``limits``, ``STORY@LIMITS`` under that one only."""
    plan: dict[str, list[str]] = {
        lim: [] for lim in (*limits, *(x for x in LIMITS if x not in limits))
    }
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        story, _, only = item.partition("@")
        if story not in STORIES:
            raise ValueError(f"unknown wave story {story!r}; known: {', '.join(STORIES)}")
        if only and only not in LIMITS:
            raise ValueError(f"unknown limits {only!r}; known: {', '.join(LIMITS)}")
        for lim in plan:
            if (only == lim or (not only and lim in limits)) and story not in plan[lim]:
                plan[lim].append(story)
    return {lim: stories for lim, stories in plan.items() if stories}


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def wave_summary(
    t0: float,
    admitted: Sequence[float],
    created: Sequence[float],
    released: Sequence[float | None],
) -> dict[str, Any]:
    """One side's wave: ``t0`` the quota change, ``admitted`` each slice's admission seen,
    ``created`` and ``released`` per pod (seen; None: still gated). Times in seconds from the
    quota change (``quota_to_*``), from the first admission (``admission_to_*``), from the
    last pod created; the release rate over the releases' span (first to last)."""
    went = sorted(r for r in released if r is not None)
    out: dict[str, Any] = {
        "pods": len(created),
        "released": len(went),
        "still_gated": len(released) - len(went),
    }
    if not admitted:
        return out | {"admissions": 0}
    first = min(admitted)
    out |= {
        "admissions": len(admitted),
        "quota_to_first_admission_s": _r(first - t0),
        "quota_to_last_admission_s": _r(max(admitted) - t0),
    }
    last_created = max(created) if created else None
    out["admission_to_last_pod_created_s"] = (
        _r(last_created - first) if last_created is not None else None
    )
    if not went:
        return out
    complete = len(went) == len(released)
    out |= {
        "admission_to_first_release_s": _r(went[0] - first),
        "admission_to_median_release_s": _r(statistics.median(went) - first),
        # the last release only when every pod went: else it is not the last
        "admission_to_last_release_s": _r(went[-1] - first) if complete else None,
        "pods_created_to_last_release_s": (
            _r(went[-1] - last_created) if complete and last_created is not None else None
        ),
        "release_span_s": _r(went[-1] - went[0]),
        "releases_per_s": _r((len(went) - 1) / (went[-1] - went[0]))
        if went[-1] > went[0]
        else None,
    }
    return out


_SERIES = re.compile(r"^(?P<name>[a-zA-Z_:][\w:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
#: the API server's histograms read per wave, and the labels that name a row of each
_COSTS = {
    "apiserver_request_duration_seconds": ("verb",),  # of resource="pods" only
    "apiserver_admission_webhook_admission_duration_seconds": ("name", "operation", "rejected"),
    "apiserver_flowcontrol_request_wait_duration_seconds": ("priority_level",),
}


def _sums(text: str) -> dict[tuple[str, str, tuple[str, ...]], float]:
    """(family, "sum" or "count", the row's label values) -> value, added up over the other
    labels, for the families of ``_COSTS`` (Prometheus text exposition)."""
    out: dict[tuple[str, str, tuple[str, ...]], float] = {}
    for line in text.splitlines():
        m = _SERIES.match(line)
        if m is None:
            continue
        family, _, part = m["name"].rpartition("_")
        if part not in ("sum", "count") or family not in _COSTS:
            continue
        labels = dict(_LABEL.findall(m["labels"] or ""))
        if family == "apiserver_request_duration_seconds" and labels.get("resource") != "pods":
            continue
        key = (family, part, tuple(labels.get(k, "") for k in _COSTS[family]))
        out[key] = out.get(key, 0.0) + float(m["value"])
    return out


def server_costs(before: str, after: str) -> dict[str, dict[str, dict[str, float]]]:
    """What the API server spent between two scrapes of its ``/metrics``: per family of
    ``_COSTS`` (short names: ``pods`` requests by verb, ``webhooks`` by webhook, operation and
    rejected, ``flowcontrol_wait`` by priority level) the calls and their mean in ms."""
    a, b = _sums(before), _sums(after)
    short = {
        "apiserver_request_duration_seconds": "pods",
        "apiserver_admission_webhook_admission_duration_seconds": "webhooks",
        "apiserver_flowcontrol_request_wait_duration_seconds": "flowcontrol_wait",
    }
    out: dict[str, dict[str, dict[str, float]]] = {v: {} for v in short.values()}
    for (family, part, row), value in b.items():
        if part != "count":
            continue
        n = value - a.get((family, "count", row), 0.0)
        if n <= 0:
            continue
        total = b.get((family, "sum", row), 0.0) - a.get((family, "sum", row), 0.0)
        out[short[family]][" ".join(row)] = {
            "count": int(n),
            "mean_ms": round(1000 * total / n, 3),
        }
    return out


_REQUESTS = "apiserver_request_total"
#: the resources only Kueue writes in a wave run (the harness creates none of these objects and
#: sets a ClusterQueue's quota once, before the scrape): its controllers' writes
KUEUE_RESOURCES = frozenset({"workloads", "localqueues", "clusterqueues"})
_READS = frozenset({"GET", "LIST", "WATCH"})


def kueue_writes(before: str, after: str) -> dict[str, int]:
    """Writes to Kueue's own objects between two scrapes of the API server's ``/metrics``
    (``apiserver_request_total``, added up over codes and versions): "RESOURCE[/SUB] VERB" ->
    calls. These are requests of Kueue's controllers, drawn from the client limiter its ungater
    shares; its pod patches are in ``server_costs``."""

    def totals(text: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for line in text.splitlines():
            if not line.startswith(_REQUESTS + "{"):
                continue
            m = _SERIES.match(line)
            if m is None:
                continue
            labels = dict(_LABEL.findall(m["labels"] or ""))
            res, verb = labels.get("resource", ""), labels.get("verb", "")
            if res not in KUEUE_RESOURCES or verb in _READS:
                continue
            sub = labels.get("subresource", "")
            key = f"{res}{'/' + sub if sub else ''} {verb}"
            out[key] = out.get(key, 0.0) + float(m["value"])
        return out

    a, b = totals(before), totals(after)
    return {k: int(v - a.get(k, 0.0)) for k, v in sorted(b.items()) if v - a.get(k, 0.0) > 0}


async def _scrape(api: BenchApi) -> str:
    """The API server's ``/metrics`` (the harness is the admin); "" when it cannot be had."""
    try:
        resp = await api._api.call_api(
            "/metrics",
            "GET",
            header_params={"Accept": "text/plain"},
            auth_settings=["BearerToken"],
            _preload_content=False,
            _return_http_data_only=True,
            _request_timeout=30,
        )
        return str((await resp.read()).decode("utf-8", "replace"))
    except Exception:  # a missing figure, not a failed wave
        return ""


Sample = tuple[float, dict[str, float]]


def cpu_between(samples: Sequence[Sample], a: float, b: float) -> dict[str, float] | None:
    """Cores used per process between ``a`` and ``b``: from the last sample at or before ``a``
    to the first at or after ``b`` (the interval the samples cover, ``wall_seconds``); None when
    the samples do not cover it. A process missing from either sample is left out; ``others``:
    the machine's (named ``machine``) less the named ones."""
    before = [s for s in samples if s[0] <= a]
    after = [s for s in samples if s[0] >= b]
    if not before or not after:
        return None
    (ta, ca), (tb, cb) = before[-1], after[0]
    if tb <= ta:
        return None
    out = {k: round((cb[k] - ca[k]) / (tb - ta), 3) for k in ca if k in cb}
    if "machine" in out:  # the machine's busy cores less the named processes': everything else
        out["others"] = round(out["machine"] - sum(v for k, v in out.items() if k != "machine"), 3)
    out["wall_seconds"] = round(tb - ta, 3)
    return out


class _Sampler:
    """Cumulative CPU seconds of named processes (and the machine), every ``SAMPLE_S``."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.samples: list[Sample] = []

    def sample(self) -> None:
        now = time.monotonic()
        cpu = {n: _proc_cpu_seconds(p) for n, p in self.pids.items()}
        got = {n: c for n, c in cpu.items() if c is not None}
        got["machine"] = _machine_busy_seconds()
        self.samples.append((now, got))

    async def run(self) -> None:
        while True:
            self.sample()
            await anyio.sleep(SAMPLE_S)


def _cpu(samples: Sequence[Sample], t0: float, s: dict[str, Any], base: float) -> dict[str, Any]:
    """Cores per process over the wave and its two phases (pods being created; the tail)."""

    def at(key: str) -> float | None:
        v = s.get(key)
        return None if v is None else base + v

    created, last = at("admission_to_last_pod_created_s"), at("admission_to_last_release_s")
    end = last if last is not None else samples[-1][0] if samples else t0
    out: dict[str, Any] = {"wave": cpu_between(samples, t0, end)}
    if created is not None:
        out["creating"] = cpu_between(samples, t0, created)
        if last is not None and last > created:
            out["tail"] = cpu_between(samples, created, last)
    return out


async def _wait(done: Callable[[], bool], timeout: float) -> bool:
    """Poll ``done`` (cheap enough for 10k pods every ``_POLL_S``) until true; False at the bound.
    The times measured are the watch events' own, so the polling does not move them."""
    with anyio.move_on_after(timeout):
        while not done():  # noqa: ASYNC110 - a poll: an event per pod event costs O(pods) each
            await anyio.sleep(_POLL_S)
        return True
    return False


async def _clear(api: BenchApi, ns: str) -> dict[str, Any]:
    """Delete the Jobs (their pods with them), the pods and Workloads left; wait (bounded) until
    no pod is left. How long it took, and what was left at the bound."""
    from kubernetes_asyncio import client

    started = time.monotonic()
    batch = client.BatchV1Api(api._api)
    await batch.delete_collection_namespaced_job(ns, propagation_policy="Background")
    await api.empty_namespace(ns)
    left = -1
    with anyio.move_on_after(_SETUP_S * 2.5):
        while (left := await api.count_pods(ns)) > 0:  # noqa: ASYNC110 - the server's count
            await anyio.sleep(2.0)
    return {"seconds": round(time.monotonic() - started, 1), "pods_left": left}


_BUSY_IN_FLIGHT = 32


async def _busy(api: BenchApi, ns: str, rate: float, tag: str, got: dict[str, int]) -> None:
    """A Job every ``1 / rate`` s in ``ns`` (a queue with no quota), on a fixed schedule, until
    cancelled: Kueue's other controllers' work. ``got`` counts those created, refused, and
    skipped because ``_BUSY_IN_FLIGHT`` creates were still out (the server slower than the
    rate)."""
    period, start, i = 1.0 / rate, time.monotonic(), 0
    out = 0

    async def one(name: str) -> None:
        nonlocal out
        try:
            await ks.create_job(api, ns, name, 1, 1, None)
            got["created"] += 1
        except Exception:  # a refused create is counted, not fatal to the wave
            got["failed"] += 1
        finally:
            out -= 1

    async with anyio.create_task_group() as tg:
        while True:  # ends when the wave cancels it; each turn sleeps until the next slot
            i += 1
            if out < _BUSY_IN_FLIGHT:
                out += 1
                tg.start_soon(one, f"busy-{tag}-{i}")
            else:
                got["skipped"] += 1
            await anyio.sleep(max(0.0, start + i * period - time.monotonic()))


async def _one_wave(
    api: BenchApi,
    ns: str,
    cq: str,
    side: str,
    n: int,
    size: int,
    sampler: _Sampler,
    busy: tuple[str, float] | None = None,
) -> dict[str, Any]:
    """``n`` Jobs of ``size`` on a quota of 0, the quota raised for all; until every pod's gate
    is off (or the bound). The summary, the CPU, the releases past the cap. ``busy``: (the
    namespace, Jobs per second) of other work for Kueue, from ``BUSY_LEAD_S`` before the quota
    change to the wave's end."""
    tl = Timeline(api.kube, ns, (JOBS,))
    gate = ks.KUEUE_GATE
    out: dict[str, Any] = {"namespace": ns}
    other = {"created": 0, "failed": 0, "skipped": 0}
    async with anyio.create_task_group() as tg:
        tg.start_soon(tl.run)
        with anyio.fail_after(30):
            await tl.synced.wait()
        busy_scope = anyio.CancelScope()

        async def keep_busy(where: str, rate: float) -> None:
            with busy_scope:
                await _busy(api, where, rate, side, other)

        def create(i: int) -> Callable[[], Awaitable[str]]:
            return lambda: ks.create_job(api, ns, f"wave-{i}", size, size, None)

        owners = set(await bounded_gather([create(i) for i in range(n)], 16))

        def slices() -> list[Any]:
            return [s for s in tl.slices.values() if s.owner in owners]

        if not await _wait(lambda: len({s.owner for s in slices()}) == n, _SETUP_S):
            raise RuntimeError(f"kueue wave: {ns}: not every Workload within {_SETUP_S:.0f}s")
        await anyio.sleep(1.0)  # Kueue has found them inadmissible
        if busy is not None:
            tg.start_soon(keep_busy, *busy)
            await anyio.sleep(BUSY_LEAD_S)
        before = await _scrape(api)
        t0 = time.monotonic()
        await ks.set_quota(api, cq, n * size)
        total, bound = n * size, _SETUP_S + _PER_POD_S * n * size

        def pods() -> list[Any]:
            return [p for p in tl.pods.values() if p.owner in owners]

        def done() -> bool:
            went = [p for p in pods() if gate in p.removed_at or gate not in p.gates]
            return len(went) >= total

        finished = await _wait(done, bound)
        busy_scope.cancel()
        await anyio.sleep(1.0)  # a last sample past the last release
        sampler.sample()
        after = await _scrape(api)
        mine = pods()
        admitted = [s.admitted_at for s in slices() if s.admitted_at is not None]
        released = [p.removed_at.get(gate, None if gate in p.gates else p.added_at) for p in mine]
        s = wave_summary(t0, admitted, [p.added_at for p in mine], released)
        out |= s
        out["finished_within_bound"] = finished
        out["bound_seconds"] = bound
        out["first_seen_ungated"] = sum(1 for p in mine if gate not in p.gates)
        base = min(admitted) if admitted else t0
        out["cpu_cores"] = _cpu(sampler.samples, t0, s, base)
        # from just before the quota change to a second past the wave's end
        out["server"] = server_costs(before, after) if before and after else None
        out["kueue_writes"] = kueue_writes(before, after) if before and after else None
        if busy is not None:
            out["busy"] = {"namespace": busy[0], "jobs_per_s": busy[1], **other}
        tg.cancel_scope.cancel()
    found = releases_past_cap([e for e in tl.events], {side: gate}, tl.gaps)[side]
    out["over_cap"] = found.summary()
    out["clear"] = await _clear(api, ns)
    if busy is not None:  # the other work's Jobs and Workloads gone before the next side
        out["busy"]["clear"] = await _clear(api, busy[0])
    return out


async def wave_run(
    kubeconfig: Path,
    plane_pids: dict[str, int],
    limits: str,
    stories: Sequence[str],
    workdir: Path,
    run_id: str,
    kueue_version: str,
    progress: Callable[[dict[str, Any]], None] = lambda _: None,
) -> dict[str, Any]:
    """One control plane's share: every story of ``stories`` under ``limits``, each releaser
    alone. ``plane_pids``: the plane's processes by name (Kueue's among them); ``progress`` is
    given what is gathered after every story."""
    started = time.monotonic()
    ungater_limits = LIMITS[limits]["ungater"]
    ns = {
        (side, story): f"kw{run_id}-{side[0]}-{story}"
        for story in stories
        for side in ("kueue", "ungater")
    }
    api = await BenchApi.connect(kubeconfig, pool_size=64)
    kueue_api = await BenchApi.connect(kubeconfig, pool_size=2, as_user=KUEUE_USER)
    queues: dict[str, str] = {}
    policy: list[dict[str, Any]] = []
    kq_limits = LIMITS[limits]["kueue"]
    u_limits = ungater_limits or UNGATER_DEFAULT
    out: dict[str, Any] = {
        "kueue_version": kueue_version,
        "client_limits": {
            "kueue": {"qps": kq_limits[0], "burst": kq_limits[1]} if kq_limits else None,
            "ungater": {"qps": u_limits[0], "burst": u_limits[1]},
            "ungater_default": ungater_limits is None,
        },
        "stories": {},
    }
    busy_ns = f"kw{run_id}-busy" if any(story in BUSY for story in stories) else None
    try:
        for (side, _story), name in ns.items():
            await api.ensure_namespace(name, {RELEASER_LABEL: side})
            queues[name] = await ks.create_queues(api, name, 0)
        if busy_ns is not None:  # never admitted: Kueue's work there is its Workloads' upkeep
            await api.ensure_namespace(busy_ns, {RELEASER_LABEL: "kueue"})
            queues[busy_ns] = await ks.create_queues(api, busy_ns, 0)
        first = stories[0]
        policy = await guarded_policy(
            api, kueue_api, ks.KUEUE_GATE, ns["ungater", first], ns["kueue", first]
        )
        config = ks.kueue_controller_config([ns["ungater", s] for s in stories], ks.KUEUE_GATE)
        if ungater_limits is not None:
            config["client"] = {"qps": ungater_limits[0], "burst": ungater_limits[1]}
        proc = ControllerProcess(kubeconfig, config, workdir, f"wave-{limits}")
        async with anyio.create_task_group() as tg:
            await proc.start(tg)
            pids = dict(plane_pids) | {"ungater": proc.pid, "harness": os.getpid()}
            sampler = _Sampler(pids)
            tg.start_soon(sampler.run)
            try:
                for i, story in enumerate(stories):
                    n, size = STORIES[story]
                    sides = ("kueue", "ungater") if i % 2 == 0 else ("ungater", "kueue")
                    got: dict[str, Any] = {"jobs": n, "pods_each": size, "order": list(sides)}
                    for side in sides:
                        name = ns[side, story]
                        wave_started = time.monotonic()
                        busy = (busy_ns, BUSY[story]) if story in BUSY and busy_ns else None
                        got[side] = await _one_wave(
                            api, name, queues[name], side, n, size, sampler, busy
                        )
                        got[side]["side_seconds"] = round(time.monotonic() - wave_started, 1)
                    out["stories"][story] = got
                    progress(out)
            finally:
                out["controller_exit_code"] = await proc.stop()
                out["controller_log"] = str(proc.log_path)
                tg.cancel_scope.cancel()
    finally:
        if policy:
            await remove_policy(api, policy)
        for name in (*ns.values(), *([busy_ns] if busy_ns else [])):
            await api.delete_namespace(name)
        for cq in queues.values():
            await ks.delete_queues(api, cq)
        await kueue_api.close()
        await api.close()
    out["duration_seconds"] = round(time.monotonic() - started, 1)
    return out


def _fmt(v: Any) -> str:
    return "-" if v is None else f"{v:g}" if isinstance(v, float | int) else str(v)


def wave_rows(w: dict[str, Any]) -> list[dict[str, Any]]:
    """The results-table rows of a wave run: per limits, story and releaser, admission to the
    last release (median column: the one run), and pods created to the last release."""
    from bench.stats import summarize

    rows: list[dict[str, Any]] = []
    for limits, run in w.get("limits", {}).items():
        for story, got in run.get("stories", {}).items():
            for side in ("kueue", "ungater"):
                s = got.get(side)
                if not s:
                    continue
                lim = run["client_limits"].get(side) or {}
                config = f"{limits} ({_fmt(lim.get('qps'))}/{_fmt(lim.get('burst'))})"
                who = "Kueue" if side == "kueue" else side
                for key, what in (
                    ("admission_to_last_release_s", "admission to last release"),
                    ("pods_created_to_last_release_s", "last pod created to last release"),
                ):
                    v = s.get(key)
                    metric = f"wave {story}: {what} ({who})"
                    rows.append(
                        {
                            "metric": metric,
                            "config": config,
                            **summarize([v] if v is not None else [], "s"),
                            "goal": "",
                            "status": "" if v is not None else f"{s.get('still_gated')} gated",
                        }
                    )
                oc = s.get("over_cap", {})
                rows.append(
                    {
                        "metric": f"wave {story}: releases past the cap ({who})",
                        "config": config,
                        **summarize([oc["count"]] if oc.get("count") is not None else [], "count"),
                        "goal": "0",
                        "status": f"of {oc.get('judged', 0)} judged",
                    }
                )
                rate = _kueue_write_rate(s)
                if rate is not None:
                    rows.append(
                        {
                            "metric": f"wave {story}: Kueue's writes to its objects ({who} side)",
                            "config": config,
                            **summarize([rate], "/s"),
                            "goal": "",
                            "status": "",
                        }
                    )
            rows.extend(_verdict(story, got, limits))
    return rows


def _kueue_write_rate(s: dict[str, Any]) -> float | None:
    """Kueue's writes to its own objects per second of the wave (``kueue_writes``)."""
    writes = s.get("kueue_writes")
    wall = ((s.get("cpu_cores") or {}).get("wave") or {}).get("wall_seconds")
    return sum(writes.values()) / wall if writes is not None and wall else None


def _verdict(story: str, got: dict[str, Any], limits: str) -> list[dict[str, Any]]:
    """Kueue's time from admission to the last release over ungater's: the goal is no slower
    (at least 1); no row when either side's wave did not end."""
    from bench.stats import summarize

    k, u = (
        (got.get(side) or {}).get("admission_to_last_release_s") for side in ("kueue", "ungater")
    )
    if not k or not u:
        return []
    ratio = k / u
    return [
        {
            "metric": f"wave {story}: admission to last release, ratio Kueue/ungater",
            "config": limits,
            **summarize([ratio], "ratio"),
            "goal": ">= 1",
            "status": "pass" if ratio >= 1 else "MISS",
        }
    ]
