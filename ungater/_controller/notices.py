"""What the controller tells operators when it cannot serve an owner as asked.

Log lines, rate-limited Events and metrics for pods that stay gated (pod set update conflicts,
stale ProvisioningRequests, unmapped pods outside a slice hand-over, releases refused for
good), for a gate removed by someone else, and the stand-down that follows when that repeats;
and the lines ``/readyz`` shows beside "ok". Called from the event handlers, the reconciler and
the controller; it reads the shared ``State`` and moves its queue, nothing more.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from ungater._controller.modes import ModeSwitch
from ungater._controller.state import KindRuntime, State
from ungater._decide.assess import owner_of
from ungater._decide.decision import (
    WAIT_CONFLICT,
    WAIT_REFUSED,
    WAIT_UNRESOLVED,
    Decision,
    Release,
)
from ungater._decide.indexes import OwnerKey
from ungater._decide.standdown import Tripped
from ungater._model.views import PodView
from ungater._observe.events import (
    FOREIGN_RELEASE,
    PODS_UNMAPPED,
    RELEASE_BLOCKED,
    STALE_PROVISIONING_REQUEST,
    STOOD_DOWN,
    WARNING,
)

__all__ = ["POD_SET_UPDATE_CONFLICT", "Notices"]

#: Why a pod the cap allows can stay gated: what ``ungater_stalled_pods`` counts, beside the
#: pods a decision chose (a release that keeps failing is chosen again each time).
STALL_CODES = frozenset({WAIT_REFUSED, WAIT_CONFLICT, WAIT_UNRESOLVED})

log = logging.getLogger("ungater.controller")  # the controller's voice, as before
POD_SET_UPDATE_CONFLICT = "PodSetUpdateConflict"


class Notices:
    def __init__(self, state: State) -> None:
        self.c = state
        self._inactive_since: dict[OwnerKey, float] = {}  # chains seen without an active slice
        self.modes = ModeSwitch(state)  # mode: auto follows each guard check
        state.guard.on_refresh = self.modes.follow
        #: Called with every pod shown released by another writer (each time it is shown,
        #: before the once-per-pod report): what tests and tools watch it through.
        self.on_foreign_release: Callable[[PodView], None] | None = None
        state.forgetters.append(self._forget)

    def _forget(self, key: OwnerKey) -> None:
        self._inactive_since.pop(key, None)

    # -- pods that stay gated ------------------------------------------------------------------

    def stuck(self, key: OwnerKey, decision: Decision) -> float | None:
        """Warn (log line and rate-limited Event) about pods that cannot be released as is,
        and date the owner's releasable pods that stay gated (``ungater_stalled_pods``);
        seconds after which to look at the owner again, if a warning waits for a grace."""
        c = self.c
        rt = c.kind_of(key)
        if rt is not None:
            held = sum(1 for r in decision.pod_sets for w in r.waiting if w.code in STALL_CODES)
            c.stalls.observe(key, str(rt.kind), held + len(decision.releases))
        conflicts = [
            w
            for r in decision.pod_sets
            for w in r.waiting
            if w.reason.startswith("pod set update conflict")
        ]
        for w in conflicts:
            log.warning("%s: pod %s stays gated: %s", c.describe(key), w.pod, w.reason)
        if conflicts:
            first = conflicts[0]
            c.event_for(
                key,
                WARNING,
                POD_SET_UPDATE_CONFLICT,
                f"{len(conflicts)} pod(s) stay gated; {first.pod}: {first.reason}",
            )
        stale = [n for r in decision.pod_sets for n in r.stale]
        if stale:
            reason = next(
                w.reason for r in decision.pod_sets for w in r.waiting if w.pod == stale[0]
            )
            log.warning(
                "%s: %d pod(s) stay gated; %s: %s", c.describe(key), len(stale), stale[0], reason
            )
            c.event_for(
                key,
                WARNING,
                STALE_PROVISIONING_REQUEST,
                f"{len(stale)} gated pod(s) stay gated and uncounted; {stale[0]}: {reason}",
            )
        if decision.active_slice is not None:
            self._inactive_since.pop(key, None)
        elif decision.unmapped:
            # Kueue finishes a replaced slice a few ms before it admits the next one: a chain
            # without an active slice for less than the grace is a hand-over, not an anomaly
            now = c.clock()
            since = self._inactive_since.setdefault(key, now)
            left = c.config.slice_handover_grace_seconds - (now - since)
            if left > 0:
                return left
        if decision.unmapped:
            first = decision.unmapped[0]
            c.event_for(
                key,
                WARNING,
                PODS_UNMAPPED,
                f"{len(decision.unmapped)} gated pod(s) cannot be mapped; {first.pod}: {first.reason}",
            )
        return None

    def blocked(self, key: OwnerKey, rt: KindRuntime, refused: Sequence[Release]) -> None:
        """Releases refused for good: warn once per refusal (rate-limited Events)."""
        c = self.c
        for r in refused:
            entry = c.blocked.get(r.pod.uid)
            if entry is None:
                continue
            reason = entry.reason(c.blocked.clock())
            log.warning(
                "pod %s/%s of %s stays gated: %s",
                r.pod.namespace,
                r.pod.name,
                rt.kind,
                reason,
                extra={"pod_set": r.pod_set},
            )
            if c.metrics is not None:
                c.metrics.observe_release_blocked(str(rt.kind))
            c.event_for(key, WARNING, RELEASE_BLOCKED, f"pod {r.pod.name}: {reason}")

    # -- another releaser ----------------------------------------------------------------------

    def foreign_release(self, pod: PodView, rt: KindRuntime, first: bool) -> None:
        """Our gate was removed from ``pod`` by another writer: warn, count, maybe stand down;
        ``first``: the ledger had not noted it yet (it is reported once per pod, whichever
        watch or refused patch shows it again)."""
        c = self.c
        if self.on_foreign_release is not None:
            self.on_foreign_release(pod)
        gate = rt.gate
        if not first:
            return
        c.stats.foreign_releases += 1
        if c.metrics is not None:
            c.metrics.observe_foreign_release()
        ctrl = pod.controller
        for key in c.owners_of(pod.namespace, ctrl.uid if ctrl else None):
            message = f"gate {gate} was removed from pod {pod.name} by another writer"
            c.event_for(key, WARNING, FOREIGN_RELEASE, message)
        log.warning(
            "gate %s was removed from pod %s/%s by someone else: another releaser owns this "
            "gate, and the cap can no longer be guaranteed",
            gate,
            pod.namespace,
            pod.name,
        )
        verdict = c.stand_down.record(str(rt.kind), gate, f"{pod.namespace}/{pod.name}")
        if verdict is not None:
            self._stand_down(rt, verdict)

    def _stand_down(self, rt: KindRuntime, verdict: Tripped) -> None:
        """Another releaser is at work on this kind's gate: say so loudly and, unless told to
        keep fighting, stop patching (audit instead) or end the process."""
        c = self.c
        log.error("standing down: %s", verdict.message)
        if verdict.action == "keepReleasing":
            return
        keys = [
            k
            for k in c.workloads.owner_keys()
            if (o := owner_of(c.workloads.for_owner(k.uid))) is not None and o.group_kind == rt.kind
        ]
        for key in keys:
            c.event_for(key, WARNING, STOOD_DOWN, verdict.message)
        if verdict.action == "exit":
            c.fatal_error = verdict.message
            if c.stop is not None:
                c.stop.set()
            return
        rt.mode, rt.stood_down = "audit", verdict.message
        resume = c.stand_down.resume_at(str(rt.kind))
        if resume is not None:
            wait = max(resume - c.stand_down.clock(), 0.0)
            log.error(
                "%s stands back up in %.0f s if no other writer removes its gate", rt.kind, wait
            )
        for key in keys:
            c.queue.add(key)  # audit them now
            if resume is not None:
                c.queue.add_after(key, wait + 0.01)  # and look again when it may resume

    def stand_up_if_due(self, rt: KindRuntime) -> float | None:
        """A kind that stood down releases again once no other writer has removed its gate for
        ``standDown.resumeAfterSeconds``; until then, the seconds left (the owner at hand is
        looked at again then). Standing up queues every owner of the kind, as an event would."""
        c = self.c
        kind = str(rt.kind)
        resume = c.stand_down.resume_at(kind)
        if resume is None:
            return None
        wait = resume - c.stand_down.clock()
        if wait > 0:
            return wait + 0.01
        c.stand_down.resume(kind)
        rt.stood_down = ""
        rt.mode = self.modes.current(rt).mode
        log.warning(
            "%s stands back up (%s mode): no other writer removed gate %s for %g s",
            kind,
            rt.mode,
            rt.gate,
            c.config.stand_down.resume_after_seconds,
        )
        for k in c.workloads.owner_keys():
            o = owner_of(c.workloads.for_owner(k.uid))
            if o is not None and o.group_kind == rt.kind:
                c.auditor.forget(k)
                c.queue.add(k)
        return None

    def startup(self) -> None:
        """Say which kinds audit for want of a guard (``mode: auto``), and warn for each explicit
        ``mode: release`` of Kueue's own gate with no policy guarding it."""
        self.modes.announce()

    def status_lines(self) -> list[str]:
        """What ``/readyz`` says beside "ok": each kind's mode and why (``mode: auto``), why it
        stood down, and whether an admission policy guards each gate."""
        lines = []
        for kind, rt in self.c.kinds.items():
            line = f"{kind}: {rt.mode} (gate {rt.gate})"
            if rt.why and rt.why != f"mode: {rt.mode}":
                line += f"; {rt.why}"
            if rt.stood_down:
                line += f"; STOOD DOWN: {rt.stood_down}"
            lines.append(line)
        lines.extend(st.line for st in self.c.guard.status.values())
        return lines
