"""The client loads without kubernetes-asyncio's generated code, and still works.

Each test runs in a fresh interpreter: what is imported is the point.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

GENERATED = ("kubernetes_asyncio.client.models.v1_pod", "kubernetes_asyncio.client.api.core_v1_api")


def run(code: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_connect_talks_to_a_server_with_no_generated_module_loaded() -> None:
    out = run(
        """
        import json, sys, anyio
        GENERATED = GENERATED_NAMES
        from aiohttp import web
        from ungater._kube.adapter import connect
        from ungater._kube.client import Resource

        seen = []

        async def pod(request):
            seen.append(request.headers.get("Authorization"))
            return web.json_response({"kind": "Pod", "metadata": {"name": "p"}})

        async def main(path):
            app = web.Application()
            app.router.add_get("/api/v1/namespaces/ns/pods/p", pod)
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]
            with open(path, "w") as f:
                json.dump({
                    "apiVersion": "v1", "kind": "Config", "current-context": "c",
                    "clusters": [{"name": "k", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                    "users": [{"name": "u", "user": {"token": "t0ken"}}],
                    "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
                }, f)
            kube = await connect(path)
            try:
                got = await kube.get(Resource("", "v1", "pods", "Pod"), "ns", "p")
            finally:
                await kube.close()
                await runner.cleanup()
            print(got["metadata"]["name"], seen)

        import tempfile, os
        with tempfile.TemporaryDirectory() as d:
            anyio.run(main, os.path.join(d, "kubeconfig"))
        print(sorted(m for m in GENERATED if m in sys.modules))
        print(sum(m.startswith("kubernetes_asyncio") for m in sys.modules) < 30)
        """.replace("GENERATED_NAMES", repr(GENERATED))
    )
    assert out.splitlines() == ["p ['Bearer t0ken']", "[]", "True"]


def test_code_that_asks_for_generated_classes_afterwards_still_gets_them() -> None:
    out = run(
        """
        from ungater._kube.lean_import import kubernetes_client
        client, config = kubernetes_client()
        from kubernetes_asyncio.client import CoreV1Api, V1Pod
        import kubernetes_asyncio
        import kubernetes_asyncio.client.models as models
        print(CoreV1Api.__name__, V1Pod is models.V1Pod, kubernetes_asyncio.watch.Watch.__name__)
        print(client is kubernetes_asyncio.client, config is kubernetes_asyncio.config)
        """
    )
    assert out.splitlines() == ["CoreV1Api True Watch", "True True"]


def test_a_library_already_imported_is_used_as_it_is() -> None:
    out = run(
        """
        import kubernetes_asyncio
        from ungater._kube.lean_import import kubernetes_client
        client, config = kubernetes_client()
        print(client is kubernetes_asyncio.client, type(client).__name__, hasattr(client, "V1Pod"))
        """
    )
    assert out.splitlines() == ["True module True"]


def test_a_layout_it_does_not_expect_falls_back_to_the_ordinary_import() -> None:
    out = run(
        """
        import sys
        from ungater._kube import lean_import
        lean_import._NEEDED = (*lean_import._NEEDED, "no_such_module")
        client, config = lean_import.kubernetes_client()
        print(type(client).__name__, "kubernetes_asyncio.client.models.v1_pod" in sys.modules)
        print(client.Configuration.__module__, config.load_kube_config.__name__)
        print(any(isinstance(m, lean_import._DeferredPackage) for m in sys.modules.values()))
        """
    )
    assert out.splitlines() == [
        "module True",
        "kubernetes_asyncio.client.configuration load_kube_config",
        "False",
    ]
