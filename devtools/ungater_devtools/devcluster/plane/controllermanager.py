"""kube-controller-manager for the local control plane, so that the real Job controller
creates pods: which controllers run, its kubeconfig, command line and health check."""

from __future__ import annotations

import http.client
import ssl
from collections.abc import Sequence
from pathlib import Path

from ungater_devtools.devcluster import pki
from ungater_devtools.devcluster.plane.apiserver import SERVICE_CLUSTER_IP_RANGE

__all__ = ["DEFAULT_CONTROLLERS", "args", "healthy", "write_kubeconfig"]

#: Controllers run by kube-controller-manager: pods for Jobs, owner-reference cleanup, and
#: namespace deletion (so that per-test namespaces really go away).
DEFAULT_CONTROLLERS: tuple[str, ...] = (
    "job-controller",
    "garbage-collector-controller",
    "namespace-controller",
)

_NAME = "kube-controller-manager"


def write_kubeconfig(state_dir: Path, pki_dir: Path, *, server_url: str) -> Path:
    """Its kubeconfig, with the client certificate the plane issued it."""
    return pki.write_kubeconfig(
        state_dir / f"{_NAME}.kubeconfig",
        server=server_url,
        ca_path=pki_dir / "ca.crt",
        client=pki.IssuedCert(pki_dir / f"{_NAME}.crt", pki_dir / f"{_NAME}.key"),
        user=f"system:{_NAME}",
    )


def args(
    binary: Path, *, kubeconfig: Path, port: int, pki_dir: Path, controllers: Sequence[str]
) -> list[str]:
    """The controllers named, acting as itself (no per-controller service accounts)."""
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--tls-cert-file={pki_dir / 'apiserver.crt'}",
        f"--tls-private-key-file={pki_dir / 'apiserver.key'}",
        f"--client-ca-file={pki_dir / 'ca.crt'}",
        f"--controllers={','.join(controllers)}",
        "--use-service-account-credentials=false",
        "--leader-elect=false",
        "--profiling=false",
        # The defaults (20 QPS, 5 Job syncs) are sized for a shared production API server;
        # tests create and delete hundreds of pods at once and must not wait on them.
        "--kube-api-qps=500",
        "--kube-api-burst=1000",
        "--concurrent-job-syncs=20",
        "--concurrent-gc-syncs=40",
        f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
    ]


def healthy(port: int, context: ssl.SSLContext) -> bool:
    """Whether its ``/healthz`` answers 200."""
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=3, context=context)
    try:
        conn.request("GET", "/healthz")
        response = conn.getresponse()
        response.read()
        return response.status == 200
    finally:
        conn.close()
