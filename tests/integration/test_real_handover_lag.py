"""Issue 26, path 1 on the real control plane: a leader hand-over onto a standby whose pod
watch lags must not release past the cap.

Two `ungater run` replicas share a Lease, each talking to the API server through its own
``httpproxy.HttpProxy``. The Job has pods 0 and 1; pod 0 is deleted and the standby sees it go;
then the standby's pod watches are held (open, silent, as a watch that lags), so it never sees
the replacement pod 0 that the real Job controller creates after its pod-failure backoff. The
slice admits 1; the leader releases the new pod 0, and is SIGKILLed with that PATCH committed
and its answer held by its proxy (killed mid-release). The standby takes over with a cache
that shows pod 1 as the only pod, gated. Before the fix it released pod 1 at once: 2 released
for a cap of 1. With the fix its first release for the Job is decided on a quorum list of the
Job's pods, which shows the new pod 0 released: it releases nothing until the cap grows.
"""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.integration.httpproxy import HttpProxy, http_proxy
from tests.integration.jobs import gone, index, make_job, released_indexes, replacement
from tests.integration.k8s import Kube
from tests.integration.monitor import monitoring
from tests.integration.replicas import LEASE_S, Replica, holder
from tests.integration.support import admit, create_workload
from tests.integration.tcpproxy import kubeconfig_via
from tests.objects import PODS
from tests.polling import equals, eventually, holds_for

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


def quorum_lists(proxy: HttpProxy, job_uid: str, since: float) -> list[int]:
    """Statuses of the plain LISTs of the Job's pods (by its UID selector) since ``since``:
    a watch-fed cache never sends these; a new leader's proof read does."""
    return [
        r.status
        for r in proxy.requests
        if r.method == "GET"
        and r.resource == "pods"
        and not r.name
        and r.query.get("watch") is None
        and job_uid in r.query.get("labelSelector", "")
        and r.at >= since
    ]


def foreign_releases(replica: Replica) -> float:
    found = re.search(r"^ungater_foreign_releases_total (\S+)$", replica.get("/metrics")[1], re.M)
    return float(found.group(1)) if found else 0.0


async def test_a_standby_whose_pod_watch_lags_takes_over_without_releasing_past_the_cap(
    kube: Kube, kube_namespace: str, control_plane: Any, tmp_path: Path
) -> None:
    ns = kube_namespace
    job, sel = await make_job(kube, ns, "handover", 2)
    job_uid = job["metadata"]["uid"]
    await create_workload(kube, job, "job-handover-a", {"main": 2})
    first = {index(p): p for p in await kube.list(PODS, ns, sel)}[0]["metadata"]
    replicas: list[Replica] = []
    async with (
        http_proxy(control_plane) as via_a,
        http_proxy(control_plane) as via_b,
        monitoring(kube, ns, sel) as mon,
    ):
        try:
            kubeconfig = control_plane.kubeconfig_path
            a = Replica(
                "replica-a",
                kubeconfig_via(kubeconfig, via_a.port, tmp_path / "a.kubeconfig"),
                ns,
                tmp_path,
            )
            replicas.append(a)
            await eventually(
                lambda: equals(holder(kube, ns), a.name), timeout=30, what="replica-a leads"
            )
            b = Replica(
                "replica-b",
                kubeconfig_via(kubeconfig, via_b.port, tmp_path / "b.kubeconfig"),
                ns,
                tmp_path,
            )
            replicas.append(b)
            await eventually(
                lambda: b.url() and b.get("/readyz")[0] == 200, timeout=30, what="standby ready"
            )
            # pod 0 goes, the standby sees it go; from then on its pod watches pass nothing on
            await kube.delete(PODS, ns, first["name"])
            await eventually(lambda: gone(kube, ns, first["name"]), timeout=30, what="pod 0 gone")
            await eventually(
                lambda: via_b.events_of("pods", first["name"], "DELETED"),
                timeout=10,
                what="the standby saw pod 0 go",
            )
            lagging = via_b.hold_watches("pods")
            # the Job controller's replacement pod 0 comes; the leader sees it, the standby not
            new_first = await eventually(
                lambda: replacement(kube, ns, sel, first["uid"]), timeout=30, what="a new pod 0"
            )
            new_name = new_first["metadata"]["name"]
            await eventually(
                lambda: via_a.events_of("pods", new_name, "ADDED"),
                timeout=10,
                what="the leader saw the new pod 0",
            )
            answer = via_a.hold_response("PATCH", "pods")
            await admit(kube, ns, "job-handover-a", {"main": 1})
            with anyio.fail_after(20):
                await answer.answered.wait()
            assert (answer.target, answer.status) == (new_name, 200), answer.answer[:500]
            await eventually(
                lambda: [p["metadata"]["name"] for p in mon.released()] == [new_name],
                timeout=10,
                what="the leader's release of the new pod 0",
            )
            # the leader dies with its release committed and its answer never received
            await anyio.to_thread.run_sync(lambda: a.stop(signal.SIGKILL))
            answer.release()
            killed = time.monotonic()
            assert not via_b.events_of("pods", new_name), "the standby's watch was not held"
            await eventually(
                lambda: equals(holder(kube, ns), b.name),
                timeout=3 * LEASE_S,
                what="the standby holds the Lease",
            )
            # its first decision for the Job would release pod 1 on its cache; it lists the
            # Job's pods from the API server first (or, before the fix, releases pod 1)
            await eventually(
                lambda: len(mon.released()) > 1 or any(quorum_lists(via_b, job_uid, killed)),
                timeout=20,
                what="the new leader's quorum read of the Job's pods (or a second release)",
            )
            assert not await mon.verdict()  # the record whole up to now, judged
            assert set(quorum_lists(via_b, job_uid, killed)) <= {0, 200}
            await holds_for(
                lambda: len(mon.released()) == 1, 1.0, what="the cap of 1 after the hand-over"
            )
            assert not await mon.verdict()
            assert not via_b.events_of("pods", new_name), "the standby's watch caught up early"
            # the watch catches up; the old leader's release is not someone else's
            lagging.set()
            await eventually(
                lambda: via_b.events_of("pods", new_name),
                timeout=10,
                what="the standby's watch caught up",
            )
            await admit(kube, ns, "job-handover-a", {"main": 2})
            await eventually(
                lambda: equals(released_indexes(kube, ns, sel), [0, 1]),
                timeout=20,
                what="the new leader releases pod 1 once the cap is 2",
            )
            assert foreign_releases(b) == 0, b.log.read_text()[-3000:]
            code = await anyio.to_thread.run_sync(b.stop)
            assert code == 0, b.log.read_text()[-3000:]
        finally:
            for r in replicas:
                await anyio.to_thread.run_sync(lambda r=r: r.stop(signal.SIGKILL, 10))
