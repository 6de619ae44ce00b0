"""The admin's HTTP access to the plane's API server: one TLS context with the admin's client
certificate, one request at a time (no client library: the plane must start without one)."""

from __future__ import annotations

import http.client
import json
import ssl
from pathlib import Path
from typing import Any

__all__ = ["request", "ssl_context"]


def ssl_context(ca: Path, cert: Path, key: Path) -> ssl.SSLContext:
    """Trusting ``ca``, presenting ``cert``/``key``."""
    context = ssl.create_default_context(cafile=str(ca))
    context.load_cert_chain(str(cert), str(key))
    return context


def request(
    port: int,
    context: ssl.SSLContext,
    method: str,
    path: str,
    body: Any = None,
    *,
    content_type: str = "application/json",
    accept: str = "application/json",
    timeout: float = 10.0,
) -> tuple[int, Any]:
    """One request to 127.0.0.1:``port``; returns ``(status, decoded JSON or text)``."""
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=timeout, context=context)
    try:
        headers = {"Accept": accept}
        payload: bytes | None = None
        if body is not None:
            payload = body if isinstance(body, bytes) else json.dumps(body).encode()
            headers["Content-Type"] = content_type
        conn.request(method, path, body=payload, headers=headers)
        response = conn.getresponse()
        raw = response.read()
    finally:
        conn.close()
    try:
        return response.status, json.loads(raw)
    except ValueError:
        return response.status, raw.decode(errors="replace")
