"""``ungater explain``: read one Workload's owner from the cluster and print the decision.

It patches nothing. It runs the same assessment and decision the controller runs, on a fresh
read instead of the cache, so an operator sees exactly why each pod is still gated.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from ungater._controller.modes import HOW_TO_RELEASE, effective_mode
from ungater._decide.assess import owner_facts_of, owner_of, pod_facts, pod_selectors, via_objects
from ungater._decide.decision import Decision, PodFacts, active_slice, decide, order_slices
from ungater._decide.findings import Finding, audit_owner
from ungater._decide.refusals import PatchOutcome, classify_patch_error, server_message
from ungater._kube.client import PODS, ApiError, KubeClient, Resource, selector_text
from ungater._kube.gateguard import check_guards
from ungater._kube.kueue import KUEUE_GROUP, workload_resource
from ungater._model.config import Config, KindConfig
from ungater._model.errors import StartupError
from ungater._model.views import (
    Kind,
    ObjectRef,
    ObjectView,
    PodView,
    WorkloadView,
    parse_object,
    parse_pod,
    parse_workload,
)
from ungater._plugins.registry import KindHandler, PluginError, PluginRegistry

__all__ = [
    "ExplainError",
    "OwnerRead",
    "audit_read",
    "explain",
    "kind_config",
    "read_owner",
    "render_text",
    "workload_version",
]


class ExplainError(Exception):
    pass


async def workload_version(client: KubeClient, config: Config) -> str:
    """The first of ``config.workloadApiVersions`` the API server serves."""
    served = await client.served_versions(KUEUE_GROUP)
    version = next((v for v in config.workload_api_versions if v in served), None)
    if version is None:
        raise ExplainError("the API server serves no Kueue Workload API (is Kueue installed?)")
    return version


def kind_config(config: Config, kind: Kind) -> KindConfig | None:
    return next((k for k in config.kinds if Kind(k.group, k.kind) == kind), None)


@dataclass
class OwnerRead:
    """One owner as a fresh read shows it: what the decision and the audit need."""

    handler: KindHandler
    kind_config: KindConfig
    owner: ObjectRef
    namespace: str
    slices: list[WorkloadView]
    pods: list[PodView]
    facts: list[PodFacts]
    desired: Mapping[str, int] | None
    gate: str
    size_unknown: str = ""  # why the owner's size cannot be read (the controller then holds all)


async def read_owner(
    client: KubeClient,
    config: Config,
    registry: PluginRegistry,
    namespace: str,
    slices: list[WorkloadView],
    kc: KindConfig,
    objects: dict[str, ObjectView] | None = None,
) -> OwnerRead:
    """Read an owner's pods, intermediate owners (unless ``objects`` has them: a namespace's,
    shared by several owners) and owner object, and ask its plugin about each pod."""
    owner = owner_of(slices)
    assert owner is not None
    try:
        handler = registry.handler(owner.group_kind, kc.plugin)
    except LookupError as exc:
        raise StartupError(str(exc)) from exc
    if objects is None:
        objects = {}
        for spec in handler.spec.intermediates:
            found, _ = await client.list_objects(
                Resource(spec.group, spec.version, spec.plural, spec.kind),
                namespace,
                spec.label_selector,
            )
            objects.update((o.uid, o) for o in map(parse_object, found))
    unknown: list[str] = []  # why the owner's size cannot be read, as the controller says it
    via = handler.spec.select_via
    if via is not None:  # read with the plugin's facts: the owner's size lives there
        found, _ = await client.list_objects(
            Resource(via.group, via.version, via.plural, via.kind), namespace, via.label_selector
        )
        for raw in found:
            o = parse_object(raw)
            if o.controller is not None and o.controller.uid == owner.uid:
                try:
                    objects[o.uid] = replace(o, facts=dict(handler.owner_facts(raw)))
                except PluginError as exc:
                    unknown.append(f"{o.kind} {o.name}: {exc}")
    vias = via_objects(handler, owner, objects.values())
    owner_facts: dict[str, Any] = {}
    owner_spec = handler.spec.owner_resource
    if owner_spec is not None:
        res_owner = Resource(
            owner_spec.group, owner_spec.version, owner_spec.plural, owner_spec.kind
        )
        owner_obj = await client.get(res_owner, namespace, owner.name)
        if owner_obj is not None and (owner_obj.get("metadata") or {}).get("uid") == owner.uid:
            try:
                owner_facts = handler.owner_facts(owner_obj)
            except PluginError as exc:
                unknown.append(str(exc))
        else:
            unknown.append(f"{owner.kind} {owner.name} was not found")
    pods = []
    for selector in pod_selectors(handler, owner, vias):
        raw_pods, _ = await client.list_objects(PODS, namespace, selector_text(selector))
        pods += [parse_pod(p) for p in raw_pods]
    facts_of_owner = owner_facts_of(handler, owner_facts or None, vias)
    return OwnerRead(
        handler=handler,
        kind_config=kc,
        owner=owner,
        namespace=namespace,
        slices=slices,
        pods=pods,
        facts=pod_facts(handler, owner, pods, objects, facts_of_owner),
        desired=handler.desired_counts(facts_of_owner) if facts_of_owner else None,
        gate=config.gate_for(kc),
        size_unknown="; ".join(unknown),
    )


def audit_read(config: Config, read: OwnerRead, now: float | None = None) -> list[Finding]:
    """The audit findings of a fresh read (no watch history: stalls are dated from the pod's
    creation or the slice's admission, whichever is later)."""
    findings, _ = audit_owner(
        read.slices,
        read.facts,
        read.gate,
        owner=read.owner,
        kind=str(read.owner.group_kind),
        namespace=read.namespace,
        now=time.time() if now is None else now,
        stall_seconds=config.audit.stall_seconds,
        desired=read.desired,
        handover_grace_seconds=config.slice_handover_grace_seconds,
    )
    return findings


async def explain(
    client: KubeClient, config: Config, registry: PluginRegistry, namespace: str, name: str
) -> dict[str, Any]:
    version = await workload_version(client, config)
    res = workload_resource(version)
    raw = await client.get(res, namespace, name)
    if raw is None:
        raise ExplainError(f"workload {namespace}/{name} not found")
    target = parse_workload(raw)
    if target.owner is None:
        raise ExplainError(f"workload {namespace}/{name} has no controller ownerReference")
    kind = target.owner.group_kind
    kc = kind_config(config, kind)
    if kc is None:
        raise ExplainError(f"kind {kind} is not configured as elastic")
    items, _ = await client.list_objects(res, namespace)
    slices = [
        w
        for w in (parse_workload(i) for i in items)
        if w.owner is not None and w.owner.uid == target.owner.uid
    ] or [target]
    read = await read_owner(client, config, registry, namespace, slices, kc)
    blocked = await _refused_releases(client, read.pods, read.gate)
    decision = decide(
        slices,
        read.facts,
        read.gate,
        apply_pod_set_updates=config.apply_pod_set_updates,
        desired=read.desired,
        blocked=blocked,
        size_unknown=read.size_unknown,
    )
    notes = []
    if config.require_elastic_annotation and not target.elastic:
        notes.append(
            "this workload lacks the annotation kueue.x-k8s.io/elastic-job=true, so the "
            "controller ignores it (requireElasticAnnotation)"
        )
    guard = (await check_guards(client, [read.gate]))[read.gate]
    checks_on = config.policy_check_interval_seconds > 0
    mode = effective_mode(config.mode_for(kc), read.gate, guard.state, checks_on)
    if mode.mode == "audit":
        notes.append(
            f"this kind is in audit mode ({mode.why}): the controller reports, and never patches"
        )
        if mode.why.startswith("mode: auto"):
            notes.append(HOW_TO_RELEASE)
    report = _as_dict(
        owner_desc=f"{read.owner.kind} {namespace}/{read.owner.name}",
        gate=read.gate,
        plugin=read.handler.plugin.label,
        slices=slices,
        decision=decision,
        notes=notes,
    )
    report["mode"] = mode.mode
    report["modeWhy"] = mode.why
    report["guard"] = {"state": guard.state, "policies": list(guard.policies)}
    report["notes"].append(guard.line)
    report["findings"] = [f.as_dict() for f in audit_read(config, read)]
    return report


#: Dry-run releases explain asks for at most (one request per gated pod).
MAX_DRY_RUNS = 200


async def _refused_releases(
    client: KubeClient, pods: Sequence[PodView], gate: str
) -> dict[str, str]:
    """UID -> why, for the gated live pods whose release the API server would refuse for good
    now (another admission webhook or policy, RBAC, validation): a dry run of the same
    ``test`` + ``remove`` the controller sends. Stale-view conflicts are not refusals."""
    dry_run = getattr(client, "json_patch_dry_run", None)
    if dry_run is None:
        return {}
    out: dict[str, str] = {}
    candidates = [p for p in pods if p.has_gate(gate) and not p.terminal and not p.deleting]
    for pod in candidates[:MAX_DRY_RUNS]:
        i = pod.gates.index(gate)
        ops = [
            {"op": "test", "path": f"/spec/schedulingGates/{i}/name", "value": gate},
            {"op": "remove", "path": f"/spec/schedulingGates/{i}"},
        ]
        try:
            await dry_run(PODS, pod.namespace, pod.name, ops)
        except ApiError as exc:
            if classify_patch_error(exc.status, exc.reason, exc.body) == PatchOutcome.BLOCKED:
                message = server_message(exc.reason, exc.body)
                out[pod.uid] = f"release refused by the API server (HTTP {exc.status}): {message}"
    return out


def _as_dict(
    *,
    owner_desc: str,
    gate: str,
    plugin: str,
    slices: Sequence[WorkloadView],
    decision: Decision,
    notes: list[str],
) -> dict[str, Any]:
    active = active_slice(slices)
    return {
        "owner": owner_desc,
        "gate": gate,
        "plugin": plugin,
        "slices": [
            {
                "name": w.name,
                "created": w.creation_timestamp,
                "replacementFor": w.replacement_for,
                "conditions": {k: c.status for k, c in w.conditions.items()},
                "active": active is not None and w.uid == active.uid,
            }
            for w in order_slices(slices)
        ],
        "activeSlice": decision.active_slice,
        "summary": decision.summary,
        "wouldRelease": decision.released_names,
        "podSets": [
            {
                "name": r.name,
                "specCount": r.spec_count,
                "admittedCount": r.admitted_count,
                "ownerCount": r.desired_count,
                "cap": r.cap,
                "liveUngated": r.live_ungated,
                "inFlight": r.in_flight,
                "gated": r.gated,
                "chosen": list(r.chosen),
                "waiting": [asdict(w) for w in r.waiting],
                "problem": r.problem,
                "staleProvisioningRequest": list(r.stale),
            }
            for r in decision.pod_sets
        ],
        "unmapped": [asdict(w) for w in decision.unmapped],
        "notes": notes,
    }


def render_text(report: dict[str, Any]) -> str:
    out = [
        f"owner:   {report['owner']}  (plugin {report['plugin']}, gate {report['gate']})",
    ]
    if "mode" in report:
        out.append(f"mode:    {report['mode']} ({report.get('modeWhy', '')})")
    out.append("slices:")
    for s in report["slices"]:
        conds = ",".join(f"{k}={v}" for k, v in sorted(s["conditions"].items())) or "no conditions"
        mark = "*" if s["active"] else " "
        repl = f" replaces {s['replacementFor']}" if s["replacementFor"] else ""
        out.append(f" {mark} {s['name']}  {conds}{repl}")
    out.append(f"decision: {report['summary']}")
    for ps in report["podSets"]:
        out.append(
            f"pod set {ps['name']}: cap {ps['cap']} (spec {ps['specCount']}, admitted "
            f"{ps['admittedCount']}, owner {_unknown(ps['ownerCount'])}), released "
            f"{ps['liveUngated']}, in flight {ps['inFlight']}, gated {ps['gated']}"
        )
        if ps["problem"]:
            out.append(f"  problem: {ps['problem']}")
        if ps["chosen"]:
            out.append(f"  would release now: {', '.join(ps['chosen'])}")
        for w in ps["waiting"]:
            out.append(f"  waits: {w['pod']}: {w['reason']}")
    for w in report["unmapped"]:
        out.append(f"not considered: {w['pod']}: {w['reason']}")
    for f in report.get("findings") or ():
        out.append(f"audit: {f['finding']} ({f['severity']}): {f['message']}")
    for note in report["notes"]:
        out.append(f"note: {note}")
    return "\n".join(out)


def _unknown(value: int | None) -> str:
    return "unknown" if value is None else str(value)
