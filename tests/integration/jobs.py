"""batch/v1 Jobs on the real API server, for the tests that play Kueue or run it: an elastic
Indexed Job's body, its creation with a wait for its pods, and reads and waits on those pods."""

from __future__ import annotations

from typing import Any

from tests.integration.k8s import Kube
from tests.integration.monitor import live_released
from tests.objects import GATE, JOBS, PODS
from tests.polling import eventually


def job_body(
    name: str, n: int, gates: list[str] | None = None, podset_label: bool = False
) -> dict[str, Any]:
    labels = {"kueue.x-k8s.io/podset": "main"} if podset_label else {}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "annotations": {"kueue.x-k8s.io/elastic-job": "true"}},
        "spec": {
            "parallelism": n,
            "completions": n,
            "completionMode": "Indexed",
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "schedulingGates": [{"name": g} for g in (gates or [GATE])],
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": "registry.invalid/trainer:1"}],
                },
            },
        },
    }


async def make_job(kube: Kube, ns: str, name: str, n: int, **kw: Any) -> tuple[dict[str, Any], str]:
    job = await kube.create(JOBS, ns, job_body(name, n, **kw))
    selector = f"batch.kubernetes.io/controller-uid={job['metadata']['uid']}"
    await eventually(
        lambda: count_pods(kube, ns, selector, n), timeout=30, what=f"{n} pods of {name}"
    )
    return job, selector


async def count_pods(kube: Kube, ns: str, selector: str, n: int) -> bool:
    """Exactly ``n`` pods of the selector exist that are not being deleted."""
    pods = [
        p for p in await kube.list(PODS, ns, selector) if not p["metadata"].get("deletionTimestamp")
    ]
    return len(pods) == n


def index(p: dict[str, Any]) -> int:
    return int(p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"])


async def released_indexes(kube: Kube, ns: str, selector: str) -> list[int]:
    return sorted(index(p) for p in live_released(await kube.list(PODS, ns, selector)))


async def scale(kube: Kube, ns: str, name: str, n: int) -> None:
    await kube.merge_patch(JOBS, ns, name, {"spec": {"parallelism": n, "completions": n}})


async def gone(kube: Kube, ns: str, name: str) -> bool:
    """The pod ``name`` no longer exists."""
    return await kube.get(PODS, ns, name) is None


async def replacement(kube: Kube, ns: str, sel: str, old_uid: str) -> dict[str, Any] | None:
    """The live pod of index 0 that the Job controller made after the one of ``old_uid``."""
    for p in await kube.list(PODS, ns, sel):
        meta = p["metadata"]
        if index(p) == 0 and meta["uid"] != old_uid and not meta.get("deletionTimestamp"):
            return p
    return None
