"""Issue 26, path 2 on the real control plane: a release PATCH held past the client's timeout,
then forwarded to the API server, must not land after another pod was released in its place.

`ungater run` talks to the API server through ``httpproxy.HttpProxy``. The Job has pods 0 and
1; pod 0 is deleted before the admission (cap 1), so the release goes to pod 1, and the proxy
holds that PATCH. The real Job controller replaces pod 0 after its pod-failure backoff (about
10 s), the controller sees the new pod 0, which comes first in release order, and then its
client gives up (``client.requestTimeoutSeconds`` 15: longer than that backoff, so the order
changes while the outcome is still unknown). Before the fix, once the expectation of the lost
patch expired, a GET showed pod 1 still gated, the controller released the new pod 0, and the
held PATCH, forwarded then, removed pod 1's gate too: 2 released for a cap of 1. With the fix
the unknown outcome is settled first (a GET, and a fence annotation on the unchanged pod) and
the new pod 0 released; the late PATCH's resourceVersion test then fails on the real API
server (HTTP 422) while pod 1 still carries the gate it tested.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.integration.httpproxy import http_proxy
from tests.integration.jobs import gone, index, make_job, replacement
from tests.integration.k8s import Kube
from tests.integration.monitor import monitoring
from tests.integration.support import admit, create_workload
from tests.integration.tcpproxy import kubeconfig_via
from tests.objects import GATE, PODS, gates_of
from tests.polling import eventually

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

FENCE = "ungater.dev/release-fence"
CLIENT_TIMEOUT_S = 15
EXPECTATIONS_S = 30  # the default: before the fix, the lost patch was counted this long


class Ungater:
    """`ungater run` as a subprocess (no leader election), its log in ``tmp``."""

    def __init__(self, kubeconfig: Path, config: str, tmp: Path) -> None:
        self.log = tmp / "ungater.log"
        cfg = tmp / "ungater.yaml"
        cfg.write_text(config)
        argv = [sys.executable, "-m", "ungater", "run", "--no-leader-election"]
        argv += ["--kubeconfig", str(kubeconfig), "--config", str(cfg)]
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)

    def metrics(self) -> str:
        found = re.search(r"serving /metrics, /healthz, /readyz on (http://\S+)", self.text())
        if not found:
            return ""
        try:
            with urllib.request.urlopen(found.group(1) + "/metrics", timeout=5) as resp:
                return str(resp.read().decode())
        except OSError:
            return ""

    def patches(self, outcome: str) -> float:
        found = re.search(
            rf'^ungater_patches_total\{{outcome="{outcome}"\}} (\S+)$', self.metrics(), re.M
        )
        return float(found.group(1)) if found else 0.0

    def text(self) -> str:
        return self.log.read_text()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout=10)


async def pod_named(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    pod = await kube.get(PODS, ns, name)
    assert pod is not None, name
    return pod


async def test_a_release_patch_held_past_the_client_timeout_cannot_land_after_another_release(
    kube: Kube, kube_namespace: str, control_plane: Any, tmp_path: Path
) -> None:
    ns = kube_namespace
    job, sel = await make_job(kube, ns, "late", 2)
    await create_workload(kube, job, "job-late-a", {"main": 2})
    pods = {index(p): p for p in await kube.list(PODS, ns, sel)}
    first, second = pods[0]["metadata"], pods[1]["metadata"]
    config = (  # mode release: the test plays Kueue, so no other releaser is on its gate
        f"namespaces: [{ns}]\nserver: {{address: '127.0.0.1:0'}}\nmode: release\n"
        f"client: {{requestTimeoutSeconds: {CLIENT_TIMEOUT_S}}}\n"
    )
    async with http_proxy(control_plane) as proxy, monitoring(kube, ns, sel) as mon:
        via = kubeconfig_via(control_plane.kubeconfig_path, proxy.port, tmp_path / "via.kubeconfig")
        ungater = Ungater(via, config, tmp_path)
        try:
            await eventually(
                lambda: "ungater_leader" in ungater.metrics(), timeout=30, what="ungater serving"
            )
            # pod 0 goes; the Job controller replaces it only after its pod-failure backoff
            await kube.delete(PODS, ns, first["name"])
            await eventually(lambda: gone(kube, ns, first["name"]), timeout=30, what="pod 0 gone")
            held = proxy.hold_request("PATCH", "pods", second["name"])
            await admit(kube, ns, "job-late-a", {"main": 1})
            with anyio.fail_after(20):
                await held.arrived.wait()
            # the replacement pod 0 comes, and the controller's pod watch shows it, while the
            # PATCH of pod 1 is still unanswered (a positive signal that it decided on it)
            new_first = await eventually(
                lambda: replacement(kube, ns, sel, first["uid"]), timeout=30, what="a new pod 0"
            )
            new_name = new_first["metadata"]["name"]
            await eventually(
                lambda: proxy.events_of("pods", new_name, "ADDED"),
                timeout=10,
                what="the controller's pod watch showed the new pod 0",
            )
            assert ungater.patches("error") == 0, "the replacement came after the client timeout"
            await eventually(
                lambda: ungater.patches("error") >= 1,
                timeout=CLIENT_TIMEOUT_S + 10,
                what="the controller gave up on the held PATCH",
            )
            # the controller fills the cap with the new pod 0; only then the late write goes
            await eventually(
                lambda: [p["metadata"]["name"] for p in mon.released()] == [new_name],
                timeout=EXPECTATIONS_S + 10,
                what="the new pod 0 released",
            )
            held.release()
            with anyio.fail_after(10):
                await held.answered.wait()
            if held.status < 300:  # it landed: let the monitor see it before the verdict
                landed = str(json.loads(held.answer)["metadata"]["resourceVersion"])
                await eventually(
                    lambda: any(
                        p["metadata"]["resourceVersion"] == landed
                        for p in mon.history.get(second["name"], [])
                    ),
                    timeout=10,
                    what="the monitor saw the late PATCH land",
                )
            assert not await mon.verdict()  # the record whole up to now, judged
            assert held.status == 422, (held.status, held.answer[:500])
            # refused by its resourceVersion test alone: pod 1 still carries the gate it
            # tested, at another version since the fence was written at the tested one
            tested = held.request_json()[0]
            assert tested["path"] == "/metadata/resourceVersion", tested
            pod1 = await pod_named(kube, ns, second["name"])
            assert GATE in gates_of(pod1)
            assert pod1["metadata"]["annotations"][FENCE] == tested["value"], pod1["metadata"]
            assert [p["metadata"]["name"] for p in mon.released()] == [new_name]
        finally:
            code = await anyio.to_thread.run_sync(ungater.stop)
        assert code == 0, ungater.text()[-3000:]
