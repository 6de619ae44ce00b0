"""Which kinds release now: ``mode: auto`` follows the gate guard.

Two releasers on one gate break the cap, and every Kueue from v0.17.1 that makes slices removes
its own gate (``SELF_RELEASED_GATES``) with a 1 s batching that wins most races, so the
stand-down after foreign removals may never trip. Under ``auto`` a kind on such a gate releases
only while the gate guard (``ungater._kube.gateguard``) finds an admission policy refusing Kueue that
gate, and audits otherwise; each re-check may switch it. A kind on any other gate releases.
Explicit ``release`` and ``audit`` are kept as set. ``effective_mode`` is pure; ``ModeSwitch``
applies it to the running kinds after each check and says so, once per switch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ungater._controller.state import KindRuntime, State
from ungater._decide.assess import owner_of
from ungater._kube.kueue import SELF_RELEASED_GATES

__all__ = ["HOW_TO_RELEASE", "Effective", "ModeSwitch", "effective_mode"]

log = logging.getLogger("ungater.controller")

HOW_TO_RELEASE = (
    "to release it, install the shipped admission policy (helm --set "
    "admissionPolicy.enabled=true, or deploy/manifests/optional/admission-policy.yaml), or use "
    "a gate of your own, or set mode: release explicitly (at your own risk: two releasers on "
    "one gate break the cap)"
)


@dataclass(frozen=True, slots=True)
class Effective:
    mode: str  # release | audit: what the kind does now
    why: str


def effective_mode(configured: str, gate: str, guard: str | None, checks_on: bool) -> Effective:
    """The mode a kind runs in: ``configured`` as set; ``guard`` the gate's last verdict
    (``guarded``, ``unguarded``, ``unknown``; None before the first check); ``checks_on``:
    ``policyCheckIntervalSeconds`` > 0."""
    if configured != "auto":
        return Effective(configured, f"mode: {configured}")
    if gate not in SELF_RELEASED_GATES:
        return Effective("release", f"mode: auto; Kueue does not release gate {gate}")
    kueues = f"mode: auto; Kueue releases gate {gate} itself"
    if not checks_on:
        return Effective(
            "audit", f"{kueues}, and policyCheckIntervalSeconds: 0 turns the guard check off"
        )
    if guard == "guarded":
        return Effective("release", f"{kueues}, and an admission policy refuses it to Kueue")
    if guard == "unguarded":
        return Effective("audit", f"{kueues}, and no admission policy refuses it to Kueue")
    return Effective("audit", f"{kueues}, and the admission policies could not be read yet")


class ModeSwitch:
    """Keeps each ``auto`` kind's ``rt.mode`` in step with the gate guard's last verdict."""

    def __init__(self, state: State) -> None:
        self.s = state
        self.checks_on = state.config.policy_check_interval_seconds > 0
        self.announced = False  # the first lines come from ``announce`` at start-up

    def current(self, rt: KindRuntime) -> Effective:
        st = self.s.guard.status.get(rt.gate)
        return effective_mode(rt.configured, rt.gate, st.state if st else None, self.checks_on)

    def follow(self) -> None:
        """After a guard check: switch the ``auto`` kinds whose verdict changed, re-decide
        their owners at once and say why. A kind that stood down stays in audit."""
        for kind, rt in self.s.kinds.items():
            if rt.configured != "auto" or rt.stood_down:
                continue
            new = self.current(rt)
            if new.mode == rt.mode:
                rt.why = new.why
                continue
            rt.mode, rt.why = new.mode, new.why
            if self.announced:
                self._say(str(kind), rt, switched=True)
            for key in self.s.workloads.owner_keys():
                o = owner_of(self.s.workloads.for_owner(key.uid))
                if o is not None and o.group_kind == kind:
                    if new.mode == "release":
                        self.s.auditor.forget(key)  # its findings were about the other releaser
                    self.s.queue.add(key)

    def announce(self) -> None:
        """At start-up, one line per ``auto`` kind on Kueue's gate saying what it does and why,
        and a warning per explicit ``release`` of that gate with no policy guarding it."""
        self.follow()
        self.announced = True
        for kind, rt in self.s.kinds.items():
            if rt.configured == "auto" and rt.gate in SELF_RELEASED_GATES:
                self._say(str(kind), rt, switched=False)
            st = self.s.guard.status.get(rt.gate)
            if (
                rt.configured == "release"
                and rt.gate in SELF_RELEASED_GATES
                and (st is None or st.state != "guarded")
            ):
                sd = self.s.config.stand_down
                log.warning(
                    "%s: mode: release is set explicitly for gate %s, which Kueue releases "
                    "itself, and no admission policy guarding it was found (%s): two releasers "
                    "on one gate break the cap; standDown.action %s applies after %d foreign "
                    "releases; install the admission policy or use mode: auto (docs/config.md)",
                    kind,
                    rt.gate,
                    st.state if st else "not checked: policyCheckIntervalSeconds is 0",
                    sd.action,
                    sd.foreign_releases,
                )

    def _say(self, kind: str, rt: KindRuntime, switched: bool) -> None:
        verb = "switches to" if switched else "runs in"
        if rt.mode == "release":
            log.info("%s %s release mode: %s", kind, verb, rt.why)
        else:
            log.warning(
                "%s %s audit mode (never patches): %s; %s", kind, verb, rt.why, HOW_TO_RELEASE
            )
