"""The chart and the deploy files against the real API server: helm (built once into the tools
cache; a failure under ``CI=true``, else a skip, when it cannot be had), the chart as ``helm
template`` renders it, admin requests that return the server's warnings (server-side dry runs),
and the roles the RBAC tests apply. The ``helm`` and ``admin`` fixtures are in conftest.py."""

from __future__ import annotations

import http.client
import json
import os
import ssl
import time
from pathlib import Path
from typing import Any

import pytest

from tests.unit.deploy.deploy_checks import CHART, NAMESPACE, load_documents, plain_objects
from ungater_devtools.ci import in_ci
from ungater_devtools.devcluster import helm as helm_tool
from ungater_devtools.devcluster.versions import KUBERNETES_VERSION


def helm_for_tests(config: pytest.Config) -> Path:
    """The helm binary (built once into the cache); fails under CI=true, else skips, when
    it cannot be had."""
    mode = os.environ.get("UNGATER_CONTROL_PLANE", "").strip().lower()
    reporter: Any = config.pluginmanager.getplugin("terminalreporter")
    capture: Any = config.pluginmanager.getplugin("capturemanager")
    notes: list[str] = []

    def say(message: str) -> None:
        notes.append(message)
        if reporter is not None:
            reporter.write_line(f"[ungater helm] {message}")

    found = helm_tool.find_helm()
    if found is None:
        if capture is not None:
            with capture.global_and_fixture_disabled():
                found = helm_tool.ensure_helm(build=mode != "reuse", log=say)
        else:
            found = helm_tool.ensure_helm(build=mode != "reuse", log=say)
    if found is None:
        why = "; ".join(notes) or "no reason given"
        if in_ci():
            pytest.fail(
                f"helm is unavailable under CI=true (`make helm` builds it): {why}", pytrace=False
            )
        pytest.skip(
            "helm is unavailable, so the chart is not checked (the plain manifests in "
            f"deploy/manifests still are): {why}"
        )
    return found


def render(helm: Path, namespace: str = NAMESPACE, **values: Any) -> list[dict[str, Any]]:
    stream = helm_tool.template(
        helm,
        CHART,
        release="ungater",
        namespace=namespace,
        values=values or None,
        kube_version=KUBERNETES_VERSION,
    )
    return load_documents(helm_tool.split_documents(stream))


class Admin:
    """Admin requests that also return the API server's warnings (PodSecurity, deprecations)."""

    def __init__(self, control_plane: Any) -> None:
        self.cp = control_plane
        ctx = ssl.create_default_context(cafile=str(control_plane.ca_path))
        ctx.load_cert_chain(str(control_plane.admin_cert_path), str(control_plane.admin_key_path))
        self.ssl = ctx
        self._resources: dict[str, dict[str, tuple[str, bool]]] = {}

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any, list[str]]:
        conn = http.client.HTTPSConnection(
            "127.0.0.1", self.cp.apiserver_port, timeout=30, context=self.ssl
        )
        try:
            headers = {"Accept": "application/json", "Content-Type": "application/json"}
            payload = json.dumps(body).encode() if body is not None else None
            conn.request(method, path, body=payload, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
            warnings = resp.headers.get_all("Warning") or []
        finally:
            conn.close()
        try:
            data = json.loads(raw)
        except ValueError:
            data = raw.decode(errors="replace")
        return resp.status, data, warnings

    def collection(self, obj: dict[str, Any]) -> str:
        """The collection path of ``obj``, found through discovery."""
        api_version = obj["apiVersion"]
        if api_version not in self._resources:
            base = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
            status, data, _ = self.request("GET", base)
            assert status == 200, f"discovery of {api_version}: {data}"
            self._resources[api_version] = {
                r["kind"]: (r["name"], r["namespaced"])
                for r in data["resources"]
                if "/" not in r["name"]
            }
        plural, namespaced = self._resources[api_version][obj["kind"]]
        base = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
        if namespaced:
            ns = obj["metadata"].get("namespace")
            assert ns, f"{obj['kind']} {obj['metadata']['name']} has no namespace"
            return f"{base}/namespaces/{ns}/{plural}"
        return f"{base}/{plural}"

    def dry_run(self, obj: dict[str, Any]) -> None:
        """POST with ?dryRun=All and strict field validation: unknown or duplicate fields,
        schema violations and admission rejections (PodSecurity included) fail."""
        path = self.collection(obj) + "?dryRun=All&fieldValidation=Strict"
        status, data, warnings = self.request("POST", path, obj)
        what = f"{obj['kind']} {obj['metadata'].get('namespace', '')}/{obj['metadata']['name']}"
        assert status == 201, f"dry run of {what}: HTTP {status}: {data}"
        assert not warnings, f"dry run of {what} warned: {warnings}"

    def wait_absent(self, namespace: str, timeout: float = 90.0) -> None:
        """Until ``namespace`` does not exist (one of an earlier run may be terminating)."""
        deadline = time.monotonic() + timeout
        while True:
            status, data, _ = self.request("GET", f"/api/v1/namespaces/{namespace}")
            if status == 404:
                return
            assert time.monotonic() < deadline, f"namespace {namespace} still exists: {data}"
            time.sleep(0.5)

    def create_namespace(self, name: str, labels: dict[str, str] | None = None) -> None:
        self.wait_absent(name)
        body = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": name, "labels": labels or {}},
        }
        status, data, _ = self.request("POST", "/api/v1/namespaces", body)
        assert status == 201, f"creating namespace {name}: {data}"

    def delete_namespace(self, name: str) -> None:
        self.request("DELETE", f"/api/v1/namespaces/{name}")


def rbac_source() -> tuple[list[dict[str, Any]], str]:
    """The rendered chart if helm can be had, else (not under CI=true) the plain manifests, and
    which it is."""
    build = os.environ.get("UNGATER_CONTROL_PLANE", "").strip().lower() != "reuse"
    path = helm_tool.find_helm() or helm_tool.ensure_helm(build=build)
    if path is not None:
        return render(path), "the chart"
    if in_ci():
        pytest.fail(
            "helm is unavailable under CI=true: the chart's RBAC is not checked", pytrace=False
        )
    return plain_objects(), "deploy/manifests (helm unavailable)"
