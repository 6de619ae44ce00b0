"""``ungater demo``: a narrated elastic-job scenario on a real local control plane.

It starts etcd, kube-apiserver, kube-controller-manager (the real Job controller creates and
deletes the pods) and the real Kueue of the dev cluster's pin table (``$UNGATER_KUEUE_VERSION``,
else the default; its webhooks suspend and gate the Job, its scheduler admits Workload slices
against a ClusterQueue's quota), then runs ``ungater run`` as a separate process exactly as a
user would.  Nothing is simulated: the demo only does what a user does (create queues and Jobs,
scale, delete) and prints what the cluster shows.

Kueue removes its own gate (``kueue.x-k8s.io/elastic-job``) itself: v0.17.0 from every pod of
an admitted slice, from v0.17.1 its ElasticJobUngater up to the admitted count, in pod name
order; from v0.18 that is on whenever slices are.  So the Job's template carries a second gate
that ungater releases, one pod per admitted slot, lowest completion index first: a pod is
scheduled only once both are gone.  The demo times both on its own watch (``demo_clock``): per
release wave, when each pod lost each gate after the demo saw the slice admitted; and on a slot
freed while a scale-up waits, which pod each releaser chose.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

from ungater._kube.adapter import ApiClientKube, connect
from ungater._kube.client import PODS, Resource
from ungater_devtools.demo_clock import GateClock, wave_table
from ungater_devtools.devcluster.versions import KUEUE_VERSION
from ungater_devtools.kueue_objects import queued_job

__all__ = ["DEMO_GATE", "run_demo"]

NS = "ungater-demo"
QUEUE = "demo"
QUOTA = 6
KUEUE_GATE = "kueue.x-k8s.io/elastic-job"
#: the gate ungater releases in the demo (Kueue releases its own; see the module docstring)
DEMO_GATE = "example.com/ungater"
JOBS = Resource("batch", "v1", "jobs", "Job")
WORKLOADS = Resource("kueue.x-k8s.io", "v1beta2", "workloads", "Workload")
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
CLUSTER_QUEUES = Resource(
    "kueue.x-k8s.io", "v1beta2", "clusterqueues", "ClusterQueue", namespaced=False
)
LOCAL_QUEUES = Resource("kueue.x-k8s.io", "v1beta2", "localqueues", "LocalQueue")
FLAVORS = Resource(
    "kueue.x-k8s.io", "v1beta2", "resourceflavors", "ResourceFlavor", namespaced=False
)


def say(text: str = "") -> None:
    print(text, flush=True)


def _gates(p: dict[str, Any]) -> list[str]:
    return [g["name"] for g in p["spec"].get("schedulingGates") or ()]


def _true(obj: dict[str, Any], kind: str) -> bool:
    return any(
        c.get("type") == kind and c.get("status") == "True"
        for c in (obj.get("status") or {}).get("conditions") or ()
    )


class Scenario:
    def __init__(
        self,
        client: ApiClientKube,
        pause: float,
        admin: Callable[..., Any] | None = None,
        clock: GateClock | None = None,
        leading: Callable[[], bool] = lambda: True,
    ) -> None:
        self.c = client
        self.leading = leading
        self.clock = clock or GateClock(client, NS, (KUEUE_GATE, DEMO_GATE))
        self.timed: set[str] = set()  # the pods already shown in a wave's timings
        self.admin = admin
        self.pause = pause
        self.job: dict[str, Any] = {}
        self._last_table = ""
        self._last_slices = ""
        self.active_slice = ""

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
        return DEMO_GATE not in _gates(p)

    def table(self, pods: list[dict[str, Any]]) -> str:
        rows = ["   index  pod                    ungater's gate  Kueue's gate  state"]
        for p in pods:
            meta = p["metadata"]
            state = "deleting" if meta.get("deletionTimestamp") else p["status"].get("phase", "?")
            ours = "released" if self.released(p) else "gated"
            kueue = "gated" if KUEUE_GATE in _gates(p) else "released"
            rows.append(
                f"   {meta['annotations']['batch.kubernetes.io/job-completion-index']:>5}  "
                f"{meta['name']:<22} {ours:<15} {kueue:<13} {state}"
            )
        return "\n".join(rows)

    async def workloads(self) -> list[dict[str, Any]]:
        """The Job's Workload slices, oldest first."""
        items, _ = await self.c.list_objects(WORKLOADS, NS)
        mine = [
            w
            for w in items
            if any(
                r.get("uid") == self.job["metadata"]["uid"]
                for r in w["metadata"].get("ownerReferences") or ()
            )
        ]
        mine.sort(key=lambda w: (w["metadata"]["creationTimestamp"], w["metadata"]["name"]))
        return mine

    async def slices(self) -> str:
        rows = []
        for w in await self.workloads():
            count = w["spec"]["podSets"][0]["count"]
            admission = (w.get("status") or {}).get("admission") or {}
            assigned = [a.get("count") for a in admission.get("podSetAssignments") or ()]
            if _true(w, "Finished"):
                state = "finished (replaced)"
            elif _true(w, "Admitted"):
                state = f"ADMITTED {assigned[0] if assigned else count}"
                self.active_slice = w["metadata"]["name"]
            else:
                state = "pending: waiting for quota"
            rows.append(f"   slice {w['metadata']['name']:<24} asks for {count:>2}   {state}")
        return "\n".join(rows)

    async def show(self) -> tuple[int, int]:
        pods = [p for p in await self.pods() if not p["metadata"].get("deletionTimestamp")]
        slices = await self.slices()
        table = self.table(pods)
        if not pods and not slices:
            return 0, 0
        if slices != self._last_slices or table != self._last_table:
            if slices != self._last_slices:
                say(slices)
            say(table)
            say()
            self._last_slices, self._last_table = slices, table
        return len(pods), sum(map(self.released, pods))

    async def snapshot(self, caption: str) -> None:
        """Print the slices and pods as they are now, under ``caption``."""
        pods = [p for p in await self.pods() if not p["metadata"].get("deletionTimestamp")]
        slices, table = await self.slices(), self.table(pods)
        say(f"   {caption}")
        say(slices)
        say(table)
        say()
        self._last_slices, self._last_table = slices, table

    async def settle(self, pods: int, slice_count: int, timeout: float = 60) -> None:
        """Wait, printing nothing, until ``pods`` pods are left, all released, and the
        admitted slice asks for ``slice_count``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            left = [p for p in await self.pods() if not p["metadata"].get("deletionTimestamp")]
            admitted = [
                w["spec"]["podSets"][0]["count"]
                for w in await self.workloads()
                if _true(w, "Admitted") and not _true(w, "Finished")
            ]
            if len(left) == pods and all(map(self.released, left)) and admitted == [slice_count]:
                return
            await anyio.sleep(0.1)
        raise RuntimeError(f"expected {pods} released pods and a slice for {slice_count} by now")

    def _uid(self) -> str:
        return str(self.job["metadata"]["uid"])

    def _lifted(self, gate: str) -> int:
        return sum(gate not in p.gates for p in self.clock.live(self._uid()))

    async def wait(self, done: Callable[[], bool], what: str, timeout: float = 60) -> None:
        if not await self.clock.wait_for(done, timeout):
            raise RuntimeError(f"the demo waited {timeout:.0f} s for {what}")

    async def wait_leading(self, timeout: float = 60) -> None:
        """Until the controller leads (its Lease lives in the demo's namespace, made in step
        1), so that the first wave times releases, not the controller's start."""
        deadline = time.monotonic() + timeout
        while not self.leading():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the controller did not lead within {timeout:.0f} s")
            await anyio.sleep(0.1)

    async def wave(self, total: int, what: str) -> None:
        """Wait until the Job has ``total`` pods with both gates off, show them, then time the
        pods this wave released against the moment the demo saw their slice admitted."""
        await self.wait(
            lambda: (
                len(self.clock.live(self._uid())) == total
                and self._lifted(KUEUE_GATE) == self._lifted(DEMO_GATE) == total
            ),
            f"{total} pods with both gates off",
        )
        await self.show()
        admitted = self.clock.admitted
        await self.wait(lambda: self.active_slice in admitted, f"{self.active_slice} admitted")
        zero = admitted[self.active_slice]
        pods = [p for p in self.clock.live(self._uid()) if p.name not in self.timed]
        self.timed.update(p.name for p in pods)
        say(f"   {what}: ms after the demo saw slice {self.active_slice} admitted")
        for row in wave_table(pods, zero, KUEUE_GATE, DEMO_GATE):
            say(row)
        last = {g: max(p.lifted[g] for p in pods) for g in (KUEUE_GATE, DEMO_GATE)}
        say(
            f"   last pod free of Kueue's gate at {(last[KUEUE_GATE] - zero) * 1000:+.0f} ms, "
            f"of ungater's at {(last[DEMO_GATE] - zero) * 1000:+.0f} ms"
        )

    async def freed_slot(self, index: int) -> bool:
        """Delete the pod of ``index`` while the scale-up waits and say which pods each releaser
        then lifted its gate from; whether each lifted one, and not the same one."""
        [victim] = [p for p in self.clock.live(self._uid()) if p.index == index]
        await self.c.delete(PODS, NS, victim.name)
        await self.wait(lambda: victim.deleted is not None, f"{victim.name} deleted")
        gone = victim.deleted or 0.0
        # a Kueue that lifts its gate past the quota (v0.17.1) may never come back to exactly
        # the quota: then the wait ends on its timeout and the lines below say what it did
        await self.clock.wait_for(
            lambda: self._lifted(DEMO_GATE) == QUOTA and self._lifted(KUEUE_GATE) == QUOTA,
            timeout=10,
        )
        picked = {
            gate: [p for p in self.clock.live(self._uid()) if p.lifted.get(gate, 0.0) > gone]
            for gate in (KUEUE_GATE, DEMO_GATE)
        }
        say(f"   The demo saw {victim.name} deleted; then each releaser lifted its gate from:")
        for who, gate in (("ungater", DEMO_GATE), ("Kueue", KUEUE_GATE)):
            for p in picked[gate]:
                say(
                    f"     {who + ':':<9}{p.name} (index {p.index}), "
                    f"{(p.lifted[gate] - gone) * 1000:+.0f} ms after"
                )
            if not picked[gate]:
                say(f"     {who + ':':<9}no pod")
        say()
        await self.wait(
            lambda: any(p.index == index for p in self.clock.live(self._uid())),
            f"the Job controller to recreate index {index}",
            timeout=40,
        )
        [again] = [p for p in self.clock.live(self._uid()) if p.index == index]
        say(
            f"   The Job controller recreated index {index} as {again.name} "
            f"{again.seen - gone:.1f} s later (its backoff"
        )
        say("   after a failed pod). Two seconds on:")
        await self.hold(2.0)
        if {KUEUE_GATE, DEMO_GATE} <= again.gates:
            say(f"   {again.name} keeps both gates: the slot went to other pods before it came.")
        [kueue, ours] = (picked[KUEUE_GATE], picked[DEMO_GATE])
        return len(kueue) == len(ours) == 1 and kueue[0] is not ours[0]

    async def hold(self, seconds: float) -> None:
        """Keep printing changes for a while (the state should not move)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            await self.show()
            await anyio.sleep(0.1)

    async def delete_job(self, name: str) -> None:
        """Delete a Job with its pods and Workload, as ``kubectl delete job`` does (the API's
        default for Jobs orphans them, and an orphaned Workload keeps its quota)."""
        path = f"/apis/batch/v1/namespaces/{NS}/jobs/{name}"
        options = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        if self.admin is None:
            await self.c.delete(JOBS, NS, name)
            return
        admin = self.admin
        status, body = await anyio.to_thread.run_sync(lambda: admin("DELETE", path, options))
        if status not in (200, 202):
            raise RuntimeError(f"deleting Job {name}: HTTP {status}: {body}")

    async def pending_slice(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "pending" in await self.slices():
                return
            await anyio.sleep(0.1)
        raise RuntimeError("Kueue made no scale-up slice")

    async def queues(self) -> None:
        await self.c.create(
            NAMESPACES, None, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}
        )
        await self.c.create(
            FLAVORS,
            None,
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "ResourceFlavor",
                "metadata": {"name": "default-flavor"},
            },
        )
        await self.c.create(
            CLUSTER_QUEUES,
            None,
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "ClusterQueue",
                "metadata": {"name": QUEUE},
                "spec": {
                    "namespaceSelector": {},
                    "resourceGroups": [
                        {
                            "coveredResources": ["cpu"],
                            "flavors": [
                                {
                                    "name": "default-flavor",
                                    "resources": [{"name": "cpu", "nominalQuota": str(QUOTA)}],
                                }
                            ],
                        }
                    ],
                },
            },
        )
        await self.c.create(
            LOCAL_QUEUES,
            NS,
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "LocalQueue",
                "metadata": {"name": QUEUE, "namespace": NS},
                "spec": {"clusterQueue": QUEUE},
            },
        )

    async def run(self) -> None:
        await self.step(f"1. An admin gives the team a ClusterQueue with a quota of {QUOTA} CPUs")
        await self.queues()
        say(f"   ClusterQueue {QUEUE!r}: {QUOTA} CPUs; LocalQueue {QUEUE!r} in namespace {NS}.")
        say("   Every pod below asks for 1 CPU, so at most 6 pods fit at once.")

        await self.step("2. Another team's Job takes 3 CPUs of the quota")
        await self.c.create(JOBS, NS, queued_job("other", 3, elastic=False, queue=QUEUE))
        say("   Kueue admits it (3 of 6 CPUs used).")

        await self.step("3. A user creates an elastic Indexed Job with 3 pods")
        say("   Kueue's webhook suspends it and adds Kueue's gate to the pod template; the")
        say(f"   template also has ungater's gate {DEMO_GATE}. Kueue admits a Workload slice")
        say("   for 3 pods (6 of 6 CPUs used) and the Job controller creates 3 pods with both")
        say("   gates. Kueue lifts its own gate, ungater its own: a pod can be scheduled only")
        say("   once both are off. The timings are the demo's: it watches pods and Workloads")
        say("   and notes on its own monotonic clock when it saw the slice admitted, each pod")
        say("   appear and each gate go (the Admitted condition's timestamp has 1 s resolution).")
        await self.wait_leading()
        self.job = await self.c.create(
            JOBS, NS, queued_job("train", 3, gate=DEMO_GATE, queue=QUEUE)
        )
        await self.wave(3, "Initial admission")

        await self.step("4. The user scales the Job up to 6: the quota says no")
        say("   The Job controller adds 3 pods with both gates. Kueue makes a scale-up slice")
        say("   that asks for the new total, 6, but 6 + 3 CPUs exceed the quota: it stays")
        say("   pending, and neither releaser lifts a gate from the new pods.")
        await self.c.merge_patch(JOBS, NS, "train", {"spec": {"parallelism": 6, "completions": 6}})
        await self.pending_slice()
        await self.wait(lambda: len(self.clock.live(self._uid())) == 6, "6 pods")
        await self.hold(max(self.pause, 1.0))

        await self.step("5. The other team's Job is deleted: its 3 CPUs come back")
        say("   Kueue admits the scale-up slice (and marks the old one finished); both")
        say("   releasers lift their gates from the 3 new pods, indexes 3 to 5:")
        await self.delete_job("other")
        await self.wave(6, "Scale-up admission")

        await self.step("6. Scale up to 12 while the quota is full, then one slot frees")
        say("   Kueue makes a slice for 12 that stays pending; the 6 new pods keep both gates.")
        await self.c.merge_patch(
            JOBS, NS, "train", {"spec": {"parallelism": 12, "completions": 12}}
        )
        await self.pending_slice()
        await self.wait(lambda: len(self.clock.live(self._uid())) == 12, "12 pods")
        await self.show()
        say("   The user deletes the pod of index 5: its CPU is free under the admitted")
        say("   slice for 6, so each releaser lifts its gate from one waiting pod. Kueue")
        say("   takes the lowest pod name, ungater the lowest waiting completion index.")
        if await self.freed_slot(5):
            say("   Each releaser lifted its gate from a different pod, so neither of the two")
            say("   has both gates off: neither can be scheduled, while the quota counts the")
            say("   slot as used.")
        else:
            say("   This Kueue did not lift its gate from one pod other than ungater's.")
        say("   On ONE gate, two releasers do worse: each counts the other's releases only")
        say("   once its cache shows them, so between them they can release past what Kueue")
        say("   admitted. So ungater must be the only releaser of a gate: beside Kueue's own")
        say("   gate, `mode: auto` releases it only while the shipped admission policy")
        say("   refuses it to Kueue (docs/kueue-ungater.md).")

        await self.step("7. Scale down to 3")
        say("   The Job controller deletes the pods above index 2; Kueue lowers the pending")
        say("   slice to 3, admits it and finishes the old one. The pods left keep both gates")
        say("   off.")
        await self.snapshot("Before the scale-down:")
        await self.c.merge_patch(JOBS, NS, "train", {"spec": {"parallelism": 3, "completions": 3}})
        await self.settle(pods=3, slice_count=3)
        await self.snapshot("After it:")


def run_demo(state_dir: Path | None = None, fast: bool = False) -> int:
    """Run the scenario; everything it made is gone afterwards, on success or failure alike:
    the controller process, the control plane (its temporary state directory unless
    ``state_dir`` is given) and the directory holding the demo's config and log."""
    from ungater_devtools.devcluster.environment import LocalControlPlane

    say("ungater demo: a real kube-apiserver, etcd, Job controller and Kueue on 127.0.0.1.")
    say("Starting them (the first run builds them from Go modules; then about a minute) ...")
    plane = LocalControlPlane(state_dir=state_dir, peers=("kueue",), peer_options={"log": say})
    try:
        plane.start()
        with tempfile.TemporaryDirectory(prefix="ungater-demo-") as work:
            return _run_with_controller(plane, Path(work), fast)
    finally:
        plane.stop()


def _run_with_controller(plane: Any, work: Path, fast: bool) -> int:
    config = work / "ungater.yaml"
    config.write_text(
        f"namespaces: [{NS}]\ngate: {DEMO_GATE}\nkinds:\n  - {{group: batch, kind: Job}}\n"
        f"server: {{address: '127.0.0.1:0'}}\nleaderElection: {{namespace: {NS}}}\n"
    )
    log_path = work / "ungater.log"
    proc = None
    try:
        kueue = plane.peers.kueue_version if plane.peers is not None else "?"
        say(
            f"Control plane ready at {plane.server_url}; Kueue {kueue} runs as its own "
            "service account."
        )
        if kueue != KUEUE_VERSION:
            say(
                f"The narration below is written for Kueue {KUEUE_VERSION}; Kueue {kueue} "
                "releases its own gate differently (docs/kueue-ungater.md): trust the tables."
            )
        say(
            f"Starting the controller: ungater run --kubeconfig {plane.kubeconfig_path} "
            f"--config {config}"
        )
        with log_path.open("w") as log_file:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "ungater",
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
        active = anyio.run(
            _scenario,
            plane,
            0.0 if fast else 1.0,
            lambda: "leading (term" in log_path.read_text(),
        )
        say()
        say("What the controller logged:")
        for line in log_path.read_text().splitlines():
            if "released" in line or "serving" in line:
                say(f"   {line}")
        say()
        say(f"Why is each pod (not) released? `ungater explain {NS}/{active}`:")
        explained = subprocess.run(
            [
                sys.executable,
                "-m",
                "ungater",
                "explain",
                f"{NS}/{active}",
                "--kubeconfig",
                str(plane.kubeconfig_path),
                "--config",
                str(config),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        for line in (explained.stdout + explained.stderr).splitlines():
            say(f"   {line}")
        say()
        say("Done.")
        return 0
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


async def _scenario(plane: Any, pause: float, leading: Callable[[], bool]) -> str:
    client = await connect(plane.kubeconfig_path)
    try:
        scenario = Scenario(client, pause, plane.request, leading=leading)
        async with anyio.create_task_group() as tg:
            tg.start_soon(scenario.clock.run, PODS, WORKLOADS)
            await scenario.run()
            tg.cancel_scope.cancel()
        await scenario.slices()
        return scenario.active_slice
    finally:
        await client.close()
