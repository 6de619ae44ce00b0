"""A loopback HTTPS reverse proxy in front of the real API server that can hold one request,
one answer, or the watch streams of a resource: the faults a byte-level proxy cannot aim,
because under TLS it cannot tell a PATCH from a watch.

It serves with a certificate issued by the control plane's own CA, so a kubeconfig that points
at it needs only another server address (``tcpproxy.kubeconfig_via``), and it talks to the API
server as the admin. Responses are streamed chunk by chunk, so watches work through it; it
records every request and every watch event it passed on, which tests use as positive signals
("the standby has seen this deletion", "the new leader listed the owner's pods").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from ungater_devtools.devcluster.pki import CertificateAuthority

# not forwarded either way: they belong to one hop; Accept-Encoding is dropped so that watch
# bytes stay readable (the proxy parses them) and no answer needs re-encoding
_HOP = {
    "host",
    "connection",
    "keep-alive",
    "transfer-encoding",
    "content-length",
    "accept-encoding",
    "upgrade",
    "proxy-connection",
}


def target(path: str) -> tuple[str, str]:
    """(resource plural, object name or "") of an API path; subresources are ignored."""
    parts = [p for p in path.split("/") if p]
    rest = parts[2:] if parts[:1] == ["api"] else parts[3:]
    if rest[:1] == ["namespaces"] and len(rest) >= 3:
        rest = rest[2:]
    return (rest[0] if rest else "", rest[1] if len(rest) > 1 else "")


def is_watch(query: Any) -> bool:
    return str(query.get("watch", "")).lower() in ("1", "true")


@dataclass
class Seen:
    """One request the proxy received, and the API server's status for it (0: none yet)."""

    method: str
    resource: str
    name: str
    query: dict[str, str]
    at: float  # time.monotonic() when it arrived
    status: int = 0


@dataclass
class WatchEvent:
    """A watch event the proxy passed on to its client."""

    resource: str
    type: str
    name: str
    uid: str
    resource_version: str
    at: float


@dataclass
class Held:
    """A request the proxy holds: before forwarding it (``hold_request``) or after, with the API
    server's answer kept from the client (``hold_response``)."""

    method: str
    resource: str
    name: str  # "" matches any object of the resource
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    answered: asyncio.Event = field(default_factory=asyncio.Event)
    released: asyncio.Event = field(default_factory=asyncio.Event)
    target: str = ""  # the name of the object the request was for, once it arrived
    body: bytes = b""  # the request's body, once it arrived
    status: int = 0  # the API server's status, once answered
    answer: bytes = b""
    client_gone: bool = False  # the client closed its connection before it got an answer

    def matches(self, method: str, resource: str, name: str) -> bool:
        return (method, resource) == (self.method, self.resource) and self.name in ("", name)

    def release(self) -> None:
        self.released.set()

    def request_json(self) -> Any:
        return json.loads(self.body)


class HttpProxy:
    def __init__(
        self, upstream: str, ca: Path, client_cert: Path, client_key: Path, pki_dir: Path
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.requests: list[Seen] = []
        self.watch_events: list[WatchEvent] = []
        self.port = 0
        self._upstream_ssl = ssl.create_default_context(cafile=str(ca))
        self._upstream_ssl.load_cert_chain(str(client_cert), str(client_key))
        issued = CertificateAuthority.load(pki_dir).issue(
            f"test-proxy-{secrets.token_hex(4)}",
            common_name="ungater-test-proxy",
            ip_addresses=["127.0.0.1"],
            server=True,
        )
        self._serving_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._serving_ssl.load_cert_chain(str(issued.cert_path), str(issued.key_path))
        self._before: list[Held] = []  # held before forwarding, first match each
        self._after: list[Held] = []  # forwarded, answer held, first match each
        self._flowing: dict[str, asyncio.Event] = {}  # per resource: its watches may flow
        self._tasks: set[asyncio.Task[Any]] = set()
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None

    # -- rules -----------------------------------------------------------------------------------

    def hold_request(self, method: str, resource: str, name: str = "") -> Held:
        """Hold the next matching request until ``release()``, then send it to the API server
        (even if its client has given up meanwhile: the late write the server still commits)."""
        held = Held(method, resource, name)
        self._before.append(held)
        return held

    def hold_response(self, method: str, resource: str, name: str = "") -> Held:
        """Send the next matching request at once; keep the API server's answer from the client
        until ``release()`` (the write is committed, the client does not know yet)."""
        held = Held(method, resource, name)
        self._after.append(held)
        return held

    def hold_watches(self, resource: str) -> asyncio.Event:
        """Stop passing on the bytes of every watch of ``resource`` (open now or later); set the
        returned event to let them flow again, in order, as a lagging watch catches up."""
        flowing = self._flowing.setdefault(resource, asyncio.Event())
        flowing.clear()
        return flowing

    def events_of(self, resource: str, name: str = "", type: str = "") -> list[WatchEvent]:
        return [
            e
            for e in self.watch_events
            if e.resource == resource and name in ("", e.name) and type in ("", e.type)
        ]

    # -- serving ---------------------------------------------------------------------------------

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self._upstream_ssl),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            auto_decompress=False,
        )
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # handlers still streaming a watch when the proxy stops are cancelled after 1 s
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self._serving_ssl)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        for flowing in self._flowing.values():
            flowing.set()
        for held in self._before + self._after:
            held.release()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        if self._session is not None:
            await self._session.close()  # ends the watches streaming through us
        if self._runner is not None:
            await self._runner.cleanup()

    def _take(self, rules: list[Held], method: str, resource: str, name: str) -> Held | None:
        for held in rules:
            if held.matches(method, resource, name):
                rules.remove(held)
                return held
        return None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        resource, name = target(request.path)
        seen = Seen(request.method, resource, name, dict(request.query), time.monotonic())
        self.requests.append(seen)
        body = await request.read()
        before = self._take(self._before, request.method, resource, name)
        held = before or self._take(self._after, request.method, resource, name)
        if held is not None:
            held.target, held.body = name, body
            held.arrived.set()
            # its own task, so that the write goes on whatever becomes of the client
            task = asyncio.ensure_future(self._held(request, seen, body, held, held is before))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            status, headers, answer = await asyncio.shield(task)
            return web.Response(status=status, headers=headers, body=answer)
        response = web.StreamResponse()
        try:
            async with self._forward(request, body) as upstream:
                seen.status = upstream.status
                response.set_status(upstream.status)
                response.headers.update(_kept(upstream.headers))
                await response.prepare(request)
                watch = is_watch(request.query) and upstream.status == 200
                rest = b""
                async for chunk in upstream.content.iter_any():
                    flowing = self._flowing.get(resource) if watch else None
                    if flowing is not None:
                        await flowing.wait()  # a held watch: nothing passes until released
                    await response.write(chunk)
                    if watch:
                        rest = self._record(resource, rest + chunk)
                await response.write_eof()
        except (ConnectionError, aiohttp.ClientError):
            # one side went away (a killed client, the proxy stopping): so does this request
            if not response.prepared:
                return web.Response(status=502, text="the proxy lost the API server")
        return response

    async def _held(
        self, request: web.Request, seen: Seen, body: bytes, held: Held, before: bool
    ) -> tuple[int, dict[str, str], bytes]:
        if before:
            await held.released.wait()
        async with self._forward(request, body) as upstream:
            held.answer = await upstream.read()
            seen.status = held.status = upstream.status
            headers = _kept(upstream.headers)
        held.answered.set()
        if not before:
            await held.released.wait()
        transport = request.transport
        held.client_gone = transport is None or transport.is_closing()
        return held.status, headers, held.answer

    @contextlib.asynccontextmanager
    async def _forward(
        self, request: web.Request, body: bytes
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        async with self._session.request(
            request.method,
            self.upstream + request.rel_url.path_qs,
            headers=headers,
            data=body or None,
        ) as upstream:
            yield upstream

    def _record(self, resource: str, data: bytes) -> bytes:
        """Note every whole watch event line in ``data``; return the unfinished rest."""
        *whole, rest = data.split(b"\n")
        for line in whole:
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except ValueError:
                continue
            meta = (event.get("object") or {}).get("metadata") or {}
            self.watch_events.append(
                WatchEvent(
                    resource,
                    str(event.get("type", "")),
                    str(meta.get("name", "")),
                    str(meta.get("uid", "")),
                    str(meta.get("resourceVersion", "")),
                    time.monotonic(),
                )
            )
        return rest


def _kept(headers: Any) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in _HOP}


@contextlib.asynccontextmanager
async def http_proxy(plane: Any) -> AsyncIterator[HttpProxy]:
    """An ``HttpProxy`` in front of ``plane`` (a ``LocalControlPlane``), stopped on exit."""
    proxy = HttpProxy(
        plane.server_url, plane.ca_path, plane.admin_cert_path, plane.admin_key_path, plane.pki_dir
    )
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.stop()
