"""One execution of the real controller parts under the explorer's hand on every choice point.

The in-memory API server (``tests.fakekube.FakeKube``) holds the objects; each replica is a
real ``Controller`` whose reflectors and workers are never run: the explorer decides

- when each watch stream delivers (all it has pending, or only its next event), when a stream
  is relisted (410 Gone: the store replaced by a fresh list, whose deletions carry the last
  state the cache held), when a quiet stream gets a bookmark;
- when a reconcile of an owner runs, and where it pauses: before any of its requests, any
  number of times; a paused request answered, a read failing (an API error) or timing out, a
  patch timing out with its write landing at any later step or never, the worker cancelled
  while a request is out (its patch landing later, or never);
- when the expectations' timeout passes, when leadership passes to another replica (its
  ``is_leader`` and term at once) and, as a later step, when its workers start;
- when the story (the writes of Kueue, the owners' controllers, the user and other writers)
  takes its next step.

Everything else runs as in production. The oracles (``oracles.py``) judge every release of
ours as it lands against the server's true cap, every report of a foreign release, and, from
any state, whether the controller left a releasable pod gated for good.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import pickle
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import ungater_plugins.job as job_plugin
import ungater_plugins.jobset as jobset_plugin
import ungater_plugins.raycluster as raycluster_plugin
import ungater_plugins.rayjob as rayjob_plugin

from tests.explore import oracles
from tests.explore.kinds import JOB, Kind
from tests.fakekube import FakeKube
from tests.unit.podfactory import NAMESPACE
from ungater._controller.controller import Controller
from ungater._decide.indexes import OwnerKey
from ungater._kube.client import ApiError, Resource
from ungater._kube.reflector import Reflector
from ungater._model.config import Config
from ungater._plugins.registry import PluginRegistry

LEASES = Resource("", "v1", "configmaps", "ConfigMap")  # the Lease write that starts a term
#: How many loop turns let the controller's tasks run to their next request (or their end).
SETTLE_TURNS = 1000
#: The most requests one reconcile makes (a bound, so a runaway reconcile cannot hang a run).
MAX_REQUESTS = 64
EXPECTATIONS_TIMEOUT = 5

Violation = oracles.Violation


@dataclass
class Request:
    kind: str  # get, list, patch
    what: str
    call: Callable[[], Awaitable[Any]]
    answer: asyncio.Future[Any]
    sent: oracles.Sent | None = None  # a releasing patch's: what the oracle judges it by


class SteppedClient:
    """The fake API server, with every request of a reconcile held until the explorer lets it
    through (``World.gating``); a reflector's own lists go straight through."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.replica: Replica  # set once its controller is built on this client
        self.fake = world.fake

    def __getattr__(self, name: str) -> Any:
        return getattr(self.world.fake, name)

    async def _call(
        self, kind: str, what: str, call: Callable[[], Awaitable[Any]], pod: str = ""
    ) -> Any:
        if pod:
            self.replica.sent.add(pod)
        if not self.world.gating:
            return await call()
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        rep = self.replica
        sent = None
        if pod:
            behind = self.world.rules.owner_lag and oracles.owner_cache_behind(self.world, rep, pod)
            # what the decision that chose the pod had read, not what its reconcile read since
            # (a wave's patch waiting for a slot while a later wave's view is read)
            horizon, served = rep.decided.get(pod, (rep.horizon, tuple(rep.served)))
            sent = oracles.Sent(
                rep.name,
                pod,
                self.world.fake.rv,
                horizon,
                behind,
                served,
                rep.began_rv,
                rep.reconcile,
            )
        rep.requests.append(Request(kind, what, call, future, sent))
        return await future

    async def get(self, resource: Resource, namespace: str | None, name: str) -> Any:
        fake = self.world.fake
        return await self._call(
            "get", f"get {resource.plural}/{name}", lambda: fake.get(resource, namespace, name)
        )

    async def list_objects(self, resource: Resource, namespace: str | None, sel: str = "") -> Any:
        fake = self.world.fake
        return await self._call(
            "list",
            f"list {resource.plural}",
            lambda: fake.list_objects(resource, namespace, sel),
        )

    async def json_patch(
        self, resource: Resource, namespace: str | None, name: str, ops: Any
    ) -> Any:
        releasing = any(
            op.get("op") == "remove" and "schedulingGates" in str(op.get("path")) for op in ops
        )
        fake = self.world.fake
        return await self._call(
            "patch",
            f"patch {resource.plural}/{name}",
            lambda: fake.json_patch(resource, namespace, name, ops),
            name if releasing else "",
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
    key: OwnerKey | None = None  # the owner the running reconcile is of
    began: int = 0  # the trace length when the running reconcile began
    pauses: int = 0  # pauses of the running reconcile
    horizon: int = 0  # the server's version at the reconcile's last answered read
    began_rv: int = 0  # the server's version when the running reconcile began
    reconcile: int = 0  # the running reconcile's number (``World.reconciles``)
    served: list[tuple[str, int]] = field(default_factory=list)  # its answered requests
    sent: set[str] = field(default_factory=set)  # the pods its releasing patches went to
    #: per pod its decisions chose: the horizon and the answered requests at that decision
    decided: dict[str, tuple[int, tuple[tuple[str, int], ...]]] = field(default_factory=dict)
    unsent_before: frozenset[str] = frozenset()  # the unanswered releases when it began
    working: bool = False  # its workers run (a term began and the controller acts)
    listing: bool = False  # its caches take a list now (a relist): removals cannot be dated
    # (pod, how the replica saw it: "watch" or "list") it called released by another writer
    reports: list[tuple[str, str]] = field(default_factory=list)

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


#: ``standDown.resumeAfterSeconds`` in the explored controllers (virtual seconds).
STAND_DOWN_RESUME = 90.0


def config(kind: Kind, **extra: Any) -> Config:
    raw: dict[str, Any] = {
        "kinds": [kind.config()],
        "mode": "release",
        "expectationsTimeoutSeconds": EXPECTATIONS_TIMEOUT,
        "policyCheckIntervalSeconds": 0,
    }
    if "resume_after_seconds" in _stand_down_fields():
        # a stand-down on a previous leader's late releases must end within the liveness
        # oracle's rounds (four of 60 s), as it does after 900 s in production (a controller
        # older than issue 40, run by ``--against``, has no such setting and never resumes)
        raw["standDown"] = {"resumeAfterSeconds": STAND_DOWN_RESUME}
    return Config.model_validate({**raw, **extra})


def _stand_down_fields() -> set[str]:
    field = Config.model_fields.get("stand_down")
    model = field.annotation if field is not None else None
    return set(getattr(model, "model_fields", {}))


def registry(**override: Any) -> PluginRegistry:
    modules: dict[str, Any] = {
        "job": job_plugin,
        "jobset": jobset_plugin,
        "raycluster": raycluster_plugin,
        "rayjob": rayjob_plugin,
    }
    modules.update(override)
    return PluginRegistry.from_modules(modules)


#: The plugins the controller runs with (a planted bug swaps this one; the oracles keep
#: ``oracles.TRUTH``, the real plugins).
REGISTRY = registry()
#: Each (kind, extra settings)'s validated configuration (pydantic is slow; Config is frozen).
_CONFIGS: dict[tuple[str, str], Config] = {}
#: Each (scenario, kind)'s starting objects, built once and copied for every execution.
_TEMPLATES: dict[tuple[str, str], tuple[bytes, list[str]]] = {}


@dataclass
class Bounds:
    """The scope of one exploration (per execution)."""

    pauses: int = 3  # times one reconcile may pause between its requests
    faults: int = 1  # requests that fail: a patch timed out, a read failing or timing out
    cancels: int = 1  # workers cancelled mid-reconcile
    expiries: int = 2  # times the expectations' timeout may pass
    leader_changes: int = 1
    relists: int = 1  # streams relisted (410 Gone)
    partial: int = 1  # deliveries of only a stream's next event
    liveness: bool = True  # check liveness from every state
    hashing: bool = True  # merge states with one fingerprint (off: every path is a state)
    rounds: int = 4  # the liveness check's rounds of reconciles


class World:
    """One execution: build with ``await World.start(scenario, kind, bounds)``, then ``await
    step(action)``."""

    def __init__(self, scenario: Any, kind: Kind, bounds: Bounds) -> None:
        self.scenario = scenario
        self.kind = kind
        self.bounds = bounds
        self.fake = FakeKube(seed=1)
        self.clock = Clock()
        self.replicas: list[Replica] = []
        self.story_at = 0
        self.gating = False
        self.late: list[Request] = []
        self.faults = self.expiries = self.leader_changes = 0
        self.cancels = self.relists = self.partials = 0
        self.ours: dict[str, int] = {}  # pods our replicas released: the resourceVersion
        self.released_by: dict[str, int] = {}  # pod -> the reconcile whose patch released it
        self.reconciles = 0  # reconciles begun (each one's number goes into its patches)
        self.owners: list[str] = []  # names of the owners whose cap is checked
        self.trace: list[str] = []
        self.rules = oracles.Rules()
        self.landed = 0  # releases of ours judged

    # -- building --------------------------------------------------------------------------------

    @classmethod
    async def start(cls, scenario: Any, kind: Kind, bounds: Bounds) -> World:
        world = cls(scenario, kind, bounds)
        template = _TEMPLATES.get((scenario.name, kind.name))
        if template is None:
            scenario.build(world)
            _TEMPLATES[(scenario.name, kind.name)] = (pickle.dumps(world.fake), list(world.owners))
        else:  # a pickle round trip copies the objects several times faster than deepcopy
            world.fake, world.owners = pickle.loads(template[0]), list(template[1])
        for name in scenario.replicas:
            await world._add_replica(name)
        for name in scenario.leading:
            world._lease_write()
            world._lead(world.replica(name))
            world._work(world.replica(name))
        if scenario.proven_at_start:
            for rep in world.replicas:
                _no_proof_needed(rep.ctl)
        world.gating = True
        return world

    async def _add_replica(self, name: str) -> None:
        elector = Elector()
        extra = dict(self.scenario.config)
        key = (self.kind.name, repr(sorted(extra.items())))
        settings = _CONFIGS.get(key)
        if settings is None:
            settings = _CONFIGS[key] = config(self.kind, **extra)
        # the controller is built on the stepped client, so that every part it gives the
        # client to (the patcher and settler hold their own reference) is stepped
        client = SteppedClient(self)
        ctl = Controller(settings, client, REGISTRY, clock=self.clock)  # type: ignore[arg-type]
        replica = client.replica = Replica(name, ctl, elector)

        def decided(key: Any, decision: Any) -> None:
            at = (replica.horizon, tuple(replica.served))
            replica.decided.update((r.pod.name, at) for r in decision.releases)

        ctl.reconciler.on_decision = decided
        ctl.state.leading = lambda: elector.is_leader
        freshness = getattr(ctl.state, "freshness", None)
        if freshness is not None and hasattr(freshness, "term_start"):
            freshness.term_start = lambda: _term_start(elector)
        ctl.notices.on_foreign_release = lambda pod: replica.reports.append(
            (pod.name, "list" if replica.listing else "watch")
        )
        await ctl.start()
        replica.listing = True
        for r in ctl.reflectors:
            await r.relist()
        replica.listing = False
        replica.cursors = [len(self.fake.history)] * len(ctl.reflectors)
        self.replicas.append(replica)

    def replica(self, name: str) -> Replica:
        return next(r for r in self.replicas if r.name == name)

    def keys(self) -> list[OwnerKey]:
        return [
            OwnerKey(NAMESPACE, oracles.owner_uid(self, owner))
            for owner in self.owners
            if oracles.owner_uid(self, owner)
        ]

    # -- the choice points -------------------------------------------------------------------------

    def enabled(self) -> list[Action]:
        out: list[Action] = []
        b = self.bounds
        if self.story_at < len(self.scenario.story):
            out.append(Action("story", (self.scenario.story[self.story_at][0],)))
        for rep in self.replicas:
            for i, r in enumerate(rep.reflectors):
                pending = self._pending(rep, i)
                plural = r.resource.plural
                if pending:
                    out.append(Action("deliver", (rep.name, plural)))
                    if pending > 1 and self.partials < b.partial:
                        out.append(Action("deliver-one", (rep.name, plural)))
                elif self.scenario.bookmarks and _rv(r.resource_version) < self.fake.rv:
                    out.append(Action("bookmark", (rep.name, plural)))
                if self.relists < b.relists and self.scenario.relists:
                    out.append(Action("relist", (rep.name, plural)))
            if rep.task is None and rep.working and rep.elector.is_leader:
                for owner in self.scenario.reconciled(self):
                    out.append(Action("reconcile", (rep.name, owner)))
                    if b.pauses:
                        out.append(Action("reconcile-pausing", (rep.name, owner)))
                    if b.pauses and self.scenario.to_patch:
                        out.append(Action("reconcile-to-patch", (rep.name, owner)))
            if rep.task is not None and rep.requests:
                out.append(Action("resume", (rep.name,)))
                if rep.pauses < b.pauses:
                    out.append(Action("step", (rep.name,)))
                head = rep.requests[0]
                if self.faults < b.faults:
                    if head.kind == "patch":
                        out.append(Action("time-out", (rep.name,)))
                    else:
                        out.append(Action("read-fails", (rep.name,)))
                        out.append(Action("read-times-out", (rep.name,)))
                if self.cancels < b.cancels:
                    out.append(Action("cancel", (rep.name,)))
            if rep.elector.is_leader and not rep.working:
                out.append(Action("workers-start", (rep.name,)))
            if (
                not rep.elector.is_leader
                and self.leader_changes < b.leader_changes
                and self.scenario.handover
            ):
                out.append(Action("lead", (rep.name,)))
        out.extend(Action("land", (i,)) for i in range(len(self.late)))
        if self.expiries < b.expiries and any(_waits_on_time(rep) for rep in self.replicas):
            out.append(Action("expire"))
        return out

    async def step(self, action: Action) -> None:
        self.trace.append(str(action))
        name, args = action.name, action.args
        rep = (
            self.replica(args[0]) if args and isinstance(args[0], str) and name != "story" else None
        )
        if name == "story":
            _, write = self.scenario.story[self.story_at]
            self.story_at += 1
            write(self)
        elif name == "deliver":
            assert rep is not None
            self._deliver(rep, _index(rep, args[1]))
        elif name == "deliver-one":
            assert rep is not None
            self.partials += 1
            self._deliver(rep, _index(rep, args[1]), first_only=True)
        elif name == "relist":
            assert rep is not None
            self.relists += 1
            await self._relist(rep, _index(rep, args[1]))
        elif name == "bookmark":
            assert rep is not None
            r = rep.reflectors[_index(rep, args[1])]
            r.apply(
                {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": str(self.fake.rv)}}}
            )
        elif name in ("reconcile", "reconcile-pausing", "reconcile-to-patch"):
            assert rep is not None
            pause = {"reconcile": False, "reconcile-pausing": True}.get(name, "patch")
            await self._reconcile(rep, args[1], pausing=pause)
        elif name == "resume":
            assert rep is not None
            await self._run_on(rep, pause=False)
        elif name == "step":
            assert rep is not None
            rep.pauses += 1
            await self._answer(rep, rep.requests.pop(0))
            await self._run_on(rep, pause=True)
        elif name == "time-out":
            assert rep is not None
            req = rep.requests.pop(0)
            self.faults += 1
            self.late.append(req)
            req.answer.set_exception(TimeoutError("the client gave up (explorer)"))
            await self._run_on(rep, pause=False)
        elif name in ("read-fails", "read-times-out"):
            assert rep is not None
            req = rep.requests.pop(0)
            self.faults += 1
            exc: Exception = (
                ApiError(500, "the API server failed the read (explorer)")
                if name == "read-fails"
                else TimeoutError("the read timed out (explorer)")
            )
            req.answer.set_exception(exc)
            await self._run_on(rep, pause=False)
        elif name == "cancel":
            assert rep is not None
            self.cancels += 1
            await self._cancel(rep)
        elif name == "land":
            req = self.late.pop(args[0])
            try:
                patched = await req.call()
            except Exception:  # refused at landing: the server changed meanwhile
                pass
            else:
                self._landed(req, patched)
        elif name == "expire":
            self.expiries += 1
            self.clock.now += EXPECTATIONS_TIMEOUT + 1
        elif name == "lead":
            assert rep is not None
            for other in self.replicas:
                other.elector.is_leader = False
            self.leader_changes += 1
            self._lease_write()
            self._lead(rep)
        elif name == "workers-start":
            assert rep is not None
            self._work(rep)
        else:
            raise ValueError(name)
        await _settle()
        for other in self.replicas:
            if other.task is not None and other.task.done():
                self._ended(other)  # an admission this step delivered cut its reads short
        oracles.check_reports(self)

    # -- the parts of a step -----------------------------------------------------------------------

    def _events(self, rep: Replica, i: int) -> list[tuple[int, dict[str, Any]]]:
        r = rep.reflectors[i]
        out = []
        for at, entry in enumerate(self.fake.history[rep.cursors[i] :], rep.cursors[i]):
            event = self._event(r, entry)
            if event is not None:
                out.append((at, event))
        return out

    def _pending(self, rep: Replica, i: int) -> int:
        return len(self._events(rep, i))

    @staticmethod
    def _event(r: Reflector[Any], entry: Any) -> dict[str, Any] | None:
        _, rkey, ns, etype, obj, old = entry
        if rkey != (r.resource.group, r.resource.plural):
            return None
        if r.namespace is not None and r.namespace != ns:
            return None
        return FakeKube._event_for(r.label_selector, etype, obj, old)

    def _deliver(self, rep: Replica, i: int, first_only: bool = False) -> None:
        r = rep.reflectors[i]
        for at, event in self._events(rep, i):
            r.apply(event)
            rep.cursors[i] = at + 1
            if first_only:
                return
        rep.cursors[i] = len(self.fake.history)

    async def _relist(self, rep: Replica, i: int) -> None:
        """410 Gone: the reflector lists afresh and replaces its store (a cached object the
        list lacks goes with the last state the cache held, as client-go's relist does)."""
        gating, self.gating = self.gating, False
        rep.listing = True
        try:
            await rep.reflectors[i].relist()
        finally:
            rep.listing = False
            self.gating = gating
        rep.cursors[i] = len(self.fake.history)

    async def _reconcile(self, rep: Replica, owner: str, pausing: bool | str) -> None:
        key = OwnerKey(NAMESPACE, oracles.owner_uid(self, owner))
        rep.key, rep.began, rep.pauses = key, len(self.trace), 0
        rep.horizon = rep.began_rv = self.fake.rv
        self.reconciles += 1
        rep.reconcile = self.reconciles
        rep.served = []
        rep.sent, rep.unsent_before = set(), rep.ctl.state.ledger.uncertain_pods()
        rep.decided = {}

        async def run() -> None:
            # a failed read is what the worker retries with backoff; the reconcile returns its
            # other outcomes, so anything else raised is a bug and ends the run
            with contextlib.suppress(ApiError, OSError, TimeoutError):
                await rep.ctl.reconciler.reconcile(key)

        rep.task = asyncio.get_running_loop().create_task(run())
        await self._run_on(rep, pause=pausing)

    async def _answer(self, rep: Replica, req: Request) -> None:
        try:
            result = await req.call()
        except Exception as exc:
            self._served(rep, req)
            req.answer.set_exception(exc)
            return
        self._served(rep, req)
        req.answer.set_result(result)
        self._landed(req, result)

    def _served(self, rep: Replica, req: Request) -> None:
        """A request of the running reconcile was served: a read (GET, LIST) moves what the
        replica could know up to now (``oracles.Rules.unknowable``); a patch tells it nothing
        of the bounds."""
        rep.served.append((req.what, self.fake.rv))
        if req.kind != "patch":
            rep.horizon = self.fake.rv

    def _landed(self, req: Request, patched: Any) -> None:
        if req.sent is None:
            return
        meta = (patched or {}).get("metadata") or {}
        gates = [g["name"] for g in (patched or {}).get("spec", {}).get("schedulingGates") or []]
        if oracles.GATE not in gates:
            self.ours.setdefault(str(meta.get("name")), int(meta.get("resourceVersion") or 0))
            self.released_by.setdefault(str(meta.get("name")), req.sent.reconcile)
            self.landed += 1
            oracles.judge(self, req.sent, f"{req.sent.replica}'s {req.what}")

    async def _run_on(self, rep: Replica, pause: bool | str) -> None:
        """Answer the reconcile's requests in order until it ends, or (``pause``) until its
        next request is out (left for a later step); ``pause="patch"``: until its next
        request is a patch (its reads answered as they come)."""
        for _ in range(MAX_REQUESTS):
            await _settle()
            assert rep.task is not None
            if rep.task.done():
                self._ended(rep)
                return
            if not rep.requests:
                raise RuntimeError(f"{rep.name}: a reconcile waits on something not a request")
            if pause is True or (pause == "patch" and rep.requests[0].kind == "patch"):
                return
            await self._answer(rep, rep.requests.pop(0))
        raise RuntimeError(f"{rep.name}: more than {MAX_REQUESTS} requests in one reconcile")

    def _ended(self, rep: Replica) -> None:
        task, rep.task = rep.task, None
        rep.requests.clear()
        rep.key = None
        assert task is not None
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
        if not task.cancelled():
            _all_sent(rep)

    async def _cancel(self, rep: Replica) -> None:
        """The worker is cancelled (its term ended, or shutdown) while requests are out: a
        patch sent may still land later, or never."""
        assert rep.task is not None
        for req in rep.requests:
            if req.kind == "patch":
                self.late.append(req)
        rep.task.cancel()
        await asyncio.gather(rep.task, return_exceptions=True)
        rep.task = None
        rep.requests.clear()
        rep.key = None
        await _settle()

    def _lease_write(self) -> None:
        self.fake.put(
            LEASES, {"metadata": {"name": f"lease-{self.fake.rv}", "namespace": "kube-system"}}
        )

    def _lead(self, rep: Replica) -> None:
        rep.elector.term = Term(self.leader_changes + 1, str(self.fake.rv))
        rep.elector.is_leader = True

    def _work(self, rep: Replica) -> None:
        """What ``Controller._lead`` does as the workers start (the term's start, for the new
        leader's proof)."""
        rep.working = True
        _begin_term(rep.ctl, _rv(rep.elector.term.resource_version))

    # -- liveness ----------------------------------------------------------------------------------

    async def quiesce(self) -> None:
        """The story told, every stream delivered, every request answered, a leader working;
        then rounds of reconciles of every owner, time passing (expectations expire, backoffs
        run out) between rounds. What stays releasable and gated after that is stuck
        (``oracles.check_liveness``)."""
        while self.story_at < len(self.scenario.story):
            _, write = self.scenario.story[self.story_at]
            self.story_at += 1
            write(self)
        self.late.clear()  # an unanswered patch never lands (it may, earlier: another path)
        for rep in self.replicas:
            if rep.task is not None:
                await self._run_on(rep, pause=False)
        leader = next((r for r in self.replicas if r.elector.is_leader), None)
        if leader is None:
            leader = self.replicas[-1]
            self._lease_write()
            self._lead(leader)
        if not leader.working:
            self._work(leader)
        for _ in range(self.bounds.rounds):
            self.clock.now += 60
            for rep in self.replicas:
                for i in range(len(rep.reflectors)):
                    self._deliver(rep, i)
            await _settle()
            for key in self.keys():
                owner = next(o for o in self.owners if oracles.owner_uid(self, o) == key.uid)
                await self._reconcile(leader, owner, pausing=False)
            oracles.check_reports(self)
            if not oracles.releasable(self):
                break  # nothing left to release: later rounds release nothing
        for rep in self.replicas:
            for i in range(len(rep.reflectors)):
                self._deliver(rep, i)
        await _settle()

    # -- what two executions that reach the same state share -------------------------------------

    def fingerprint(self) -> Any:
        """Everything that changes what happens next: the server's objects (by version), its
        history's length (the streams' backlogs are cursors into it), the story's position,
        the patches still to land, the bounds used, the clock, and every replica's state,
        dumped generically (``canonical``): its reflectors' stores and versions, the
        controller's ``State`` with every attribute, the elector, the reconcile running (the
        steps since it began: its locals are not comparable, so two are merged only when they
        began and went alike) and the reports it made."""
        objects = tuple(
            sorted((k, o["metadata"]["resourceVersion"]) for k, o in self.fake.objects.items())
        )
        reps = tuple(_replica_state(rep, self.trace) for rep in self.replicas)
        return (
            objects,
            len(self.fake.history),
            reps,
            self.story_at,
            tuple((r.what, r.sent) for r in self.late),
            self.faults,
            self.expiries,
            self.leader_changes,
            self.cancels,
            self.relists,
            self.partials,
            self.clock.now,
            tuple(sorted(self.ours.items())),
            _released_together(self.released_by),
        )

    async def close(self) -> None:
        for rep in self.replicas:
            if rep.task is not None:
                rep.task.cancel()
                for req in rep.requests:
                    if not req.answer.done():
                        req.answer.cancel()
                await asyncio.gather(rep.task, return_exceptions=True)
            rep.ctl.state.queue.shut_down()


#: ``State`` attributes that only report (counters, the last decisions, metrics, the trace,
#: the moments pods became releasable), and what the explorer drives itself (the work queue:
#: the explorer, not the queue, picks which owner is reconciled when): left out of the
#: fingerprint. Everything else, present or added later, is in it.
OUTPUT_ONLY = frozenset(
    {"stats", "decisions", "trace", "metrics", "events", "releasable", "queue", "config"}
)
#: Objects of these modules are wiring (plugins, clients, locks, the loop), not state.
_WIRING = ("pluggy", "ungater._plugins", "asyncio", "anyio", "logging", "threading", "tests.")


def canonical(value: Any, memo: dict[int, Any] | None = None) -> Any:
    """A hashable, order-independent dump of ``value``: every attribute of every object
    reachable from it (dataclasses, slots, plain objects), dicts and sets as frozensets,
    callables and wiring left out. ``memo`` (by object id, for one dump: an object shared by
    two indexes is walked once) must not outlive the objects."""
    if value is None or isinstance(value, bool | int | float | str | bytes):
        return value
    memo = {} if memo is None else memo
    key = id(value)
    if key in memo:
        return memo[key]
    memo[key] = "<cycle>"  # until done: a reference back to an object being dumped
    memo[key] = out = _dump(value, memo)
    return out


def _dump(value: Any, memo: dict[int, Any]) -> Any:
    if isinstance(value, enum.Enum):
        return str(value)
    if isinstance(value, dict):  # order-independent without sorting: a frozenset of pairs
        return (
            "dict",
            frozenset((canonical(k, memo), canonical(v, memo)) for k, v in value.items()),
        )
    if isinstance(value, set | frozenset):
        return ("set", frozenset(canonical(v, memo) for v in value))
    if isinstance(value, list | tuple) or type(value).__name__ == "deque":
        return tuple(canonical(v, memo) for v in value)
    if callable(value) and not hasattr(value, "__dict__") and not hasattr(value, "__slots__"):
        return "<callable>"
    kind = type(value)
    if (kind.__module__ or "").startswith(_WIRING) or isinstance(value, type):
        return f"<{kind.__name__}>"
    if hasattr(value, "__dict__") or hasattr(kind, "__slots__"):
        attrs = []
        for name in _attributes(value):
            try:
                attr = getattr(value, name)
            except AttributeError:
                continue
            if callable(attr) and not hasattr(attr, "__dict__"):
                continue
            attrs.append((name, canonical(attr, memo)))
        return (kind.__name__, tuple(attrs))
    return repr(value)


_SLOTS: dict[type, tuple[str, ...]] = {}


def _attributes(value: Any) -> list[str]:
    kind = type(value)
    slots = _SLOTS.get(kind)
    if slots is None:
        names: list[str] = []
        for klass in kind.__mro__:
            names.extend(s for s in getattr(klass, "__slots__", ()) if s not in names)
        slots = _SLOTS[kind] = tuple(names)
    names = [*getattr(value, "__dict__", {}), *slots]
    return [n for n in names if not n.startswith("__") and n not in OUTPUT_ONLY]


def _replica_state(rep: Replica, trace: list[str]) -> Any:
    memo: dict[int, Any] = {}
    stores = tuple(
        (r.resource_version, canonical(r.store, memo), r.label_selector) for r in rep.reflectors
    )
    running = None
    if rep.task is not None:
        running = (str(rep.key), tuple(trace[rep.began :]), tuple(q.what for q in rep.requests))
    return (
        stores,
        tuple(rep.cursors),
        canonical(rep.ctl.state, memo),
        rep.elector.is_leader,
        None if rep.elector.term is None else rep.elector.term.resource_version,
        rep.working,
        running,
        tuple(rep.reports),
    )


def _waits_on_time(rep: Replica) -> bool:
    """Whether time passing may change what ``rep`` does next: it holds expectations (or a
    controller without them: always)."""
    expectations = getattr(rep.ctl, "expectations", None)
    return expectations is None or len(expectations) > 0


def _index(rep: Replica, plural: str) -> int:
    return next(i for i, r in enumerate(rep.reflectors) if r.resource.plural == plural)


def _rv(value: str) -> int:
    return int(value) if value.isdigit() else 0


def _released_together(released_by: dict[str, int]) -> frozenset[frozenset[str]]:
    """Which pods one reconcile released, whatever the reconciles' numbers (the oracle's
    ``unknowable`` rule reads it; the numbering differs between equal states)."""
    groups: dict[int, set[str]] = {}
    for pod, n in released_by.items():
        groups.setdefault(n, set()).add(pod)
    return frozenset(frozenset(g) for g in groups.values())


def _term_start(elector: Elector) -> int:
    """Where a replica's term began, from the moment it leads."""
    return _rv(elector.term.resource_version) if elector.term is not None else 0


def _begin_term(ctl: Controller, rv: int) -> None:
    """A term starts (what ``Controller._lead`` does before its workers run), for whichever
    hook the controller has."""
    freshness = getattr(ctl.state, "freshness", None)
    begin = getattr(freshness, "begin_term", None) or getattr(ctl.state, "begin_term", None)
    if begin is not None:
        begin(rv)


def _no_proof_needed(ctl: Controller) -> None:
    """The replica led before anything happened: no term proof is owed."""
    freshness = getattr(ctl.state, "freshness", None)
    for name in ("confirmed", "proven"):  # "proven" before issue 42 (``--against`` older code)
        if freshness is not None and hasattr(freshness, name):
            setattr(freshness, name, None)


async def _settle() -> None:
    """Let every task run until all wait on something only the explorer gives (a request's
    answer): the loop has no callback ready (at most ``SETTLE_TURNS`` turns)."""
    loop = asyncio.get_running_loop()
    for _ in range(SETTLE_TURNS):
        await asyncio.sleep(0)
        if not loop._ready:  # type: ignore[attr-defined]  # asyncio's run queue
            return
    raise RuntimeError(f"the controller's tasks did not settle in {SETTLE_TURNS} loop turns")


__all__: Sequence[str] = ["JOB", "Action", "Bounds", "Violation", "World", "canonical"]


def _all_sent(rep: Replica) -> None:
    """A reconcile that ended on its own sent a patch for every release it put in the ledger
    as unanswered: one it never sent would count in flight, holding its slot, until settled
    (the stall of a wave cancelled before its patches left)."""
    ledger = rep.ctl.state.ledger
    unsent = sorted(
        u.name
        for uid in ledger.uncertain_pods() - rep.unsent_before
        if (u := ledger.uncertain(uid)) is not None and u.name not in rep.sent
    )
    if unsent:
        raise oracles.Violation(f"{rep.name}: a reconcile ended with releases never sent: {unsent}")
