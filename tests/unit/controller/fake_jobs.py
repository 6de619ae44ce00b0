"""An Indexed Job and its gated pods on the in-memory API server, what of them is released, and
the config the controller runs them with while the test plays Kueue."""

from __future__ import annotations

from typing import Any

from tests.fakekube import FakeKube
from tests.objects import JOBS, PODS, job_pod, ungated
from ungater._model.config import Config

NS = "team-a"


def make_config(**overrides: Any) -> Config:
    raw: dict[str, Any] = {
        "mode": "release",  # the test plays Kueue: no other releaser
        "kinds": [{"group": "batch", "kind": "Job"}],
        "expectationsTimeoutSeconds": 2.0,
        "watch": {"backoffInitialSeconds": 0.01, "backoffMaxSeconds": 0.05, "silenceSeconds": 5},
    }
    raw.update(overrides)
    return Config.model_validate(raw)


def pods(fake: FakeKube) -> list[dict[str, Any]]:
    return fake.items(PODS, NS)


def released_indexes(fake: FakeKube) -> list[int]:
    return sorted(
        int(p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"])
        for p in ungated(pods(fake))
    )


def setup_job(fake: FakeKube, n: int, name: str = "train") -> dict[str, Any]:
    owner = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}"},
        "spec": {"parallelism": n, "completionMode": "Indexed"},
    }
    fake.put(JOBS, owner)  # the Job's size bounds its pod set, so it must exist
    for i in reversed(range(n)):  # created out of order: order must come from the index
        fake.put(PODS, job_pod(owner, i))
    return owner
