"""Controller replicas as processes (``ungater run``) on the real API server, and the Lease they
elect a leader through."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from tests.integration.k8s import Kube
from ungater._kube.client import Resource
from ungater._model.config import DEFAULT_GATE, default_lease_name

LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease")


LEASE_S = 4.0


class Replica:
    def __init__(
        self,
        name: str,
        kubeconfig: Path,
        ns: str,
        tmp: Path,
        *,
        lease: str = "",
        env: dict[str, str] | None = None,
    ) -> None:
        """``lease``: a Lease name in the default namespace (else our test namespace and the
        derived name); ``env``: replaces the environment's POD_* variables."""
        self.name = name
        self.log = tmp / f"{name}.log"
        cfg = tmp / f"{name}.yaml"
        where = f"leaseName: {lease}" if lease else f"namespace: {ns}"
        cfg.write_text(
            f"namespaces: [{ns}]\nserver: {{address: '127.0.0.1:0'}}\nmode: release\n"
            f"leaderElection: {{{where}, identity: {name}, leaseDurationSeconds: {LEASE_S},"
            " renewDeadlineSeconds: 3, retryPeriodSeconds: 1}\n"
        )
        base = {k: v for k, v in os.environ.items() if not k.startswith("POD_")}
        environment = {**base, **(env or {}), "PYTHONUNBUFFERED": "1"}
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "ungater",
                    "run",
                    "--kubeconfig",
                    str(kubeconfig),
                    "--config",
                    str(cfg),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=environment,
            )

    def url(self) -> str | None:
        m = re.search(r"serving /metrics, /healthz, /readyz on (http://\S+)", self.log.read_text())
        return m.group(1) if m else None

    def get(self, path: str) -> tuple[int, str]:
        url = self.url()
        assert url, self.log.read_text()
        try:
            with urllib.request.urlopen(url + path, timeout=5) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout=10)


async def holder(kube: Kube, ns: str, name: str = default_lease_name([DEFAULT_GATE])) -> str:
    lease = await kube.get(LEASES, ns, name)
    return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")


def is_leader(replica: Replica) -> bool:
    metrics = replica.get("/metrics")[1]
    assert re.search(r"^ungater_leader [01]\.0$", metrics, re.M), metrics
    return "\nungater_leader 1.0" in metrics
