"""etcd for the local control plane: its command line and its health check."""

from __future__ import annotations

import http.client
import json
from pathlib import Path

__all__ = ["args", "healthy"]


def args(binary: Path, *, data_dir: Path, port: int, peer_port: int) -> list[str]:
    """A single-member etcd on 127.0.0.1 with ``fsync`` off (test data only)."""
    client = f"http://127.0.0.1:{port}"
    peer = f"http://127.0.0.1:{peer_port}"
    return [
        str(binary),
        "--name=default",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=default={peer}",
        "--initial-cluster-state=new",
        "--unsafe-no-fsync=true",
        "--log-level=warn",
    ]


def healthy(port: int) -> bool:
    """Whether etcd's ``/health`` says so."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", "/health")
        body = conn.getresponse().read()
    finally:
        conn.close()
    return bool(json.loads(body).get("health") == "true")
