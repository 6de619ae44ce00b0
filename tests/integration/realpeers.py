"""Helpers for the tests on the real peers (Kueue, the KubeRay operator, the JobSet controller).

:class:`SliceWatch` records every event of the namespace's pods, Workloads and owners, then
replays them in resourceVersion order (one etcd: one order) and checks, at every moment ungater
released a pod, that the live pods without ungater's gate are within the active slice's cap and
the owner's own size.  It also counts, at the end of each step, what each releaser released:
ungater's gate (``UNGATER_GATE``, put in the templates by the tests) and Kueue's own
``kueue.x-k8s.io/elastic-job``, which the real Kueue removes itself: the default Kueue (v0.19.2,
or ``$UNGATER_KUEUE_VERSION``) with its ElasticJobUngater up to the admitted count, in pod name
order; v0.17.1, which the JobSet and audit tests ask for (``kueue_version`` marker), with its
alpha ElasticJobUngater, past the admitted count in some stories (kueue#11977).  The two counts
side by side are the differential record.

The record is judged only whole.  A watch that fails for a reason the server can serve past (a
cut connection, a silent stream, a 5xx) resumes from the last resourceVersion it saw: the server
then sends every later event, or answers 410.  A 410 Gone (mid-stream or on resuming), an
``ERROR`` event or an expired resourceVersion leaves events between the last resourceVersion
seen and the relist that nothing can recover (a pod released and deleted in between is in
neither), so the watch relists and records a :class:`Gap`; running out of watch rounds, or being
stopped while its watch is down (after a failure, before the relist or the resumed watch), is a
gap too.  The relisted state is recorded (``Event.relisted``), but ``replay()`` and ``excess()``
raise :class:`IncompleteHistory` on any gap, naming it, instead of judging a history with a hole.
A failure of the recorder's own bookkeeping on an event raises :class:`RecorderBroken` out of the
watch task at once.
"""

from __future__ import annotations

import http.client
import json
import ssl
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import aclosing, asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import yaml

from tests.integration.k8s import Kube
from tests.objects import PODS, WORKLOADS, controller_uid, gates_of
from ungater._kube.client import ApiError, Resource

UNGATER_GATE = "example.com/ungater"
KUEUE_GATE = "kueue.x-k8s.io/elastic-job"
SLICE_NAME = "kueue.x-k8s.io/workload-slice-name"
REPLACES = "kueue.x-k8s.io/workload-slice-replacement-for"

VAP = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
BINDINGS = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"


def as_kueue(plane: Any, method: str, path: str, body: Any, content_type: str) -> int:
    """One request under Kueue's own service account (its token from its kubeconfig)."""
    kubeconfig = yaml.safe_load(plane.peers.kubeconfigs["kueue"].read_text())
    token = kubeconfig["users"][0]["user"]["token"]
    context = ssl.create_default_context(cafile=str(plane.ca_path))
    conn = http.client.HTTPSConnection(
        "127.0.0.1", plane.apiserver_port, timeout=10, context=context
    )
    try:
        headers = {"Authorization": f"Bearer {token}", "Content-Type": content_type}
        conn.request(method, path, body=json.dumps(body).encode(), headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


@contextmanager
def gate_policy_in_force(
    plane: Any, ns: str, docs: Sequence[dict[str, Any]], probe_labels: dict[str, str]
) -> Iterator[None]:
    """Create admission policies and bindings (``docs``) and return once they are in force:
    a dry-run removal of Kueue's gate, under Kueue's account, from a probe pod in ``ns`` with
    ``probe_labels`` is refused (the API server loads a new policy a moment after it is
    created). Everything made is deleted on the way out."""
    probe_name = "policy-probe"
    probe = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": probe_name, "labels": probe_labels},
        "spec": {
            "schedulingGates": [{"name": KUEUE_GATE}],
            "containers": [{"name": "c", "image": "registry.invalid/probe:1"}],
        },
    }
    made: list[str] = []
    pod = f"/api/v1/namespaces/{ns}/pods/{probe_name}"
    try:
        for doc in docs:
            path = VAP if doc["kind"] == "ValidatingAdmissionPolicy" else BINDINGS
            status, body = plane.request("POST", path, doc)
            assert status == 201, body
            made.append(f"{path}/{doc['metadata']['name']}")
        status, body = plane.request("POST", f"/api/v1/namespaces/{ns}/pods", probe)
        assert status == 201, body
        made.append(pod)
        removal = [{"op": "remove", "path": "/spec/schedulingGates/0"}]
        for _ in range(120):  # 30 s at most
            code = as_kueue(
                plane, "PATCH", f"{pod}?dryRun=All", removal, "application/json-patch+json"
            )
            if code in (403, 422):
                break
            time.sleep(0.25)
        else:
            raise AssertionError("the admission policy was not in force after 30 s")
        plane.request("DELETE", pod)
        made.remove(pod)
        yield
    finally:
        for path in reversed(made):
            plane.request("DELETE", path)


def ray_cluster_spec(
    replicas: int,
    *,
    gates: Sequence[str] = (UNGATER_GATE,),
    autoscaling: bool = False,
    hosts: int | None = None,
) -> dict[str, Any]:
    """A RayCluster spec: a head and one worker group ``workers``, 1 CPU per pod, ``gates``
    in every pod template; ``autoscaling``: in-tree autoscaling on (KubeRay then deletes only
    the workers named in ``workersToDelete``, and Kueue counts workers only with it on)."""

    def template() -> dict[str, Any]:
        ray = {
            "name": "ray",
            "image": "registry.invalid/ray:2",
            "resources": {"requests": {"cpu": "1"}},
        }
        spec: dict[str, Any] = {"containers": [ray]}
        if gates:
            spec["schedulingGates"] = [{"name": g} for g in gates]
        return {"spec": spec}

    group: dict[str, Any] = {
        "groupName": "workers",
        "replicas": replicas,
        "minReplicas": 0,
        "maxReplicas": 20,
        "rayStartParams": {},
        "template": template(),
    }
    if hosts is not None:
        group["numOfHosts"] = hosts
    spec: dict[str, Any] = {
        "headGroupSpec": {"rayStartParams": {}, "template": template()},
        "workerGroupSpecs": [group],
    }
    if autoscaling:
        spec["enableInTreeAutoscaling"] = True
    return spec


def elastic_raycluster(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A RayCluster in the test's LocalQueue, marked elastic for Kueue."""
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {
            "name": name,
            "labels": {"kueue.x-k8s.io/queue-name": "user-queue"},
            "annotations": {"kueue.x-k8s.io/elastic-job": "true"},
        },
        "spec": spec,
    }


#: owner kind -> (resource, desired size per pod set of the raw object)
SizeOf = Callable[[dict[str, Any]], dict[str, int]]


def is_live(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed") and not pod[
        "metadata"
    ].get("deletionTimestamp")


def released_by(pods: list[dict[str, Any]], gate: str) -> list[dict[str, Any]]:
    return [p for p in pods if is_live(p) and gate not in gates_of(p)]


def kueue_pod_set(pod: dict[str, Any]) -> str:
    """The pod set Kueue stamped on the pod's template."""
    return str(pod["metadata"].get("labels", {}).get("kueue.x-k8s.io/podset", ""))


def _cond(obj: dict[str, Any], kind: str) -> bool:
    return any(
        c.get("type") == kind and c.get("status") == "True"
        for c in (obj.get("status") or {}).get("conditions") or ()
    )


def slice_caps(workload: dict[str, Any]) -> dict[str, int]:
    """Per pod set: min(spec count, admitted count) of one admitted slice."""
    spec = {p.get("name", "main"): int(p.get("count", 0)) for p in workload["spec"]["podSets"]}
    admission = (workload.get("status") or {}).get("admission") or {}
    caps: dict[str, int] = {}
    for a in admission.get("podSetAssignments") or ():
        name = a.get("name", "main")
        caps[name] = min(spec.get(name, 0), int(a.get("count", spec.get(name, 0))))
    return caps


def chain_cap(workloads: list[dict[str, Any]], owner_uid: str) -> dict[str, int] | None:
    """The caps of the owner's newest admitted, unevicted slice (finished by replacement or not:
    between Kueue finishing the old slice and admitting the new one, the released pods are still
    the old slice's); ``None`` when there is none."""
    mine = [
        w
        for w in workloads
        if any(
            r.get("controller") and r.get("uid") == owner_uid
            for r in w["metadata"].get("ownerReferences") or ()
        )
    ]
    admitted = [
        w
        for w in mine
        if _cond(w, "Admitted")
        and not _cond(w, "Evicted")
        and not (
            _cond(w, "Finished")
            and not any(
                c.get("type") == "Finished" and c.get("reason") == "WorkloadSliceReplaced"
                for c in (w.get("status") or {}).get("conditions") or ()
            )
        )
    ]
    if not admitted:
        return None
    newest = max(
        admitted,
        key=lambda w: (w["metadata"]["creationTimestamp"], int(w["metadata"]["resourceVersion"])),
    )
    return slice_caps(newest)


@dataclass
class Event:
    rv: int
    resource: str  # "pod", "workload", "owner"
    kind: str  # ADDED, MODIFIED, DELETED
    obj: dict[str, Any]
    at: float = field(default_factory=time.monotonic)  # when the watch received it
    # from a relist after a gap, not a watch: the object's state at the list (a DELETED one:
    # gone by the list's resourceVersion, its ``rv``), not the moment it changed
    relisted: bool = False


#: watch rounds per resource (each one watch of up to ``WATCH_SECONDS``, or one relist)
WATCH_ROUNDS = 1000
WATCH_SECONDS = 60  # the server ends each watch after this long
SILENCE_SECONDS = 120.0  # a stream silent for longer is taken for dead (bookmarks come sooner)
LIST_SECONDS = 30.0  # one list, at most
RETRY_SECONDS = 0.2  # before a watch is resumed or a relist tried again


@dataclass(frozen=True)
class Gap:
    """Events of one resource the recorder cannot have seen: those after ``after_rv`` (the
    last resourceVersion its watch delivered) up to ``until_rv`` (the relist that followed;
    None: to the end of the record)."""

    resource: str  # "pod", "workload", "owner"
    after_rv: int
    until_rv: int | None
    why: str

    def line(self) -> str:
        until = f"rv {self.until_rv}" if self.until_rv is not None else "the end of the record"
        return f"{self.resource} events after rv {self.after_rv} up to {until} unseen: {self.why}"


class IncompleteHistory(AssertionError):
    """The record has a gap: a replay of it would judge less than what happened."""


class RecorderBroken(Exception):
    """The recorder's own bookkeeping failed on an event: the record stopped being kept."""


class _ErrorEvent(Exception):
    """The watch stream sent an ``ERROR`` event (its object, a Status, in ``status``)."""

    def __init__(self, status: Any) -> None:
        code = status.get("code") if isinstance(status, dict) else None
        message = status.get("message", "") if isinstance(status, dict) else status
        super().__init__(f"ERROR event {code}: {message}".strip())


@dataclass
class Excess:
    """A span, in resourceVersion order, during which one pod set of the owner had more live pods
    without a gate than its active slice admits (``limit``: min(spec count, admitted count) of
    the newest admitted slice that is neither finished nor evicted). ``start``/``end`` are when
    the watch received the events that opened and closed it (monotonic; ``end`` None: still
    open); ``released`` holds every set of live released pod names seen during it, in order."""

    workload: str
    pod_set: str
    limit: int
    start_rv: int
    start: float
    released: list[frozenset[str]] = field(default_factory=list)
    end_rv: int | None = None
    end: float | None = None

    def seconds(self, now: float | None = None) -> float:
        end = self.end if self.end is not None else (now or time.monotonic())
        return end - self.start

    def line(self) -> str:
        most = max(len(r) for r in self.released)
        until = f"rv {self.end_rv}" if self.end_rv is not None else "the end"
        return (
            f"{self.workload}/{self.pod_set}: up to {most} live released for {self.limit}, "
            f"rv {self.start_rv} to {until} (at {self.start:.2f}, {self.seconds():.2f}s)"
        )


def active_slice_of(workloads: list[dict[str, Any]], owner_uid: str) -> dict[str, Any] | None:
    """The owner's newest slice that is admitted, not finished and not evicted (a replacement
    is newer than the slice it replaces, even within the same second)."""
    mine = [w for w in workloads if controller_uid(w) == owner_uid]
    keys = {f"{w['metadata']['namespace']}/{w['metadata']['name']}": w for w in mine}

    def depth(w: dict[str, Any]) -> int:
        n, seen = 0, set()
        while (up := w["metadata"].get("annotations", {}).get(REPLACES)) in keys and up not in seen:
            seen.add(up)
            w, n = keys[up], n + 1
        return n

    live = [
        w
        for w in mine
        if _cond(w, "Admitted") and not _cond(w, "Finished") and not _cond(w, "Evicted")
    ]
    if not live:
        return None
    return max(live, key=lambda w: (w["metadata"]["creationTimestamp"], depth(w)))


@dataclass
class StepRecord:
    step: str
    admitted: dict[str, int]
    ungater: dict[str, int]
    kueue: dict[str, int]
    seconds: float  # until ungater's count matched what was admitted
    kueue_seconds: float | None  # until Kueue's did; None: not within the wait

    def line(self) -> str:
        kueue = (
            f"after {self.kueue_seconds:.1f}s"
            if self.kueue_seconds is not None
            else "NOT matched within the wait"
        )
        return (
            f"{self.step}: admitted {self.admitted}; ungater released {self.ungater} after "
            f"{self.seconds:.1f}s; Kueue released {self.kueue} {kueue}"
        )


@dataclass
class SliceWatch:
    kube: Kube
    ns: str
    owner_res: Resource
    owner_uid: str
    size_of: SizeOf
    pod_set_of: Callable[[dict[str, Any]], str]
    owner_of_pod: Callable[[dict[str, Any]], str]
    events: list[Event] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    synced: anyio.Event = field(default_factory=anyio.Event)
    _started: dict[str, int] = field(default_factory=dict)
    owner_name: str = ""
    kueue_excess: list[str] = field(default_factory=list)
    gaps: list[Gap] = field(default_factory=list)  # non-empty: replay() and excess() refuse
    relists: dict[str, int] = field(default_factory=dict)  # per resource, after the first list
    # per resource: uid -> the object as last recorded (what a relist is compared with)
    _known: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return not self.gaps

    def check_complete(self) -> None:
        """Raise :class:`IncompleteHistory`, naming every gap, unless the record is whole."""
        if self.gaps:
            lines = "; ".join(g.line() for g in self.gaps)
            raise IncompleteHistory(
                f"the recorded history is incomplete, so it cannot be judged: {lines}"
            )

    def _record(self, name: str, ev: Any) -> str:
        """Record one watch event; the resourceVersion to resume from. Raises ``_ErrorEvent``
        on an ``ERROR`` event, ``RecorderBroken`` when the event cannot be recorded."""
        try:
            kind = ev["type"]
            if kind == "ERROR":
                raise _ErrorEvent(ev.get("object"))
            obj = ev["object"]
            rv = str(obj["metadata"]["resourceVersion"])
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                self.events.append(Event(int(rv), name, kind, obj))
                known = self._known.setdefault(name, {})
                if kind == "DELETED":
                    known.pop(obj["metadata"]["uid"], None)
                else:
                    known[obj["metadata"]["uid"]] = obj
            return rv
        except _ErrorEvent:
            raise
        except Exception as exc:
            raise RecorderBroken(f"the recorder failed on a {name} event: {exc!r}") from exc

    def _listed(self, name: str, items: list[dict[str, Any]], list_rv: str) -> None:
        """Record a list: each object new or changed since it was last recorded (all of them,
        the first time), and each recorded one the list no longer has, gone by ``list_rv``."""
        try:
            first = name not in self._known
            known = self._known.setdefault(name, {})
            listed = {obj["metadata"]["uid"]: obj for obj in items}
            for uid, obj in listed.items():
                before = known.get(uid)
                rv = obj["metadata"]["resourceVersion"]
                if before is None or before["metadata"]["resourceVersion"] != rv:
                    kind = "ADDED" if before is None else "MODIFIED"
                    self.events.append(Event(int(rv), name, kind, obj, relisted=not first))
            for uid, obj in known.items():
                if uid not in listed:
                    self.events.append(Event(int(list_rv), name, "DELETED", obj, relisted=True))
            self._known[name] = listed
        except Exception as exc:
            raise RecorderBroken(f"the recorder failed on a {name} list: {exc!r}") from exc

    async def _watch(self, res: Resource, name: str) -> None:
        """Record ``res`` as ``name``: list, then watch in at most ``WATCH_ROUNDS`` rounds,
        resuming from the last resourceVersion seen, or relisting (a :class:`Gap`) when the
        server can no longer serve from it (see the module's docstring)."""
        with anyio.fail_after(LIST_SECONDS):
            items, rv = await self.kube.client.list_objects(res, self.ns, "")
        self._listed(name, items, rv)
        self._started[name] = 1
        if len(self._started) == 3:
            self.synced.set()
        expired = ""  # why the server can no longer serve from ``rv``: relist before watching
        down = ""  # why the last round failed: until the next watch is asked for
        try:
            for _ in range(WATCH_ROUNDS):
                if expired:
                    try:
                        with anyio.fail_after(LIST_SECONDS):
                            items, list_rv = await self.kube.client.list_objects(res, self.ns, "")
                    except Exception:  # the API server is away: try again, still expired
                        await anyio.sleep(RETRY_SECONDS)
                        continue
                    if int(list_rv) != int(rv):  # else nothing was written since: no gap
                        self.gaps.append(
                            Gap(name, int(rv), int(list_rv), f"relisted after {expired}")
                        )
                    self._listed(name, items, list_rv)
                    self.relists[name] = self.relists.get(name, 0) + 1
                    rv, expired = list_rv, ""
                down = ""
                try:
                    stream: Any = self.kube.client.watch(
                        res, self.ns, rv, "", WATCH_SECONDS, SILENCE_SECONDS
                    )
                    async with aclosing(stream):  # closed here, in this task, even on a failure
                        async for ev in stream:
                            rv = self._record(name, ev)
                except RecorderBroken:
                    raise  # its own failure: no retry hides it
                except _ErrorEvent as exc:
                    expired = down = str(exc)
                except ApiError as exc:
                    if exc.status == 410:  # GoneError: the history past ``rv`` is compacted
                        expired = down = f"410 Gone ({exc.reason})"
                    else:  # served past ``rv`` again, or a 410 then
                        down = repr(exc)
                        await anyio.sleep(RETRY_SECONDS)
                except Exception as exc:  # a cut, a silent stream, a restart: resume from rv
                    down = repr(exc)
                    await anyio.sleep(RETRY_SECONDS)
        except anyio.get_cancelled_exc_class():
            if down:  # stopped before the watch was back: what came after ``rv`` is unseen
                self.gaps.append(Gap(name, int(rv), None, f"stopped with its watch down ({down})"))
            raise
        self.gaps.append(
            Gap(name, int(rv), None, f"ran out of its {WATCH_ROUNDS} watch rounds: it stopped")
        )

    async def caught_up(self) -> bool:
        """The record has reached a fresh list of the namespace's pods, Workloads and owners
        (the three watches as the tests start them: ``pod``, ``workload``, ``owner``): each
        listed object recorded at its resourceVersion or a newer one, and each recorded object
        the list lacks newer than the list (created after it; one deleted before it must have
        had its DELETED recorded). Poll it before stopping the watches, so that the record
        ends with everything written up to now instead of whatever arrived in a fixed wait."""
        for name, res in (("pod", PODS), ("workload", WORKLOADS), ("owner", self.owner_res)):
            items, list_rv = await self.kube.client.list_objects(res, self.ns, "")
            known = self._known.get(name, {})
            listed = {o["metadata"]["uid"]: int(o["metadata"]["resourceVersion"]) for o in items}
            for uid, rv in listed.items():
                held = known.get(uid)
                if held is None or int(held["metadata"]["resourceVersion"]) < rv:
                    return False
            for uid, obj in known.items():
                if uid not in listed and int(obj["metadata"]["resourceVersion"]) <= int(list_rv):
                    return False
        return True

    # ------------------------------------------------------------------ replay
    def replay(self, gate: str = UNGATER_GATE) -> list[str]:
        """Replay every event in resourceVersion order; at each moment a pod lost ``gate``
        (was released), check the live released pods of its pod set against the active
        slice's cap and the owner's size.  Returns the moments it was exceeded; raises
        :class:`IncompleteHistory` when the record has a gap."""
        self.check_complete()
        pods: dict[str, dict[str, Any]] = {}
        workloads: dict[str, dict[str, Any]] = {}
        owner: dict[str, Any] | None = None
        violations: list[str] = []
        seen: set[tuple[int, str]] = set()
        for ev in sorted(self.events, key=lambda e: e.rv):
            uid = ev.obj["metadata"]["uid"]
            if (ev.rv, uid) in seen:
                continue
            seen.add((ev.rv, uid))
            if ev.resource == "owner":
                if uid == self.owner_uid:
                    owner = None if ev.kind == "DELETED" else ev.obj
                continue
            if ev.resource == "workload":
                if ev.kind == "DELETED":
                    workloads.pop(uid, None)
                else:
                    workloads[uid] = ev.obj
                continue
            if self.owner_of_pod(ev.obj) != self.owner_uid:
                continue
            before = pods.get(uid)
            if ev.kind == "DELETED":
                pods.pop(uid, None)
                continue
            pods[uid] = ev.obj
            was_gated = before is None or gate in gates_of(before)
            if not (was_gated and gate not in gates_of(ev.obj) and is_live(ev.obj)):
                continue
            pod_set = self.pod_set_of(ev.obj)
            n = sum(
                1 for p in released_by(list(pods.values()), gate) if self.pod_set_of(p) == pod_set
            )
            caps = chain_cap(list(workloads.values()), self.owner_uid) or {}
            size = self.size_of(owner).get(pod_set, 0) if owner is not None else 0
            limit = min(caps.get(pod_set, 0), size)
            if n > limit:
                violations.append(
                    f"rv {ev.rv}: {gate} off {ev.obj['metadata']['name']} -> {n} live released "
                    f"in {pod_set} > min(cap {caps.get(pod_set, 0)}, owner size {size})"
                )
        return violations

    def excess(self, gate: str = KUEUE_GATE) -> list[Excess]:
        """Replay every event in resourceVersion order and return the spans during which a pod
        set had more live pods without ``gate`` than the owner's active slice admits, whoever
        removed the gate (a span ends when the count is back within the limit, or the active
        slice changes); raises :class:`IncompleteHistory` when the record has a gap."""
        self.check_complete()
        pods: dict[str, dict[str, Any]] = {}
        workloads: dict[str, dict[str, Any]] = {}
        open_: dict[str, Excess] = {}
        out: list[Excess] = []
        seen: set[tuple[int, str]] = set()
        for ev in sorted(self.events, key=lambda e: e.rv):
            uid = ev.obj["metadata"]["uid"]
            if (ev.rv, uid) in seen or ev.resource == "owner":
                continue
            seen.add((ev.rv, uid))
            if ev.resource == "workload":
                target = workloads
            elif self.owner_of_pod(ev.obj) == self.owner_uid:
                target = pods
            else:
                continue
            if ev.kind == "DELETED":
                target.pop(uid, None)
            else:
                target[uid] = ev.obj
            active = active_slice_of(list(workloads.values()), self.owner_uid)
            caps = slice_caps(active) if active is not None else {}
            name = active["metadata"]["name"] if active is not None else ""
            released: dict[str, set[str]] = {}
            for p in released_by(list(pods.values()), gate):
                released.setdefault(self.pod_set_of(p), set()).add(p["metadata"]["name"])
            for pod_set in sorted(set(open_) | set(caps)):
                names = frozenset(released.get(pod_set, ()))
                over = pod_set in caps and len(names) > caps[pod_set]
                current = open_.get(pod_set)
                if current is not None and (not over or current.workload != name):
                    current.end_rv, current.end = ev.rv, ev.at
                    out.append(open_.pop(pod_set))
                    current = None
                if not over:
                    continue
                if current is None:
                    current = open_[pod_set] = Excess(name, pod_set, caps[pod_set], ev.rv, ev.at)
                if not current.released or current.released[-1] != names:
                    current.released.append(names)
        out.extend(open_.values())
        return sorted(out, key=lambda x: x.start_rv)

    # ------------------------------------------------------------------ steps
    async def counts(self) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
        """Now, from a fresh list: (admitted = min(cap, size), ungater's, Kueue's released)."""
        pods = [
            p for p in await self.kube.list(PODS, self.ns) if self.owner_of_pod(p) == self.owner_uid
        ]
        workloads = await self.kube.list(WORKLOADS, self.ns)
        owner = await self.kube.get(self.owner_res, self.ns, self.owner_name)
        caps = chain_cap(workloads, self.owner_uid) or {}
        sizes = self.size_of(owner) if owner is not None else {}
        admitted = {ps: min(caps.get(ps, 0), n) for ps, n in sizes.items()}
        ours: dict[str, int] = {ps: 0 for ps in sizes}
        theirs: dict[str, int] = {ps: 0 for ps in sizes}
        for p in released_by(pods, UNGATER_GATE):
            ours[self.pod_set_of(p)] = ours.get(self.pod_set_of(p), 0) + 1
        for p in released_by(pods, KUEUE_GATE):
            theirs[self.pod_set_of(p)] = theirs.get(self.pod_set_of(p), 0) + 1
        return admitted, ours, theirs

    async def settle(
        self,
        step: str,
        *,
        timeout: float = 60,
        expect: dict[str, int] | None = None,
        kueue_wait: float = 5.0,
    ) -> StepRecord:
        """Wait until ungater's released count equals what is admitted (and ``expect`` if
        given) and stays so for a moment; record the step with Kueue's count beside it."""
        started = time.monotonic()
        deadline = started + timeout
        stable_since: float | None = None
        last: tuple[dict[str, int], dict[str, int], dict[str, int]] = ({}, {}, {})
        for _ in range(int(timeout / 0.1) + 10):
            last = await self.counts()
            admitted, ours, _ = last
            good = ours == admitted and (expect is None or admitted == expect)
            now = time.monotonic()
            if good:
                stable_since = stable_since or now
                if now - stable_since >= 1.0:
                    break
            else:
                stable_since = None
            if now > deadline:
                raise AssertionError(
                    f"step {step!r}: admitted {admitted} (expected {expect}), ungater released "
                    f"{ours}, Kueue released {last[2]} after {timeout}s"
                )
            await anyio.sleep(0.1)
        admitted, ours, theirs = last
        seconds = time.monotonic() - started - 1.0
        kueue_seconds: float | None = seconds if theirs == admitted else None
        # Kueue's own gate: how long until it released as much (it reacts to job and Workload
        # events, not to pods), bounded so that a stall costs a test at most a few seconds
        for _ in range(int(kueue_wait / 0.2) + 1):
            if kueue_seconds is not None or time.monotonic() - started > seconds + 1 + kueue_wait:
                break
            await anyio.sleep(0.2)
            _, _, theirs = await self.counts()
            if theirs == admitted:
                kueue_seconds = time.monotonic() - started - 1.0
        record = StepRecord(step, admitted, ours, theirs, seconds, kueue_seconds)
        self.steps.append(record)
        print(record.line())
        return record


@asynccontextmanager
async def slice_watch(
    kube: Kube,
    ns: str,
    owner_res: Resource,
    owner: dict[str, Any],
    *,
    size_of: SizeOf,
    pod_set_of: Callable[[dict[str, Any]], str],
    owner_of_pod: Callable[[dict[str, Any]], str],
) -> AsyncIterator[SliceWatch]:
    watch = SliceWatch(
        kube,
        ns,
        owner_res,
        owner["metadata"]["uid"],
        size_of,
        pod_set_of,
        owner_of_pod,
        owner_name=owner["metadata"]["name"],
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(watch._watch, PODS, "pod")
        tg.start_soon(watch._watch, WORKLOADS, "workload")
        tg.start_soon(watch._watch, owner_res, "owner")
        with anyio.fail_after(15):
            await watch.synced.wait()
        try:
            yield watch
        finally:
            await anyio.sleep(0.5)
            tg.cancel_scope.cancel()
    kueue = watch.replay(KUEUE_GATE)
    for line in kueue:
        print(f"differential: Kueue over its cap: {line}")
    watch.kueue_excess = kueue
    violations = watch.replay(UNGATER_GATE)
    assert not violations, violations
