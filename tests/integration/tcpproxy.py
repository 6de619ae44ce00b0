"""A loopback TCP proxy between the controller and the API server that can cut every
connection on demand: the watch-cut fault, without touching the API server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import yaml


class CuttingProxy:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.cuts = 0
        self._conns: set[asyncio.StreamWriter] = set()
        self._server: asyncio.base_events.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._conns.update((writer, up_writer))
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            self._conns.discard(writer)
            self._conns.discard(up_writer)

    def cut_all(self) -> int:
        """Abort every open connection (as a load balancer dropping them would)."""
        n = 0
        for w in list(self._conns):
            transport = w.transport
            if transport is not None and not transport.is_closing():
                transport.abort()
                n += 1
        self.cuts += 1
        return n

    async def stop(self) -> None:
        self.cut_all()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


def kubeconfig_via(kubeconfig: Path, port: int, out: Path) -> Path:
    """A copy of ``kubeconfig`` whose server is the proxy on ``port``."""
    cfg = yaml.safe_load(kubeconfig.read_text())
    for cluster in cfg["clusters"]:
        cluster["cluster"]["server"] = f"https://127.0.0.1:{port}"
    out.write_text(yaml.safe_dump(cfg))
    return out


@contextlib.asynccontextmanager
async def proxied(target_port: int) -> AsyncIterator[CuttingProxy]:
    proxy = CuttingProxy(target_port)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.stop()
