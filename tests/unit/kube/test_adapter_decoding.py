"""How the production client reads JSON (ungater._kube.adapter): watch lines split across and
within chunks, answers parsed by orjson, and what orjson refuses read as ``json.loads`` reads it."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import anyio
import pytest

from ungater._kube.adapter import ApiClientKube, loads
from ungater._kube.client import PODS, ApiError, GoneError

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class _Content:
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = list(chunks)

    async def readany(self) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""


class _Response:
    def __init__(self, chunks: list[bytes], status: int = 200) -> None:
        self.status = status
        self.reason = "OK"
        self.content = _Content(chunks)
        self.closed = False

    async def read(self) -> bytes:
        return b"".join(self.content.chunks)

    def release(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class _Client(ApiClientKube):
    def __init__(self, resp: _Response) -> None:
        super().__init__(api_client=None)
        self.resp = resp

    async def _request(self, *args: Any, **kwargs: Any) -> Any:
        return self.resp


def _event(i: int, kind: str = "MODIFIED") -> dict[str, Any]:
    return {"type": kind, "object": {"metadata": {"name": f"p{i}", "resourceVersion": str(i)}}}


async def _watch(chunks: list[bytes]) -> tuple[list[dict[str, Any]], _Response]:
    resp = _Response(chunks)
    events = [e async for e in _Client(resp).watch(PODS, "ns", "1")]
    return events, resp


async def test_every_event_is_read_however_the_stream_is_cut() -> None:
    events = [_event(i) for i in range(50)]
    stream = b"".join(json.dumps(e).encode() + b"\n" for e in events) + b"\n  \n"
    for size in (1, 7, 100, len(stream)):
        chunks = [stream[i : i + size] for i in range(0, len(stream), size)]
        got, resp = await _watch(chunks)
        assert got == events, size
        assert resp.closed


async def test_an_unfinished_last_line_is_not_an_event() -> None:
    line = json.dumps(_event(1)).encode()
    got, _ = await _watch([line + b"\n" + line[:10]])
    assert got == [_event(1)]


async def test_error_events_raise_gone_and_api_errors() -> None:
    gone = {"type": "ERROR", "object": {"code": 410, "message": "too old"}}
    with pytest.raises(GoneError):
        await _watch([json.dumps(_event(1)).encode() + b"\n" + json.dumps(gone).encode() + b"\n"])
    other = {"type": "ERROR", "object": {"code": 500, "message": "boom"}}
    with pytest.raises(ApiError) as exc:
        await _watch([json.dumps(other).encode() + b"\n"])
    assert exc.value.status == 500


def test_loads_reads_what_the_standard_library_reads() -> None:
    doc = {"a": [1, 2.5, "é", None, True], "b": {"c": -(2**63)}, "d": 2**64 - 1}
    raw = json.dumps(doc, ensure_ascii=False).encode()
    assert loads(raw) == json.loads(raw) == doc
    assert loads(raw.decode()) == doc
    # what orjson refuses and json.loads takes
    assert math.isnan(loads(b'{"x": NaN}')["x"])
    assert loads(b'"\\ud800"') == "\ud800"
    with pytest.raises(ValueError):
        loads(b"{not json")


async def test_answers_and_error_messages_are_parsed() -> None:
    client = _Client(_Response([b'{"kind": "Pod", "metadata": {"name": "p"}}']))
    assert await client.get(PODS, "ns", "p") == {"kind": "Pod", "metadata": {"name": "p"}}
    client = _Client(_Response([b'{"message": "pods \\"p\\" is forbidden"}'], status=403))
    with pytest.raises(ApiError) as exc:
        await client.get(PODS, "ns", "p")
    assert exc.value.reason == 'pods "p" is forbidden'


async def _serve(stream: list[bytes], then_silent: bool) -> tuple[Any, str]:
    """A watch endpoint on loopback: writes ``stream`` (one write per item), then holds the
    connection silent or ends it."""
    from aiohttp import web

    async def watch(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.content_type = "application/json"
        await resp.prepare(request)
        for piece in stream:
            await resp.write(piece)
            await asyncio.sleep(0.01)
        if then_silent:
            await asyncio.sleep(3)  # longer than the silence the watch allows
        return resp

    app = web.Application()
    app.router.add_get("/api/v1/namespaces/ns/pods", watch)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


async def _real_client(host: str) -> ApiClientKube:
    from kubernetes_asyncio import client

    cfg = client.Configuration(host=host)
    return ApiClientKube(client.ApiClient(configuration=cfg))


@pytest.mark.parametrize("then_silent", [False, True])
async def test_a_real_stream_is_read_and_its_silence_raises_timeout(then_silent: bool) -> None:
    events = [_event(i) for i in range(3)]
    lines = b"".join(json.dumps(e).encode() + b"\n" for e in events)
    runner, host = await _serve([lines[:30], lines[30:]], then_silent)
    kube = await _real_client(host)
    got: list[dict[str, Any]] = []
    try:
        with anyio.fail_after(10):
            if then_silent:
                with pytest.raises(TimeoutError):
                    async for e in kube.watch(PODS, "ns", "1", silence_seconds=0.5):
                        got.append(e)
            else:
                got = [e async for e in kube.watch(PODS, "ns", "1", silence_seconds=5)]
    finally:
        await kube.close()
        await runner.cleanup()
    assert got == events
