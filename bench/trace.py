"""Where a wave's time goes: the controller's trace (``logging.trace``,
``ungater/_observe/trace.py``) read back and cut into spans, and the floor the same server
sets (one quorum GET, one guarded PATCH).

A trace line is ``TRACE <monotonic s> <point> key=<namespace>/<owner uid> k=v ...``, anywhere in
a log line (after the harness's own time and the log format's prefix, or inside a JSON
``msg``); other lines are ignored. The controller's seconds are ``time.monotonic()``, the same
clock as the harness's on Linux, so a wave's spans count from the harness's own ``t0``.

Pure but for :func:`measure_floor`, which talks to the API server through a
:class:`bench.api.BenchApi`.
"""

from __future__ import annotations

import math
import re
import secrets
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ungater._kube.client import ApiError, Resource

if TYPE_CHECKING:
    from bench.api import BenchApi

__all__ = [
    "CONFIGMAPS",
    "EPSILON_S",
    "SPANS",
    "Point",
    "Read",
    "WaveSpans",
    "measure_floor",
    "parse_line",
    "parse_log",
    "read_trace",
    "summarize_waves",
    "wave_spans",
]

CONFIGMAPS = Resource("", "v1", "configmaps", "ConfigMap")
#: How far before the harness's t0 a controller point may lie and still belong to the wave:
#: the harness stamps t0 once its request returns or its watch shows the change, a moment after
#: the controller may have seen it.
EPSILON_S = 0.05
#: The spans of a wave, in milliseconds from its t0 (None when the trace has no such point).
SPANS = (
    "event",
    "reconcile_start",
    "decided",
    "first_patch_sent",
    "last_patch_answered",
    "end",
)
_FLOOR_LABEL = "ungater.bench/floor"

_LINE = re.compile(r'\bTRACE (\d+\.\d+) (\w+) key=([^\s"]+)')
_FIELD = re.compile(r'\s+([A-Za-z_]\w*)=([^\s"]*)')


@dataclass(frozen=True, slots=True)
class Point:
    """One trace point: when (the controller's monotonic seconds), which, for whom, and its
    fields as written (strings)."""

    t: float
    point: str
    key: str  # <namespace>/<owner uid>
    fields: Mapping[str, str] = field(default_factory=dict)

    @property
    def owner_uid(self) -> str:
        return self.key.rpartition("/")[2]


def parse_line(line: str) -> Point | None:
    """The trace point a log line carries, or None (another line)."""
    m = _LINE.search(line)
    if m is None:
        return None
    fields: dict[str, str] = {}
    pos = m.end()
    while (f := _FIELD.match(line, pos)) is not None:
        fields[f.group(1)] = f.group(2)
        pos = f.end()
    return Point(float(m.group(1)), m.group(2), m.group(3), fields)


def parse_log(lines: Iterable[str]) -> dict[str, list[Point]]:
    """The trace points of ``lines`` per owner key (``<namespace>/<owner uid>``), each list in
    time order; lines of other formats are skipped."""
    out: dict[str, list[Point]] = {}
    for line in lines:
        p = parse_line(line)
        if p is not None:
            out.setdefault(p.key, []).append(p)
    for points in out.values():
        points.sort(key=lambda p: p.t)  # stable: a line's order breaks ties
    return out


def read_trace(path: Path) -> dict[str, list[Point]]:
    """:func:`parse_log` of a controller's log file."""
    with path.open(errors="replace") as f:
        return parse_log(f)


@dataclass(frozen=True, slots=True)
class Read:
    """One quorum read of the deciding reconcile: what (owner, via, slice, pods), of which
    object, from when (ms from t0) and for how long (ms; None when it never ended)."""

    what: str
    name: str
    start_ms: float
    ms: float | None


@dataclass(frozen=True)
class WaveSpans:
    """One wave's spans, each in ms from the harness's t0 (see :data:`SPANS`): the first
    admitted Workload event the controller saw, the start of the reconcile that released and
    its decision, that reconcile's reads, the first patch sent and the last answered, and the
    harness's own end. ``reconciles``: reconciles of the owner started in the wave (the one
    that released included); ``patches``: patches sent in it."""

    event: float | None
    reconcile_start: float
    decided: float
    first_patch_sent: float | None
    last_patch_answered: float | None
    end: float
    reads: tuple[Read, ...] = ()
    reconciles: int = 0
    patches: int = 0

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {name: _round(getattr(self, name)) for name in SPANS}
        out["reads"] = [
            {"what": r.what, "name": r.name, "start": _round(r.start_ms), "ms": _round(r.ms)}
            for r in self.reads
        ]
        out["reconciles"] = self.reconciles
        out["patches"] = self.patches
        return out


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def _points_of(points: Mapping[str, Sequence[Point]], owner: str) -> Sequence[Point]:
    """An owner's points, by ``<namespace>/<uid>`` or by its UID alone."""
    if owner in points:
        return points[owner]
    for key, found in points.items():
        if key.rpartition("/")[2] == owner:
            return found
    return ()


def wave_spans(
    points: Mapping[str, Sequence[Point]],
    owner: str,
    t0: float,
    t_end: float,
    epsilon: float = EPSILON_S,
    pod: str | None = None,
) -> WaveSpans | None:
    """The spans of one wave of ``owner`` (its UID, or ``<namespace>/<uid>``) from ``t0`` (the
    harness saw the trigger) to ``t_end`` (it saw the last release), both monotonic seconds;
    None when the trace holds no reconcile of the owner that released in that window (the
    trace is then missing for this wave). Points of equal time keep the log's order.

    The deciding reconcile is the first one whose ``decided`` point has releases, at or after
    ``t0 - epsilon`` and at or before ``t_end + epsilon``; the event, the first Workload event
    in that window that shows the slice admitted (else the first at all); the patches, those
    sent in the window from that decision on, each answered by the first answer for its pod
    after it (which may come after ``t_end``: the harness's watch may show a release before
    the controller has its answer).

    With ``pod`` (the UID of the pod whose release the harness saw at ``t_end``), the deciding
    reconcile is the one that sent that pod's last patch up to ``t_end``, wherever it began: an
    earlier releasing reconcile in the window (a freed slot refilled just before the trigger)
    is then not taken for the wave's."""
    every = _points_of(points, owner)
    mine = [p for p in every if t0 - epsilon <= p.t <= t_end + epsilon]
    if pod is not None:
        decided = _decided_for(every, pod, t_end + epsilon)
    else:
        decided = next(
            (p for p in mine if p.point == "decided" and _int(p.fields.get("releases")) > 0),
            None,
        )
    if decided is None:
        return None
    # its start may lie before the window: a reconcile that began before the harness saw the
    # trigger (and then shows as a negative span)
    start = next(
        (p for p in reversed(every) if p.point == "reconcile_start" and p.t <= decided.t), None
    )
    if start is None:
        return None  # a log cut short: no reconcile to measure

    def ms(t: float) -> float:
        return (t - t0) * 1000.0

    events = [p for p in mine if p.point == "workload_event"]
    event = next((p for p in events if p.fields.get("admitted") == "true"), None)
    if event is None and events:
        event = events[0]
    # each read_start and the first read_end of the same read after it, in the starts' order
    reads: dict[int, Read] = {}
    open_reads: dict[tuple[str, str], list[int]] = {}
    for i, p in enumerate(every):
        if not start.t <= p.t <= decided.t:
            continue
        what = (p.fields.get("what", ""), p.fields.get("name", ""))
        if p.point == "read_start":
            open_reads.setdefault(what, []).append(i)
            reads[i] = Read(what[0], what[1], ms(p.t), None)
        elif p.point == "read_end" and open_reads.get(what):
            j = open_reads[what].pop(0)
            reads[j] = Read(what[0], what[1], ms(every[j].t), (p.t - every[j].t) * 1000.0)
    if pod is not None:  # that reconcile's patches: up to its end
        over = next(
            (p.t for p in every if p.point == "reconcile_end" and p.t >= decided.t), math.inf
        )
        sent = [p for p in every if p.point == "patch_sent" and decided.t <= p.t <= over]
    else:
        sent = [p for p in mine if p.point == "patch_sent" and p.t >= decided.t]
    answered = [a for a in (_answer(every, s) for s in sent) if a is not None]
    return WaveSpans(
        event=ms(event.t) if event is not None else None,
        reconcile_start=ms(start.t),
        decided=ms(decided.t),
        first_patch_sent=ms(sent[0].t) if sent else None,
        last_patch_answered=ms(max(a.t for a in answered)) if answered else None,
        end=ms(t_end),
        reads=tuple(reads[i] for i in sorted(reads)),
        reconciles=sum(1 for p in mine if p.point == "reconcile_start" and p.t >= t0 - epsilon),
        patches=len(sent),
    )


def _decided_for(every: Sequence[Point], pod: str, until: float) -> Point | None:
    """The releasing decision that sent ``pod``'s last patch up to ``until``."""
    sends = [
        p for p in every if p.point == "patch_sent" and p.fields.get("pod") == pod and p.t <= until
    ]
    if not sends:
        return None
    return next(
        (
            p
            for p in reversed(every)
            if p.point == "decided" and _int(p.fields.get("releases")) > 0 and p.t <= sends[-1].t
        ),
        None,
    )


def _answer(points: Sequence[Point], sent: Point) -> Point | None:
    """The answer to the patch ``sent``: the first ``patch_answered`` of its pod after it."""
    pod = sent.fields.get("pod")
    return next(
        (
            p
            for p in points
            if p.point == "patch_answered" and p.t >= sent.t and p.fields.get("pod") == pod
        ),
        None,
    )


def _int(text: str | None) -> int:
    try:
        return int(text or 0)
    except ValueError:
        return 0


def summarize_waves(waves: Iterable[WaveSpans | None]) -> dict[str, Any]:
    """One case's waves: per span, the median (ms) over the waves that have it and their count
    ``n``; per kind of read (``read_<what>``), the median of its start and of its time (a wave
    that read one kind several times counts its first start and the sum of its times); and
    ``waves`` (all of them) and ``missing`` (those whose trace was not found: counted, never
    dropped silently)."""
    waves = list(waves)
    found = [w for w in waves if w is not None]
    out: dict[str, Any] = {"waves": len(waves), "missing": len(waves) - len(found)}
    for name in SPANS:
        out[name] = _median([getattr(w, name) for w in found])
    starts: dict[str, list[float]] = {}
    times: dict[str, list[float]] = {}
    for w in found:
        seen: dict[str, tuple[float, float]] = {}
        for r in w.reads:
            first, total = seen.get(r.what, (r.start_ms, 0.0))
            seen[r.what] = (first, total + (r.ms or 0.0))
        for what, (first, total) in seen.items():
            starts.setdefault(what, []).append(first)
            times.setdefault(what, []).append(total)
    for what in sorted(starts):
        out[f"read_{what}"] = {
            "start_median_ms": _median(starts[what])["median_ms"],
            "median_ms": _median(times[what])["median_ms"],
            "n": len(times[what]),
        }
    counts = [w.reconciles for w in found]
    out["reconciles"] = {
        "median": statistics.median(counts) if counts else math.nan,
        "n": len(counts),
    }
    return out


def _median(values: Sequence[float | None]) -> dict[str, Any]:
    present = [v for v in values if v is not None]
    return {
        "median_ms": round(statistics.median(present), 3) if present else math.nan,
        "n": len(present),
    }


# -- the floor ----------------------------------------------------------------------------------


async def measure_floor(
    api: BenchApi,
    namespace: str,
    name: str | None = None,
    *,
    resource: Resource = CONFIGMAPS,
    rounds: int = 21,
) -> dict[str, Any]:
    """The server's floor under the controller's reads and patches: the median of ``rounds``
    sequential round trips of a quorum GET of one object, then of as many guarded JSON patches
    of it (a ``test`` of a label's value, then its ``replace``: the shape of a release patch).

    ``name`` of ``resource`` in ``namespace``: that object, left as found (the label removed at
    the end). Patching a label of a pod the controller serves wakes its owner: pick an object
    it does not watch, or measure while no wave runs. No ``name``: a ConfigMap of its own,
    created for the measure and deleted after it.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, not {rounds}")
    kube = api.kube
    created = name is None
    target = name or f"ungater-bench-floor-{secrets.token_hex(4)}"
    path = f"/metadata/labels/{_pointer(_FLOOR_LABEL)}"
    if created:
        await kube.create(resource, namespace, {"metadata": {"name": target}, "data": {}})
    labelled = ""  # the path that takes our label off again, once it is on
    try:
        gets: list[float] = []
        obj: dict[str, Any] | None = None
        for _ in range(rounds):
            began = time.monotonic()
            obj = await kube.get(resource, namespace, target)
            gets.append(time.monotonic() - began)
            if obj is None:
                raise LookupError(f"{resource.kind} {namespace}/{target} is gone")
        assert obj is not None
        labels = (obj.get("metadata") or {}).get("labels")
        first: dict[str, Any] = (
            {"op": "add", "path": path, "value": "0"}
            if labels
            else {"op": "add", "path": "/metadata/labels", "value": {_FLOOR_LABEL: "0"}}
        )
        await kube.json_patch(resource, namespace, target, [first])
        labelled = path if labels else "/metadata/labels"
        patches: list[float] = []
        for i in range(1, rounds + 1):
            ops = [
                {"op": "test", "path": path, "value": str(i - 1)},
                {"op": "replace", "path": path, "value": str(i)},
            ]
            began = time.monotonic()
            await kube.json_patch(resource, namespace, target, ops)
            patches.append(time.monotonic() - began)
    finally:
        if created:
            await kube.delete(resource, namespace, target)
        elif labelled:
            try:
                ops = [{"op": "remove", "path": labelled}]
                await kube.json_patch(resource, namespace, target, ops)
            except ApiError as exc:
                if exc.status not in (404, 422):  # gone, or the label went already
                    raise
    return {
        "object": f"{resource.kind} {namespace}/{target}",
        "rounds": rounds,
        "get_ms": round(statistics.median(gets) * 1000.0, 3),
        "patch_ms": round(statistics.median(patches) * 1000.0, 3),
        "get_samples_ms": [round(s * 1000.0, 3) for s in gets],
        "patch_samples_ms": [round(s * 1000.0, 3) for s in patches],
    }


def _pointer(key: str) -> str:
    """A map key as a JSON pointer segment (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")
