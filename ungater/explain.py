"""``ungater explain``: read one Workload's owner from the cluster and print the decision.

It patches nothing. It runs the same assessment and decision the controller runs, on a fresh
read instead of the cache, so an operator sees exactly why each pod is still gated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from ungater.assess import owner_of, pod_facts
from ungater.blocked import BLOCKED, classify_patch_error, server_message
from ungater.config import Config
from ungater.controller import KUEUE_GROUP, StartupError, workload_resource
from ungater.decision import Decision, active_slice, decide, order_slices
from ungater.kube import PODS, ApiError, KubeClient, Resource
from ungater.model import (
    Kind,
    ObjectView,
    PodView,
    WorkloadView,
    parse_object,
    parse_pod,
    parse_workload,
)
from ungater.registry import PluginRegistry

__all__ = ["ExplainError", "explain", "render_text"]


class ExplainError(Exception):
    pass


async def explain(
    client: KubeClient, config: Config, registry: PluginRegistry, namespace: str, name: str
) -> dict[str, Any]:
    served = await client.served_versions(KUEUE_GROUP)
    version = next((v for v in config.workload_api_versions if v in served), None)
    if version is None:
        raise ExplainError("the API server serves no Kueue Workload API (is Kueue installed?)")
    res = workload_resource(version)
    raw = await client.get(res, namespace, name)
    if raw is None:
        raise ExplainError(f"workload {namespace}/{name} not found")
    target = parse_workload(raw)
    if target.owner is None:
        raise ExplainError(f"workload {namespace}/{name} has no controller ownerReference")
    kind = target.owner.group_kind
    kc = next((k for k in config.kinds if Kind(k.group, k.kind) == kind), None)
    if kc is None:
        raise ExplainError(f"kind {kind} is not configured as elastic")
    try:
        handler = registry.handler(kind, kc.plugin)
    except LookupError as exc:
        raise StartupError(str(exc)) from exc
    items, _ = await client.list_objects(res, namespace)
    slices = [
        w
        for w in (parse_workload(i) for i in items)
        if w.owner is not None and w.owner.uid == target.owner.uid
    ]
    owner = owner_of(slices) or target.owner
    objects: dict[str, ObjectView] = {}
    for spec in handler.spec.intermediates:
        found, _ = await client.list_objects(
            Resource(spec.group, spec.version, spec.plural, spec.kind),
            namespace,
            spec.label_selector,
        )
        objects.update((o.uid, o) for o in map(parse_object, found))
    owner_facts: dict[str, Any] = {}
    owner_spec = handler.spec.owner_resource
    if owner_spec is not None:
        res_owner = Resource(
            owner_spec.group, owner_spec.version, owner_spec.plural, owner_spec.kind
        )
        owner_obj = await client.get(res_owner, namespace, owner.name)
        if owner_obj is not None and (owner_obj.get("metadata") or {}).get("uid") == owner.uid:
            owner_facts = handler.owner_facts(owner_obj)
    selector = handler.pod_selector(owner)
    raw_pods, _ = await client.list_objects(
        PODS, namespace, ",".join(f"{k}={v}" for k, v in selector.items())
    )
    pods = [parse_pod(p) for p in raw_pods]
    gate = config.gate_for(kc)
    blocked = await _refused_releases(client, pods, gate)
    decision = decide(
        slices,
        pod_facts(handler, owner, pods, objects, owner_facts),
        gate,
        apply_pod_set_updates=config.apply_pod_set_updates,
        desired=handler.desired_counts(owner_facts) if owner_facts else None,
        blocked=blocked,
    )
    notes = []
    if config.require_elastic_annotation and not target.elastic:
        notes.append(
            "this workload lacks the annotation kueue.x-k8s.io/elastic-job=true, so the "
            "controller ignores it (requireElasticAnnotation)"
        )
    return _as_dict(
        owner_desc=f"{owner.kind} {namespace}/{owner.name}",
        gate=gate,
        plugin=handler.plugin.label,
        slices=slices,
        decision=decision,
        notes=notes,
    )


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
            if classify_patch_error(exc.status, exc.reason, exc.body) == BLOCKED:
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
            }
            for r in decision.pod_sets
        ],
        "unmapped": [asdict(w) for w in decision.unmapped],
        "notes": notes,
    }


def render_text(report: dict[str, Any]) -> str:
    out = [
        f"owner:   {report['owner']}  (plugin {report['plugin']}, gate {report['gate']})",
        "slices:",
    ]
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
    for note in report["notes"]:
        out.append(f"note: {note}")
    return "\n".join(out)


def _unknown(value: int | None) -> str:
    return "unknown" if value is None else str(value)
