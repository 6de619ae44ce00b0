"""``ungater audit``: read the cluster once and print the audit findings of every elastic owner.

It patches nothing and needs only read access. Per namespace it lists the Workloads, groups
them by owner, reads each configured owner's pods as ``ungater explain`` does (the same
plugins, the same decision) and compares what the active slice allows with the pods as they
are: ``ungater._decide.findings.audit_owner``. A one-shot read has no history, so a stall is dated from
the later of the pod's creation and the slice's admission, and how long an over-release has
lasted is unknown (the controller in audit mode measures both while it watches).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from ungater._cli.explain import audit_read, kind_config, read_owner, workload_version
from ungater._decide.findings import WARNING, Finding
from ungater._kube.client import KubeClient
from ungater._kube.kueue import workload_resource
from ungater._model.config import Config
from ungater._model.views import MalformedObject, WorkloadView, parse_workload
from ungater._plugins.registry import PluginRegistry

__all__ = ["audit_cluster", "render_findings"]


async def audit_cluster(
    client: KubeClient, config: Config, registry: PluginRegistry, namespace: str | None = None
) -> dict[str, Any]:
    """The findings of every owner of a configured kind in ``namespace`` (default: the
    config's namespaces, else all), as a JSON-ready report."""
    version = await workload_version(client, config)
    res = workload_resource(version)
    namespaces: Sequence[str | None] = (
        [namespace] if namespace else (list(config.namespaces) or [None])
    )
    now = time.time()
    findings: list[Finding] = []
    owners = 0
    for ns in namespaces:
        items, _ = await client.list_objects(res, ns)
        chains: dict[tuple[str, str], list[WorkloadView]] = {}
        for item in items:
            try:
                wl = parse_workload(item)
            except MalformedObject:
                continue
            if wl.owner is None or kind_config(config, wl.owner.group_kind) is None:
                continue
            if config.require_elastic_annotation and not wl.elastic:
                continue
            chains.setdefault((wl.namespace, wl.owner.uid), []).append(wl)
        for (owner_ns, _uid), slices in sorted(chains.items()):
            owner = slices[0].owner
            assert owner is not None
            kc = kind_config(config, owner.group_kind)
            assert kc is not None
            read = await read_owner(client, config, registry, owner_ns, slices, kc)
            owners += 1
            findings.extend(audit_read(config, read, now))
    summary: dict[str, int] = {}
    for f in findings:
        summary[f.finding] = summary.get(f.finding, 0) + 1
    return {
        "owners": owners,
        "namespaces": [ns or "(all)" for ns in namespaces],
        "summary": summary,
        "findings": [f.as_dict() for f in findings],
    }


def render_findings(report: dict[str, Any]) -> str:
    found = report["findings"]
    warnings = sum(1 for f in found if f["severity"] == WARNING)
    out = [
        f"audited {report['owners']} owner(s) in {', '.join(report['namespaces'])}: "
        f"{len(found)} finding(s), {warnings} warning(s)"
    ]
    for f in found:
        where = f"workload {f['workload']}" + (f", pod set {f['podSet']}" if f["podSet"] else "")
        how_long = "" if f["seconds"] is None else f" [{f['seconds']:.0f}s]"
        out.append(
            f"{f['severity'].upper():<7} {f['finding']:<24} {f['owner']} ({where}){how_long}"
        )
        out.append(f"        {f['message']}")
    return "\n".join(out)
