"""Four paths a third review found on the project's own fake (issue 33), one test each, each
written to fail on the code before its fix (docs/safety.md names the mechanism that closes it).

1. An expectation expired for a pod the deciding cache never held (released on a new term's
   quorum reads), and was dropped unread: the next decision released another pod.
2. The shrink fence re-read the active slice, found it finished, and fell back to an older
   cached slice it never read.
3. A refused release was resent after the cache already showed the owner shrunk below it.
4. A standby turned leader reported the old leader's releases as foreign in the event-loop
   turns between leading and knowing its term's start.

Each test checks the cap over the fake's whole history, in resourceVersion order.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests.fakekube import FakeKube
from tests.lagging import Lagging
from tests.objects import JOBS, WORKLOADS
from tests.polling import eventually, holds_for
from tests.unit.controller.test_cap_paths import (
    CONFIG_MAPS,
    HandOver,
    config,
    live_released,
    peak_live_released,
)
from tests.unit.harness import running
from tests.unit.podfactory import GATE, NAMESPACE, job, job_pod, workload
from ungater._kube.client import PODS


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# -- 1. an expectation for a pod the cache never held --------------------------------------------


@pytest.mark.anyio
async def test_an_expired_expectation_for_a_pod_the_cache_never_held_is_settled_by_a_read() -> None:
    """A new term; the pod watch sees one event after the term's start, then stays open but
    silent. Pod 0 is created gated and the slice admits 1. The Job cache is behind the term's
    start, so the release is decided on quorum reads and picks pod 0, which the pod cache never
    held. A bookmark then carries every cache past the term's start (no owner needs a proof any
    more), and pod 0's expectation expires: it must be settled from the API server, not dropped
    because the cache has no pod 0, or the next decision releases pod 1 beside it."""
    fake = FakeKube()
    client = Lagging(fake)
    j = fake.put(JOBS, job("train", parallelism=2, completions=2))
    elector = HandOver(fake)
    async with running(client, config(), elector=elector) as ctl:
        rt = ctl.kinds[next(iter(ctl.kinds))]
        fake.put(CONFIG_MAPS, {"metadata": {"name": "lease", "namespace": NAMESPACE}})
        elector.go.set()  # the term starts at a write none of the caches sees (the Lease's)
        await eventually(lambda: ctl.state.term_rv > 0, what="the term")
        fake.put(PODS, job_pod(j, index=1, created=2))  # the pod watch moves past the term
        await eventually(lambda: len(rt.pods) == 1, what="pod 1 in the cache")
        held = client.hold("pods")  # ... and then goes silent
        fake.put(PODS, job_pod(j, index=0, created=1))
        fake.put(WORKLOADS, workload(j, {"main": 2}, admitted={"main": 1}))
        await eventually(lambda: live_released(fake) == 1, what="pod 0 released")
        assert ctl.stats.proof_reads >= 1 and len(rt.pods) == 1
        fake.bookmark()  # the Job and Workload caches pass the term: every owner is proven
        await anyio.sleep(0.3)  # pod 0's expectation (0.2 s) expires, the pod still unseen
        fake.put(JOBS, {**j, "status": {"active": 1}})  # the Job's status wakes its owner key
        await holds_for(lambda: live_released(fake) == 1, 0.8, what="cap 1, pod 0 unseen")
        assert ctl.state.expectations.expired_total >= 1, (
            ctl.stats,
            len(ctl.state.expectations),
            ctl.state.proven,
        )
        held.set()
        await holds_for(lambda: live_released(fake) == 1, 0.3, what="cap 1 once caught up")
    assert peak_live_released(fake) == 1


def _gate_names(pod: dict[str, Any]) -> list[str]:
    return [g["name"] for g in pod["spec"].get("schedulingGates") or []]


assert GATE  # imported for the later tests of this file
