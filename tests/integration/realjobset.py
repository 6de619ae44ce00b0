"""Elastic JobSets under the real Kueue and the real JobSet controller: the JobSet body, its size
per pod set as Kueue counts it, its scaling, and a wait for its pods."""

from __future__ import annotations

from typing import Any

from tests.integration.k8s import JOBSETS, Kube
from tests.integration.realpeers import KUEUE_GATE, UNGATER_GATE
from tests.objects import PODS


def jobset(name: str, replicas: int, parallelism: int) -> dict[str, Any]:
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": name,
            "labels": {"kueue.x-k8s.io/queue-name": "user-queue"},
            "annotations": {"kueue.x-k8s.io/elastic-job": "true"},
        },
        "spec": {
            "replicatedJobs": [
                {
                    "name": "workers",
                    "replicas": replicas,
                    "template": {
                        "spec": {
                            "parallelism": parallelism,
                            "completions": parallelism,
                            "completionMode": "Indexed",
                            "backoffLimit": 0,
                            "template": {
                                "spec": {
                                    "restartPolicy": "Never",
                                    "schedulingGates": [
                                        {"name": UNGATER_GATE},
                                        {"name": KUEUE_GATE},
                                    ],
                                    "containers": [
                                        {
                                            "name": "main",
                                            "image": "registry.invalid/trainer:1",
                                            "resources": {"requests": {"cpu": "1"}},
                                        }
                                    ],
                                }
                            },
                        }
                    },
                }
            ]
        },
    }


def jobset_sizes(js: dict[str, Any]) -> dict[str, int]:
    """Pods wanted per replicated Job, as Kueue counts them (none while suspended)."""
    if js["spec"].get("suspend"):
        return {r["name"]: 0 for r in js["spec"]["replicatedJobs"]}
    out = {}
    for r in js["spec"]["replicatedJobs"]:
        spec = r["template"]["spec"]
        per_job = min(int(spec.get("parallelism", 1)), int(spec.get("completions", 1)))
        out[r["name"]] = int(r.get("replicas", 1)) * per_job
    return out


def jobset_uid(pod: dict[str, Any]) -> str:
    return str(pod["metadata"].get("labels", {}).get("jobset.sigs.k8s.io/jobset-uid", ""))


async def scale_jobset(kube: Kube, ns: str, name: str, n: int) -> None:
    """Set the first replicated Job's parallelism and completions (a Job's scale is in ``jobs``)."""
    await kube.json_patch(
        JOBSETS,
        ns,
        name,
        [
            {
                "op": "replace",
                "path": "/spec/replicatedJobs/0/template/spec/parallelism",
                "value": n,
            },
            {
                "op": "replace",
                "path": "/spec/replicatedJobs/0/template/spec/completions",
                "value": n,
            },
        ],
    )


async def n_pods(kube: Kube, ns: str, name: str, n: int) -> bool:
    pods = await kube.list(PODS, ns, f"jobset.sigs.k8s.io/jobset-name={name}")
    return sum(1 for p in pods if not p["metadata"].get("deletionTimestamp")) == n
