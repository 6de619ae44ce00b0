"""The probe and metrics endpoint on a real socket: /metrics, /healthz, /readyz, port 0, and a
clean stop that leaves nothing running."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from ungater._observe.metrics import CONTENT_TYPE, Metrics
from ungater._observe.server import HealthServer, parse_address


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_parse_address() -> None:
    assert parse_address(":8080") == ("", 8080)
    assert parse_address("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_address("[::1]:9090") == ("::1", 9090)
    for bad in ("8080", "host:", "host:http", ":70000"):
        with pytest.raises(ValueError):
            parse_address(bad)


@pytest.mark.anyio
async def test_endpoints_answer_and_stop_cleanly() -> None:
    metrics = Metrics()
    metrics.observe_patch("released")
    state = {"ready": False, "healthy": True}
    server = HealthServer(
        "127.0.0.1", 0, metrics, ready=lambda: state["ready"], healthy=lambda: state["healthy"]
    )
    before = asyncio.all_tasks()
    await server.start()
    try:
        assert server.port > 0
        async with aiohttp.ClientSession(server.url) as http:
            async with http.get("/metrics") as resp:
                assert resp.status == 200
                assert resp.headers["Content-Type"] == CONTENT_TYPE
                text = await resp.text()
                assert 'ungater_patches_total{outcome="released"} 1.0' in text
            async with http.get(
                "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
            ) as resp:
                assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
                assert (await resp.text()).endswith("# EOF\n")
            async with http.get("/healthz") as resp:
                assert resp.status == 200 and await resp.text() == "ok\n"
            async with http.get("/readyz") as resp:
                assert resp.status == 503
            state["ready"] = True
            async with http.get("/readyz") as resp:
                assert resp.status == 200 and await resp.text() == "ok\n"
            state["healthy"] = False
            async with http.get("/healthz") as resp:
                assert resp.status == 500
            async with http.get("/nope") as resp:
                assert resp.status == 404
    finally:
        await server.stop()
    port = server.port
    with pytest.raises(OSError):
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.close()
    await asyncio.sleep(0)
    assert asyncio.all_tasks() <= before  # nothing of the server is left running


@pytest.mark.anyio
async def test_a_raising_probe_fails_instead_of_crashing() -> None:
    def broken() -> bool:
        raise RuntimeError("boom")

    server = HealthServer("127.0.0.1", 0, Metrics(), ready=broken, healthy=broken)
    async with server, aiohttp.ClientSession(server.url) as http:
        async with http.get("/healthz") as resp:
            assert resp.status == 500
        async with http.get("/readyz") as resp:
            assert resp.status == 503
        async with http.get("/metrics") as resp:
            assert resp.status == 200  # the rest keeps serving


@pytest.mark.anyio
async def test_from_address_and_a_taken_port() -> None:
    first = HealthServer.from_address("127.0.0.1:0", Metrics(), lambda: True, lambda: True)
    async with first:
        clash = HealthServer("127.0.0.1", first.port, Metrics(), lambda: True, lambda: True)
        with pytest.raises(OSError):
            await clash.start()
        await clash.stop()  # a server that never started stops quietly
