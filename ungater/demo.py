"""``ungater demo``: a narrated elastic-job scenario on a real local control plane.

It starts kube-apiserver, etcd and kube-controller-manager (the Job controller is real: it
creates and deletes the pods), runs ``ungater run`` as a separate process exactly as a user
would, and plays Kueue's part itself: it writes the Workload slices and their admission. Each
step that stands in for Kueue says so.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from ungater.config import DEFAULT_GATE
from ungater.kube import PODS, ApiClientKube, Resource, connect

__all__ = ["run_demo"]

NS = "ungater-demo"
JOBS = Resource("batch", "v1", "jobs", "Job")
WORKLOADS = Resource("kueue.x-k8s.io", "v1beta2", "workloads", "Workload")
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
KUEUE = "\033[35m[simulating Kueue]\033[0m" if sys.stdout.isatty() else "[simulating Kueue]"


def say(text: str = "") -> None:
    print(text, flush=True)


def _cond(kind: str, reason: str) -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True",
        "reason": reason,
        "message": "set by ungater demo",
        "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


class Scenario:
    def __init__(self, client: ApiClientKube, pause: float) -> None:
        self.c = client
        self.pause = pause
        self.job: dict[str, Any] = {}
        self._last_table = ""

    async def step(self, title: str) -> None:
        say()
        say(f"== {title}")
        await anyio.sleep(self.pause)

    async def pods(self) -> list[dict[str, Any]]:
        sel = f"batch.kubernetes.io/controller-uid={self.job['metadata']['uid']}"
        items, _ = await self.c.list_objects(PODS, NS, sel)
        return sorted(
            items,
            key=lambda p: int(
                p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]
            ),
        )

    @staticmethod
    def released(p: dict[str, Any]) -> bool:
        return DEFAULT_GATE not in [g["name"] for g in p["spec"].get("schedulingGates") or ()]

    def table(self, pods: list[dict[str, Any]]) -> str:
        rows = ["   index  pod                        gate        state"]
        for p in pods:
            meta = p["metadata"]
            state = "deleting" if meta.get("deletionTimestamp") else p["status"].get("phase", "?")
            rows.append(
                f"   {meta['annotations']['batch.kubernetes.io/job-completion-index']:>5}  "
                f"{meta['name']:<26} {'released' if self.released(p) else 'gated':<11} {state}"
            )
        return "\n".join(rows)

    async def watch_until(self, want_released: int, want_total: int, timeout: float = 30) -> None:
        """Print the table each time it changes, until the expected state (or the deadline)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pods = [p for p in await self.pods() if not p["metadata"].get("deletionTimestamp")]
            table = self.table(pods)
            if table != self._last_table:
                say(table)
                say()
                self._last_table = table
            if len(pods) == want_total and sum(map(self.released, pods)) == want_released:
                return
            await anyio.sleep(0.05)
        raise RuntimeError(f"expected {want_released} of {want_total} pods released by now")

    async def workload(self, name: str, count: int, replaces: str | None = None) -> None:
        ann = {
            "kueue.x-k8s.io/elastic-job": "true",
            "kueue.x-k8s.io/workload-slice-name": "job-train-a",
        }
        if replaces:
            ann["kueue.x-k8s.io/workload-slice-replacement-for"] = f"{NS}/{replaces}"
        meta = self.job["metadata"]
        await self.c.create(
            WORKLOADS,
            NS,
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "Workload",
                "metadata": {
                    "name": name,
                    "annotations": ann,
                    "ownerReferences": [
                        {
                            "apiVersion": "batch/v1",
                            "kind": "Job",
                            "name": meta["name"],
                            "uid": meta["uid"],
                            "controller": True,
                            "blockOwnerDeletion": True,
                        }
                    ],
                },
                "spec": {
                    "queueName": "demo",
                    "podSets": [
                        {
                            "name": "main",
                            "count": count,
                            "template": {
                                "spec": {"containers": [{"name": "main", "image": "trainer"}]}
                            },
                        }
                    ],
                },
            },
        )

    async def admit(self, name: str, count: int) -> None:
        await self.c.merge_patch(
            WORKLOADS,
            NS,
            name,
            {
                "status": {
                    "admission": {
                        "clusterQueue": "demo",
                        "podSetAssignments": [
                            {"name": "main", "count": count, "flavors": {"cpu": "default"}}
                        ],
                    },
                    "conditions": [
                        _cond("QuotaReserved", "QuotaReserved"),
                        _cond("Admitted", "Admitted"),
                    ],
                }
            },
            "status",
        )

    async def run(self) -> None:
        await self.c.create(
            NAMESPACES, None, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}
        )
        await self.step("1. A user creates an elastic Indexed Job with 4 pods, gated")
        say(f"   Its pod template carries the scheduling gate {DEFAULT_GATE}. The real Job")
        say("   controller creates the pods at once; the gate keeps the scheduler away.")
        self.job = await self.c.create(
            JOBS,
            NS,
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {
                    "name": "train",
                    "annotations": {"kueue.x-k8s.io/elastic-job": "true"},
                },
                "spec": {
                    "parallelism": 4,
                    "completions": 4,
                    "completionMode": "Indexed",
                    "template": {
                        "spec": {
                            "schedulingGates": [{"name": DEFAULT_GATE}],
                            "restartPolicy": "Never",
                            "containers": [{"name": "main", "image": "trainer"}],
                        }
                    },
                },
            },
        )
        await self.watch_until(0, 4)

        await self.step(f"2. {KUEUE} a Workload slice asks for 4 pods; quota admits only 2")
        await self.workload("job-train-a", 4)
        await self.admit("job-train-a", 2)
        say("   ungater releases exactly 2 pods, lowest completion index first:")
        await self.watch_until(2, 4)

        await self.step(f"3. Quota frees up: {KUEUE} the slice's admission grows to 4")
        await self.admit("job-train-a", 4)
        await self.watch_until(4, 4)

        await self.step("4. The user scales the Job up to 6; the Job controller adds 2 gated pods")
        await self.c.merge_patch(JOBS, NS, "train", {"spec": {"parallelism": 6, "completions": 6}})
        await self.watch_until(4, 6)
        say(f"   {KUEUE} a replacement slice asks for the new total, 6. Until it is admitted")
        say("   the new pods stay gated.")
        await self.workload("job-train-b", 6, replaces="job-train-a")
        await anyio.sleep(max(self.pause, 0.5))
        await self.watch_until(4, 6)

        await self.step(f"5. {KUEUE} the replacement slice is admitted; the old one is finished")
        await self.admit("job-train-b", 6)
        await self.c.merge_patch(
            WORKLOADS,
            NS,
            "job-train-a",
            {
                "status": {
                    "conditions": [
                        _cond("QuotaReserved", "QuotaReserved"),
                        _cond("Admitted", "Admitted"),
                        _cond("Finished", "WorkloadSliceReplaced"),
                    ]
                }
            },
            "status",
        )
        await self.watch_until(6, 6)

        await self.step(
            f"6. Scale down to 3: the Job controller deletes the highest indexes; {KUEUE}"
        )
        say("   lowers the slice's count in place (the admitted count still says 6: the cap is")
        say("   the smaller of the two).")
        await self.c.json_patch(
            WORKLOADS,
            NS,
            "job-train-b",
            [{"op": "replace", "path": "/spec/podSets/0/count", "value": 3}],
        )
        await self.c.merge_patch(JOBS, NS, "train", {"spec": {"parallelism": 3, "completions": 3}})
        await self.watch_until(3, 3)


def run_demo(state_dir: Path | None = None, fast: bool = False) -> int:
    from ungater.devcluster.cluster import LocalControlPlane

    say("ungater demo — a real kube-apiserver, etcd and Job controller on 127.0.0.1.")
    say("Kueue is not running: the steps marked [simulating Kueue] write what Kueue would write.")
    say("Starting the local control plane (the first run builds it from Go modules) ...")
    plane = LocalControlPlane(state_dir=state_dir)
    plane.start()
    work = Path(tempfile.mkdtemp(prefix="ungater-demo-"))
    config = work / "ungater.yaml"
    config.write_text(
        f"namespaces: [{NS}]\nkinds:\n  - {{group: batch, kind: Job}}\n"
        f"server: {{address: '127.0.0.1:0'}}\nleaderElection: {{namespace: {NS}}}\n"
    )
    log_path = work / "ungater.log"
    proc = None
    try:
        say(f"Control plane ready at {plane.server_url}.")
        say(
            f"Starting the controller: ungater run --kubeconfig {plane.kubeconfig_path} --config {config}"
        )
        with log_path.open("w") as log_file:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "ungater.cli",
                    "run",
                    "--kubeconfig",
                    str(plane.kubeconfig_path),
                    "--config",
                    str(config),
                ],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        anyio.run(_scenario, plane.kubeconfig_path, 0.0 if fast else 1.0)
        say()
        say("What the controller logged:")
        for line in log_path.read_text().splitlines():
            if "released" in line or "serving" in line:
                say(f"   {line}")
        say()
        say("Done. `ungater explain NAMESPACE/WORKLOAD` prints why any pod is still gated.")
        return 0
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        plane.stop()


async def _scenario(kubeconfig: Path, pause: float) -> None:
    client = await connect(kubeconfig)
    try:
        await Scenario(client, pause).run()
    finally:
        await client.close()
