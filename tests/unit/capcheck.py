"""What the cap-path tests share: a config with short timeouts, the cap checked over the fake's
whole history, and a stand-in elector whose term starts when the test says."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import anyio

from tests.fakekube import FakeKube
from tests.unit.podfactory import GATE, NAMESPACE
from ungater._kube.client import PODS, Resource
from ungater._model.config import Config


def config(**extra: Any) -> Config:
    return Config.model_validate(
        {
            "kinds": [{"group": "batch", "kind": "Job"}],
            "mode": "release",
            "expectationsTimeoutSeconds": 0.2,
            "watch": {"backoffInitialSeconds": 0.01, "backoffMaxSeconds": 0.05},
            **extra,
        }
    )


def _live_released(pod: Mapping[str, Any]) -> bool:
    gates = [g["name"] for g in pod["spec"].get("schedulingGates") or []]
    return (
        GATE not in gates
        and pod["status"]["phase"] not in ("Succeeded", "Failed")
        and not pod["metadata"].get("deletionTimestamp")
    )


CONFIG_MAPS = Resource("", "v1", "configmaps", "ConfigMap")


def peak_live_released(fake: FakeKube, since: int = 0) -> int:
    """The most live released pods at any moment of the fake's history (resourceVersion order)
    after resourceVersion ``since``."""
    now: dict[str, bool] = {}
    peak = 0
    for rv, rkey, _ns, etype, obj, _old in fake.history:
        if rkey != ("", "pods"):
            continue
        uid = obj["metadata"]["uid"]
        now[uid] = etype != "DELETED" and _live_released(obj)
        if rv > since:
            peak = max(peak, sum(now.values()))
    return peak


def live_released(fake: FakeKube) -> int:
    return sum(_live_released(p) for p in fake.items(PODS, NAMESPACE))


# -- 1. leader hand-over onto a lagging standby ---------------------------------------------------


@dataclass
class Term:
    number: int
    lost: anyio.Event
    resource_version: str


class HandOver:
    """A stand-in elector: the replica leads from ``go`` on, its term starting at the
    resourceVersion the fake is at then (as the Lease write that acquired it would be)."""

    def __init__(self, fake: FakeKube) -> None:
        self.fake = fake
        self.is_leader = False
        self.term: Term | None = None
        self.go = anyio.Event()

    async def run_while_leading(self, fn: Any) -> None:
        await self.go.wait()
        self.term = Term(1, anyio.Event(), str(self.fake.rv))
        self.is_leader = True
        await fn(self.term)
