"""The HTTP endpoint of the process: ``/metrics`` for Prometheus, ``/healthz`` and ``/readyz`` for
the kubelet's probes.

It owns only the HTTP side; what "healthy" and "ready" mean is decided by the callables it is
given (ready: the caches have synced; healthy: the process is doing its job), so the probes can
be tested without a controller. It runs on the controller's event loop (aiohttp's server), binds
port 0 to a free port for tests, and a probe callable that raises answers as failing instead of
taking the server down.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import TracebackType

from aiohttp import web

from ungater._observe.metrics import Metrics

__all__ = ["HealthServer", "parse_address"]

log = logging.getLogger("ungater.server")


def parse_address(address: str) -> tuple[str, int]:
    """``":8080"`` → ("", 8080) (all interfaces); ``"127.0.0.1:0"``, ``"[::1]:9090"``."""
    host, sep, port = address.strip().rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected [host]:port, got {address!r}")
    return host.removeprefix("[").removesuffix("]"), int(port)


class HealthServer:
    """``/metrics``, ``/healthz`` (200 "ok" or 500) and ``/readyz`` (200 "ok" or 503, followed
    by the ``detail`` lines: each kind's mode, a stand-down, the admission policy found).

    ``host`` "" binds every interface. After ``start()``, ``port`` is the bound port (useful
    with port 0). Use ``async with HealthServer(...)`` or ``start()``/``stop()``.
    """

    def __init__(
        self,
        host: str,
        port: int,
        metrics: Metrics,
        ready: Callable[[], bool],
        healthy: Callable[[], bool],
        detail: Callable[[], list[str]] | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.metrics = metrics
        self._ready = ready
        self._healthy = healthy
        self._detail = detail
        self._runner: web.AppRunner | None = None

    @classmethod
    def from_address(
        cls,
        address: str,
        metrics: Metrics,
        ready: Callable[[], bool],
        healthy: Callable[[], bool],
        detail: Callable[[], list[str]] | None = None,
    ) -> HealthServer:
        host, port = parse_address(address)
        return cls(host, port, metrics, ready, healthy, detail)

    # -- handlers -------------------------------------------------------------------------------

    async def _metrics(self, request: web.Request) -> web.Response:
        try:
            body, content_type = self.metrics.render_for(request.headers.get("Accept", ""))
        except Exception:
            log.exception("rendering metrics failed")
            return web.Response(status=500, text="metrics unavailable\n")
        return web.Response(body=body, headers={"Content-Type": content_type})

    @staticmethod
    def _probe(check: Callable[[], bool], failing: int, what: str) -> web.Response:
        try:
            ok = bool(check())
        except Exception as exc:
            log.warning("%s probe failed: %r", what, exc)
            ok = False
        if ok:
            return web.Response(text="ok\n")
        return web.Response(status=failing, text=f"not {what}\n")

    async def _healthz(self, request: web.Request) -> web.Response:
        return self._probe(self._healthy, 500, "healthy")

    async def _readyz(self, request: web.Request) -> web.Response:
        response = self._probe(self._ready, 503, "ready")
        if self._detail is not None:
            try:
                lines = list(self._detail())
            except Exception as exc:  # detail is informative: it never fails the probe
                lines = [f"detail unavailable: {exc!r}"]
            if lines:
                response.text = (response.text or "") + "".join(f"{line}\n" for line in lines)
        return response

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        host = self.host or "127.0.0.1"
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"

    async def start(self) -> None:
        if self._runner is not None:
            return
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.host or None, self.port)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        addresses = runner.addresses
        if addresses:
            self.port = int(addresses[0][1])
        log.debug("listening on %s:%d", self.host or "*", self.port)

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> HealthServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
