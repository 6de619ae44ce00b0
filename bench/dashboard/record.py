"""Records real metrics for the dashboard picture: two ``ungater run`` replicas beside the real
Kueue on the local control plane, scraped every two seconds while elastic Jobs grow, wait for
quota, shrink, finish pods and lose their leader.

Kueue releases its own gate; the Jobs' templates carry a second gate, ``example.com/ungater``,
that only ungater releases (the side-by-side setup of the real-peer tests), so nothing here
fights over a gate. Every scrape is written to ``<out>/<namespace>__<pod>/<unix ms>.prom``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

GATE = "example.com/ungater"
NAMESPACE = "ml-team"
CLUSTER_QUEUE = "cq-ml-team"
JOBS = "/apis/batch/v1/namespaces/" + NAMESPACE + "/jobs"
PODS = "/api/v1/namespaces/" + NAMESPACE + "/pods"
SCRAPE_S = 2.0


class Replica:
    """One ``ungater run`` process and its log."""

    def __init__(self, name: str, kubeconfig: Path, out: Path) -> None:
        self.name = name
        self.log = out / f"{name}.log"
        config = out / f"{name}.yaml"
        config.write_text(
            f"namespaces: [{NAMESPACE}]\ngate: {GATE}\nkinds: [{{group: batch, kind: Job}}]\n"
            "server: {address: '127.0.0.1:0'}\nlogging: {format: json}\n"
            f"leaderElection: {{leaseName: ungater-dashboard, identity: {name},"
            " leaseDurationSeconds: 6, renewDeadlineSeconds: 4, retryPeriodSeconds: 1}\n"
        )
        with self.log.open("w") as sink:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "ungater",
                    "run",
                    "--kubeconfig",
                    str(kubeconfig),
                    "--config",
                    str(config),
                ],
                stdout=sink,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1", "POD_NAME": name},
            )

    def url(self) -> str | None:
        found = re.search(
            r"serving /metrics, /healthz, /readyz on (http://[^\s\"]+)", self.log.read_text()
        )
        return found.group(1) if found else None

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


class Scraper(threading.Thread):
    def __init__(self, replicas: Callable[[], list[Replica]], out: Path) -> None:
        super().__init__(daemon=True)
        self.replicas, self.out, self.done = replicas, out, threading.Event()

    def run(self) -> None:
        while not self.done.wait(SCRAPE_S):
            now = int(time.time() * 1000)
            for r in self.replicas():
                url = r.url() if r.proc.poll() is None else None
                if not url:
                    continue
                try:
                    with urllib.request.urlopen(url + "/metrics", timeout=2) as resp:
                        text = resp.read()
                except OSError:
                    continue
                target = self.out / f"ungater-system__{r.name}"
                target.mkdir(parents=True, exist_ok=True)
                (target / f"{now}.prom").write_bytes(text)


def record(out: Path, *, say: Callable[[str], None] = print) -> None:
    from ungater_devtools.devcluster.environment import LocalControlPlane
    from ungater_devtools.kueue_objects import (
        create_default_flavor,
        create_queues,
        queued_job,
        set_quota,
    )

    out.mkdir(parents=True, exist_ok=True)
    with LocalControlPlane(peers=True) as plane:
        create_default_flavor(plane)

        def call(method: str, path: str, body: Any = None, **kw: Any) -> Any:
            status, answer = plane.request(method, path, body, **kw)
            if status >= 300:
                raise RuntimeError(f"{method} {path}: HTTP {status}: {answer}")
            return answer

        call(
            "POST",
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        )
        create_queues(plane, NAMESPACE, cluster_queue=CLUSTER_QUEUE, cpu=8)
        replicas = [Replica(n, plane.kubeconfig_path, out) for n in ("ungater-a", "ungater-b")]
        scraper = Scraper(lambda: list(replicas), out)
        scraper.start()

        def scale(name: str, n: int) -> None:
            call(
                "PATCH",
                f"{JOBS}/{name}",
                {"spec": {"parallelism": n}},
                content_type="application/merge-patch+json",
            )

        def finish(name: str, count: int) -> None:
            pods = call("GET", f"{PODS}?labelSelector=batch.kubernetes.io/job-name={name}")["items"]
            released = [
                p
                for p in pods
                if GATE not in {g["name"] for g in p["spec"].get("schedulingGates") or ()}
            ]
            for pod in released[:count]:
                call(
                    "PATCH",
                    f"{PODS}/{pod['metadata']['name']}/status",
                    {"status": {"phase": "Succeeded"}},
                    content_type="application/merge-patch+json",
                )

        steps: list[tuple[float, str, Callable[[], None]]] = [
            (
                10,
                "four elastic Jobs of 2 pods each fill the 8-CPU quota",
                lambda: [
                    call("POST", JOBS, queued_job(f"train-{i}", 2, 12, gate=GATE)) for i in range(4)
                ],
            ),
            (40, "train-0 grows to 5: its slice waits for quota", lambda: scale("train-0", 5)),
            (
                70,
                "the quota grows to 12: the slice is admitted",
                lambda: set_quota(plane, CLUSTER_QUEUE, 12),
            ),
            (
                100,
                "pods of train-1 succeed: the next indexes are released",
                lambda: finish("train-1", 2),
            ),
            (
                125,
                "the leader gets SIGTERM: the standby takes over",
                lambda: _stop_leader(replicas, out, plane.kubeconfig_path),
            ),
            (
                150,
                "train-2 grows to 3, train-3 shrinks to 1",
                lambda: (scale("train-2", 3), scale("train-3", 1)),
            ),
            (
                180,
                "train-0 shrinks to 2, pods of train-2 succeed",
                lambda: (scale("train-0", 2), finish("train-2", 2)),
            ),
        ]
        started = time.monotonic()
        try:
            for at, what, act in steps:
                time.sleep(max(0.0, started + at - time.monotonic()))
                say(f"[{at:4.0f}s] {what}")
                act()
            time.sleep(max(0.0, started + 215 - time.monotonic()))
        finally:
            scraper.done.set()
            scraper.join(timeout=10)
            for r in replicas:
                r.stop()


def _stop_leader(replicas: list[Replica], out: Path, kubeconfig: Path) -> None:
    for r in replicas:
        if r.proc.poll() is None and r.url():
            with urllib.request.urlopen(r.url() + "/metrics", timeout=2) as resp:  # type: ignore[operator]
                if b"\nungater_leader 1.0" in resp.read():
                    r.stop()
                    replicas.append(
                        Replica(r.name + "-2", kubeconfig, out)
                    )  # the rollout's new pod
                    return
