"""Is our gate guarded against the other releaser? A look at the cluster's admission policies.

Every Kueue that makes Workload slices also removes ``kueue.x-k8s.io/elastic-job`` itself. A
ValidatingAdmissionPolicy that refuses, for Kueue's service account only, a pod update removing
that gate (shipped in the chart, ``admissionPolicy.enabled``) makes ungater its only releaser.
This module finds such policies: a ``ValidatingAdmissionPolicy`` annotated
``ungater.dev/guards-gate: <gate>`` (the chart's carries it; annotate your own the same way)
with at least one binding that denies (``validationActions`` holds ``Deny``). The verdict per
gate is ``guarded``, ``unguarded`` or ``unknown`` (the policies could not be read). The
controller checks at start-up and every ``admissionPolicy.checkIntervalSeconds``, and reports
it in ``/readyz``, ``ungater_gate_guarded{gate}`` and ``explain``; ``mode: auto`` releases
Kueue's gate only while it is guarded (``ungater._controller.modes``). ``assess_guards`` is pure.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio

from ungater._kube.client import ApiError, KubeClient, Resource

__all__ = [
    "BINDINGS",
    "GUARDS_GATE_ANNOTATION",
    "POLICIES",
    "GateGuard",
    "GuardStatus",
    "assess_guards",
    "check_guards",
]

log = logging.getLogger("ungater.guard")

GUARDS_GATE_ANNOTATION = "ungater.dev/guards-gate"
POLICIES = Resource(
    "admissionregistration.k8s.io", "v1", "validatingadmissionpolicies", "ValidatingAdmissionPolicy"
)
BINDINGS = Resource(
    "admissionregistration.k8s.io",
    "v1",
    "validatingadmissionpolicybindings",
    "ValidatingAdmissionPolicyBinding",
)
GUARDED, UNGUARDED, UNKNOWN = "guarded", "unguarded", "unknown"


@dataclass(frozen=True, slots=True)
class GuardStatus:
    gate: str
    state: str  # guarded | unguarded | unknown
    policies: tuple[str, ...] = ()
    detail: str = ""

    @property
    def line(self) -> str:
        if self.state == GUARDED:
            return f"gate {self.gate}: guarded by {', '.join(self.policies)}"
        if self.state == UNKNOWN:
            return f"gate {self.gate}: guard unknown ({self.detail})"
        return f"gate {self.gate}: not guarded (another releaser, e.g. Kueue, may remove it too)"


def assess_guards(
    gates: Iterable[str],
    policies: Sequence[Mapping[str, Any]],
    bindings: Sequence[Mapping[str, Any]],
) -> dict[str, GuardStatus]:
    """Per gate: the policies that guard it (annotated for it, bound with Deny)."""
    denying = {
        str((b.get("spec") or {}).get("policyName") or "")
        for b in bindings
        if "Deny" in ((b.get("spec") or {}).get("validationActions") or ())
    }
    out: dict[str, GuardStatus] = {}
    for gate in gates:
        names = sorted(
            str(p["metadata"]["name"])
            for p in policies
            if ((p.get("metadata") or {}).get("annotations") or {}).get(GUARDS_GATE_ANNOTATION)
            == gate
            and p["metadata"].get("name") in denying
        )
        out[gate] = GuardStatus(gate, GUARDED if names else UNGUARDED, tuple(names))
    return out


async def check_guards(client: KubeClient, gates: Iterable[str]) -> dict[str, GuardStatus]:
    """Read the policies and bindings; ``unknown`` for every gate if they cannot be read."""
    wanted = sorted(set(gates))
    try:
        policies, _ = await client.list_objects(POLICIES, None)
        bindings, _ = await client.list_objects(BINDINGS, None)
    except (ApiError, OSError, TimeoutError) as exc:
        why = f"cannot read ValidatingAdmissionPolicies: {exc}"
        return {g: GuardStatus(g, UNKNOWN, detail=why) for g in wanted}
    return assess_guards(wanted, policies, bindings)


class GateGuard:
    """The latest verdict per gate, refreshed every ``interval`` seconds by ``run()``."""

    def __init__(self, client: KubeClient, gates: Iterable[str], interval: float) -> None:
        self.client = client
        self.gates = sorted(set(gates))
        self.interval = interval
        self.status: dict[str, GuardStatus] = {}
        self.checks = 0
        self.on_refresh: Callable[[], None] | None = None  # after each check (mode: auto)

    async def refresh(self) -> dict[str, GuardStatus]:
        fresh = await check_guards(self.client, self.gates)
        for gate, st in fresh.items():
            old = self.status.get(gate)
            if old is None or (old.state, old.policies) != (st.state, st.policies):
                level = logging.INFO if st.state == GUARDED else logging.WARNING
                log.log(level, "admission policy check: %s", st.line)
        self.status = fresh
        self.checks += 1
        if self.on_refresh is not None:
            self.on_refresh()
        return fresh

    async def run(self) -> None:
        """Refresh every ``interval`` seconds (at once if never refreshed) until cancelled."""
        while True:  # until cancelled with the controller; one read per interval
            if self.checks:
                await anyio.sleep(self.interval)
            await self.refresh()
