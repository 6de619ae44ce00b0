"""One execution of the real controller parts under the explorer's hand on every choice point.

The in-memory API server (``tests.fakekube.FakeKube``) holds the objects; each replica is a
real ``Controller`` whose reflectors are never run: the explorer decides when each watch
stream delivers (all it has pending, in the server's order), when a quiet stream gets a
bookmark, when a reconcile runs, where a reconcile pauses on a request to let the world move,
whether a patch is answered or times out (its write landing later, or never), when
expectations expire, when leadership passes and when the story (the writes of Kueue, the Job
controller and other writers) takes its next step. Everything else runs as in production.

After every committed write of ours the cap is checked on the server's state: no owner may
have more live released pods than min(the active slice's spec and admitted counts, its
size); and no replica may report as foreign a release no other writer made.
"""

from __future__ import annotations

import asyncio
import contextlib
import pickle
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import ungater_plugins.job as job_plugin

from tests.fakekube import FakeKube
from ungater._controller.controller import Controller
from ungater._controller.reconciler import Changed, PatchesFailed
from ungater._decide.decision import Decision
from ungater._decide.indexes import OwnerKey
from ungater._kube.client import ApiError, Resource
from ungater._kube.reflector import Reflector
from ungater._model.config import Config
from ungater._plugins.registry import PluginRegistry

GATE = "kueue.x-k8s.io/elastic-job"
LEASES = Resource("", "v1", "configmaps", "ConfigMap")  # the Lease write that starts a term
#: How many loop turns let the controller's tasks run to their next request (or their end).
SETTLE_TURNS = 1000
#: The most requests one reconcile makes (a bound, so a runaway reconcile cannot hang a run).
MAX_REQUESTS = 64


class Violation(AssertionError):
    """The cap broken, or a false foreign-release report."""


@dataclass
class Request:
    kind: str  # get, list, patch
    what: str
    call: Callable[[], Awaitable[Any]]
    answer: asyncio.Future[Any]
    bound: int | None = None  # a patch's: the cap it was sent under (see ``World._check``)
    releasing: bool = False  # a patch that removes a scheduling gate (not a fence)


class SteppedClient:
    """The fake API server, with every request of a reconcile held until the explorer lets it
    through (``World.gating``); set-up lists go straight through."""

    def __init__(self, world: World, replica: Replica) -> None:
        self.world = world
        self.replica = replica
        self.fake = world.fake

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fake, name)

    async def _call(
        self, kind: str, what: str, call: Callable[[], Awaitable[Any]], releasing: bool = False
    ) -> Any:
        if not self.world.gating:
            return await call()
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        bound = self.world.bound_at_send(self.replica) if kind == "patch" else None
        self.replica.requests.append(Request(kind, what, call, future, bound, releasing))
        return await future

    async def get(self, resource: Resource, namespace: str | None, name: str) -> Any:
        return await self._call(
            "get", f"get {resource.plural}/{name}", lambda: self.fake.get(resource, namespace, name)
        )

    async def list_objects(self, resource: Resource, namespace: str | None, sel: str = "") -> Any:
        return await self._call(
            "list",
            f"list {resource.plural}",
            lambda: self.fake.list_objects(resource, namespace, sel),
        )

    async def json_patch(
        self, resource: Resource, namespace: str | None, name: str, ops: Any
    ) -> Any:
        releasing = any(
            op.get("op") == "remove" and "schedulingGates" in str(op.get("path")) for op in ops
        )
        return await self._call(
            "patch",
            f"patch {resource.plural}/{name}",
            lambda: self.fake.json_patch(resource, namespace, name, ops),
            releasing,
        )


class Elector:
    """Leadership as the explorer hands it out: leading and the term's start at once (as the
    real elector's ``is_leader`` and ``term``); the workers start at a later step."""

    def __init__(self) -> None:
        self.is_leader = False
        self.term: Any = None


@dataclass
class Term:
    number: int
    resource_version: str


@dataclass
class Replica:
    name: str
    ctl: Controller
    elector: Elector
    cursors: list[int] = field(default_factory=list)  # per reflector: history index seen to
    requests: list[Request] = field(default_factory=list)
    task: asyncio.Task[Any] | None = None
    answered: int = 0  # requests answered in the reconcile running now
    working: bool = False  # its workers run (a term began and the controller acts)
    reports: list[str] = field(default_factory=list)  # pods it called released by another

    @property
    def reflectors(self) -> list[Reflector[Any]]:
        return self.ctl.reflectors


@dataclass(frozen=True)
class Action:
    name: str
    args: tuple[Any, ...] = ()

    def __str__(self) -> str:
        return f"{self.name}({', '.join(map(str, self.args))})" if self.args else self.name


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def config(**extra: Any) -> Config:
    return Config.model_validate(
        {
            "kinds": [{"group": "batch", "kind": "Job"}],
            "mode": "release",
            "expectationsTimeoutSeconds": 5,
            "policyCheckIntervalSeconds": 0,
            **extra,
        }
    )


_CONFIG = config()
_REGISTRY = PluginRegistry.from_modules({"job": job_plugin})  # plugins are pure: one for all
#: Each scenario's starting objects, built once and copied for every execution.
_TEMPLATES: dict[str, tuple[bytes, list[str]]] = {}


@dataclass
class Bounds:
    """The scope of one exploration."""

    pauses: int = 3  # a reconcile may pause before its 1st..n-th request
    faults: int = 1  # patches that time out (their write landing later, or never)
    expiries: int = 2  # times the expectations' timeout may pass
    leader_changes: int = 1


class World:
    """One execution: build with ``await World.start(scenario)``, then ``await step(action)``."""

    def __init__(self, scenario: Any, bounds: Bounds) -> None:
        self.scenario = scenario
        self.bounds = bounds
        self.fake = FakeKube(seed=1)
        self.clock = Clock()
        self.replicas: list[Replica] = []
        self.story_at = 0
        self.gating = False
        self.late: list[Request] = []
        self.faults = self.expiries = self.leader_changes = 0
        self.foreign: set[str] = set()  # pods other writers released (our gate)
        self.ours: dict[str, int] = {}  # pods our replicas released: the resourceVersion
        # reports of a release of ours that landed after the reporter's term began (open)
        self.late_reports: set[tuple[str, str]] = set()
        self.owners: list[str] = []  # names of the Jobs whose cap is checked
        self.trace: list[str] = []

    # -- building --------------------------------------------------------------------------------

    @classmethod
    async def start(cls, scenario: Any, bounds: Bounds) -> World:
        world = cls(scenario, bounds)
        template = _TEMPLATES.get(scenario.name)
        if template is None:
            scenario.setup(world)
            _TEMPLATES[scenario.name] = (pickle.dumps(world.fake), list(world.owners))
        else:  # a pickle round trip copies the objects several times faster than deepcopy
            world.fake, world.owners = pickle.loads(template[0]), list(template[1])
        for name in scenario.replicas:
            await world._add_replica(name)
        for name in scenario.leading:
            world._lease_write()
            world._lead(world.replica(name))
            world._work(world.replica(name))
        world.gating = True
        return world

    async def _add_replica(self, name: str) -> None:
        elector = Elector()
        settings = config(**self.scenario.config) if self.scenario.config else _CONFIG
        ctl = Controller(settings, self.fake, _REGISTRY, clock=self.clock)
        replica = Replica(name, ctl, elector)
        client = SteppedClient(self, replica)
        ctl.client = client
        ctl.state.client = client
        ctl.state.leading = lambda: elector.is_leader
        ctl.state.freshness.term_start = lambda: _term_start(elector, ctl.state)
        ctl.notices.on_foreign_release = lambda pod: replica.reports.append(pod.name)
        await ctl.start()
        for r in ctl.reflectors:
            await r.relist()
        replica.cursors = [len(self.fake.history)] * len(ctl.reflectors)
        self.replicas.append(replica)

    def replica(self, name: str) -> Replica:
        return next(r for r in self.replicas if r.name == name)

    # -- the choice points -------------------------------------------------------------------------

    def enabled(self) -> list[Action]:
        out: list[Action] = []
        if self.story_at < len(self.scenario.story):
            out.append(Action("story", (self.scenario.story[self.story_at][0],)))
        for rep in self.replicas:
            for i, r in enumerate(rep.reflectors):
                if self._pending(rep, i):
                    out.append(Action("deliver", (rep.name, r.resource.plural)))
                elif (
                    self.scenario.bookmarks
                    and rep.ctl.state.proven
                    is not None  # a cache's version matters to nothing else
                    and _rv(r.resource_version) < self.fake.rv
                ):
                    out.append(Action("bookmark", (rep.name, r.resource.plural)))
            if rep.task is None and rep.working and rep.elector.is_leader:
                out.append(Action("reconcile", (rep.name,)))
                out.extend(
                    Action("reconcile-pausing", (rep.name, k))
                    for k in range(1, self.bounds.pauses + 1)
                )
            if rep.task is not None and rep.requests:
                out.append(Action("resume", (rep.name,)))
                if rep.requests[0].kind == "patch" and self.faults < self.bounds.faults:
                    out.append(Action("time-out", (rep.name,)))
            if rep.elector.is_leader and not rep.working:
                out.append(Action("workers-start", (rep.name,)))
            if (
                not rep.elector.is_leader
                and self.leader_changes < self.bounds.leader_changes
                and self.scenario.handover
            ):
                out.append(Action("lead", (rep.name,)))
        out.extend(Action("land", (i,)) for i in range(len(self.late)))
        if self.expiries < self.bounds.expiries and any(
            len(rep.ctl.expectations) for rep in self.replicas
        ):
            out.append(Action("expire"))
        return out

    async def step(self, action: Action) -> None:
        self.trace.append(str(action))
        name, args = action.name, action.args
        if name == "story":
            _, write = self.scenario.story[self.story_at]
            self.story_at += 1
            write(self)
        elif name == "deliver":
            rep = self.replica(args[0])
            self._deliver(rep, _index(rep, args[1]))
        elif name == "bookmark":
            rep = self.replica(args[0])
            r = rep.reflectors[_index(rep, args[1])]
            r.apply(
                {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": str(self.fake.rv)}}}
            )
        elif name == "reconcile":
            await self._reconcile(self.replica(args[0]), pause=None)
        elif name == "reconcile-pausing":
            await self._reconcile(self.replica(args[0]), pause=args[1])
        elif name == "resume":
            await self._run_on(self.replica(args[0]), pause=None)
        elif name == "time-out":
            rep = self.replica(args[0])
            req = rep.requests.pop(0)
            self.faults += 1
            self.late.append(req)
            req.answer.set_exception(TimeoutError("the client gave up (explorer)"))
            await self._run_on(rep, pause=None)
        elif name == "land":
            req = self.late.pop(args[0])
            try:
                patched = await req.call()
            except Exception:  # refused at landing: the server changed meanwhile
                pass
            else:
                if req.releasing:
                    self._released(patched)
                    self._check(f"a late {req.what} landed", req.bound)
        elif name == "expire":
            self.expiries += 1
            self.clock.now += 6
        elif name == "lead":
            for rep in self.replicas:
                rep.elector.is_leader = False
            self.leader_changes += 1
            self._lease_write()
            self._lead(self.replica(args[0]))
        elif name == "workers-start":
            self._work(self.replica(args[0]))
        else:
            raise ValueError(name)
        await _settle()
        self._check_reports()

    # -- the parts of a step -----------------------------------------------------------------------

    def _pending(self, rep: Replica, i: int) -> bool:
        r = rep.reflectors[i]
        return any(
            self._event(r, entry) is not None for entry in self.fake.history[rep.cursors[i] :]
        )

    @staticmethod
    def _event(r: Reflector[Any], entry: Any) -> dict[str, Any] | None:
        _, rkey, ns, etype, obj, old = entry
        if rkey != (r.resource.group, r.resource.plural):
            return None
        if r.namespace is not None and r.namespace != ns:
            return None
        return FakeKube._event_for(r.label_selector, etype, obj, old)

    def _deliver(self, rep: Replica, i: int) -> None:
        r = rep.reflectors[i]
        for entry in self.fake.history[rep.cursors[i] :]:
            event = self._event(r, entry)
            if event is not None:
                r.apply(event)
        rep.cursors[i] = len(self.fake.history)

    async def _reconcile(self, rep: Replica, pause: int | None) -> None:
        key = self.scenario.key(self)
        rep.answered = 0

        async def run() -> None:
            # what the worker retries with backoff; anything else is a bug and ends the run
            with contextlib.suppress(Changed, ApiError, OSError, TimeoutError, PatchesFailed):
                await rep.ctl.reconciler.reconcile(key)

        rep.task = asyncio.get_running_loop().create_task(run())
        await self._run_on(rep, pause)

    async def _run_on(self, rep: Replica, pause: int | None) -> None:
        """Answer the reconcile's requests in order until it ends, or until the ``pause``-th is
        pending (left for a later ``resume`` or ``time-out``)."""
        for _ in range(MAX_REQUESTS):
            await _settle()
            assert rep.task is not None
            if rep.task.done():
                task, rep.task = rep.task, None
                rep.requests.clear()
                if task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
                return
            if not rep.requests:
                raise RuntimeError(f"{rep.name}: a reconcile waits on something not a request")
            if pause is not None and rep.answered + 1 >= pause:
                return
            req = rep.requests.pop(0)
            rep.answered += 1
            try:
                result = await req.call()
            except Exception as exc:
                req.answer.set_exception(exc)
                continue
            req.answer.set_result(result)
            if req.releasing:
                self._released(result)
                self._check(f"{rep.name}'s {req.what}", req.bound)
        raise RuntimeError(f"{rep.name}: more than {MAX_REQUESTS} requests in one reconcile")

    def _lease_write(self) -> None:
        self.fake.put(
            LEASES, {"metadata": {"name": f"lease-{self.fake.rv}", "namespace": "kube-system"}}
        )

    def _lead(self, rep: Replica) -> None:
        rep.elector.term = Term(self.leader_changes + 1, str(self.fake.rv))
        rep.elector.is_leader = True

    def _work(self, rep: Replica) -> None:
        """What ``Controller._lead`` does as the workers start."""
        rep.working = True
        rep.ctl.state.freshness.begin_term(_rv(rep.elector.term.resource_version))

    # -- the oracles -------------------------------------------------------------------------------

    def bound_at_send(self, rep: Replica) -> int:
        """The cap a patch of ``rep`` is sent under: the server's slice cap, and the owner's
        size as ``rep``'s own owner cache shows it. A shrink of the owner that no watch of
        ours has shown, with no pod gone yet, is invisible to any releaser that does not read
        the owner for every release (docs/safety.md, "What is left open")."""
        return min(self.scenario.bound(self, owner, rep) for owner in self.owners)

    def _released(self, patched: Any) -> None:
        meta = (patched or {}).get("metadata") or {}
        if GATE not in [
            g["name"] for g in (patched or {}).get("spec", {}).get("schedulingGates") or []
        ]:
            self.ours.setdefault(str(meta.get("name")), int(meta.get("resourceVersion") or 0))

    def _check(self, after: str, sent_under: int | None) -> None:
        """After each release of ours (a fence releases nothing): live released <= the cap
        now, or the cap the request was sent under, whichever is larger (no releaser sees a
        shrink committed after it sent)."""
        for owner in self.owners:
            live, cap = self.scenario.live_and_cap(self, owner)
            if live > max(cap, sent_under if sent_under is not None else cap):
                raise Violation(f"after {after}: {owner} has {live} live released, cap {cap}")

    def _check_reports(self) -> None:
        """A replica may call a release foreign only if no writer of ours made it before its
        term began; one of ours that landed after is indistinguishable and counted apart."""
        for rep in self.replicas:
            start = _rv(rep.elector.term.resource_version) if rep.elector.term else 0
            for pod in rep.reports:
                if pod in self.foreign:
                    continue
                at = self.ours.get(pod)
                if at is not None and at > start:
                    self.late_reports.add((rep.name, pod))
                    continue
                raise Violation(f"{rep.name} reported {pod} released by another writer")

    # -- what two executions that reach the same state share -------------------------------------

    def fingerprint(self) -> tuple[Any, ...]:
        objects = tuple(
            sorted((k, o["metadata"]["resourceVersion"]) for k, o in self.fake.objects.items())
        )
        reps = tuple(_replica_state(rep) for rep in self.replicas)
        return (
            objects,
            reps,
            self.story_at,
            tuple(r.what for r in self.late),
            self.faults,
            self.expiries,
            self.leader_changes,
            self.clock.now,
        )

    async def close(self) -> None:
        for rep in self.replicas:
            if rep.task is not None:
                rep.task.cancel()
                for req in rep.requests:
                    if not req.answer.done():
                        req.answer.cancel()
                await asyncio.gather(rep.task, return_exceptions=True)
            rep.ctl.queue.shut_down()


def _replica_state(rep: Replica) -> tuple[Any, ...]:
    s = rep.ctl.state
    ledger = s.ledger
    stores = tuple(
        (
            r.resource_version,
            tuple(sorted((u, getattr(v, "resource_version", "")) for u, v in r.store.items())),
        )
        for r in rep.reflectors
    )
    return (
        stores,
        tuple(rep.cursors),
        tuple(
            sorted(
                str(k) + "/" + u
                for k in ledger.expectations._by_key
                for u in ledger.expectations._by_key[k]
            )
        ),
        tuple(sorted((u, x.resource_version) for u, x in ledger.uncertain.items())),
        tuple(sorted(ledger.written.items())),
        tuple(sorted(ledger.ours)),
        tuple(sorted(ledger.foreign_seen)),
        tuple(sorted(s.owner_rv.items())),
        None if s.proven is None else tuple(sorted(map(str, s.proven))),
        s.term_rv,
        rep.elector.is_leader,
        rep.working,
        (rep.answered, tuple(r.what for r in rep.requests)) if rep.task is not None else None,
        tuple(rep.reports),
    )


def _index(rep: Replica, plural: str) -> int:
    return next(i for i, r in enumerate(rep.reflectors) if r.resource.plural == plural)


def _rv(value: str) -> int:
    return int(value) if value.isdigit() else 0


def _term_start(elector: Elector, state: Any = None) -> int:
    """Where a replica's term began, from the moment it leads (``state``: for a revert)."""
    return _rv(elector.term.resource_version) if elector.term is not None else 0


async def _settle() -> None:
    """Let every task run until all wait on something only the explorer gives (a request's
    answer): the loop has no callback ready (at most ``SETTLE_TURNS`` turns)."""
    loop = asyncio.get_running_loop()
    for _ in range(SETTLE_TURNS):
        await asyncio.sleep(0)
        if not loop._ready:  # type: ignore[attr-defined]  # asyncio's run queue
            return
    raise RuntimeError(f"the controller's tasks did not settle in {SETTLE_TURNS} loop turns")


def decisions(world: World) -> dict[str, Decision]:
    """Each replica's last decision for the scenario's owner (for a failure's report)."""
    key: OwnerKey = world.scenario.key(world)
    return {rep.name: rep.ctl.decisions[key] for rep in world.replicas if key in rep.ctl.decisions}


__all__: Sequence[str] = ["Action", "Bounds", "Violation", "World", "decisions"]
