"""``KubeClient`` on kubernetes-asyncio: its authenticated ``ApiClient`` (kubeconfig, TLS,
in-cluster config), without its model deserialisation (slow, memory-hungry, and lossy for
custom resources), behind the client-side rate limit.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from ungater._kube.client import ApiError, GoneError, Resource
from ungater._kube.lean_import import kubernetes_client
from ungater._kube.ratelimit import RateLimiter

__all__ = ["KEEPALIVE_SECONDS", "ApiClientKube", "connect", "loads"]


def loads(raw: bytes | str) -> Any:
    """JSON as ``json.loads`` reads it, parsed by orjson (several times faster: every watch
    event and every answer goes through here).

    What orjson refuses and ``json.loads`` takes (NaN, Infinity, a lone surrogate) is read by
    ``json.loads``, so nothing that parsed before fails now. One difference remains: orjson
    reads an integer beyond 64 bits as a float; the API server holds every integer of an
    object as an int64 (its JSON decoding of objects), so none reaches here.
    """
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


class ApiClientKube:
    """``KubeClient`` on a kubernetes-asyncio ``ApiClient`` (auth, TLS, kubeconfig handling)."""

    def __init__(
        self, api_client: Any, limiter: RateLimiter | None = None, request_timeout: float = 30.0
    ) -> None:
        self._api = api_client
        self._limiter = limiter
        self._timeout = request_timeout

    async def _request(
        self,
        method: str,
        path: str,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: Any = None,
    ) -> aiohttp.ClientResponse:
        if self._limiter is not None:
            await self._limiter.acquire()
        resp: aiohttp.ClientResponse = await self._api.call_api(
            path,
            method,
            query_params=query or [],
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,
            _return_http_data_only=True,
            _request_timeout=timeout if timeout is not None else self._timeout,
        )
        return resp

    @staticmethod
    async def _json(resp: aiohttp.ClientResponse) -> dict[str, Any]:
        raw = await resp.read()
        if resp.status >= 400:
            text = raw.decode("utf-8", "replace")
            reason = resp.reason or ""
            with contextlib.suppress(ValueError, AttributeError):
                reason = loads(text).get("message", reason)
            if resp.status == 410:
                raise GoneError(reason)
            raise ApiError(resp.status, reason, text)
        data: dict[str, Any] = loads(raw)
        return data

    async def list_pages(
        self, resource: Resource, namespace: str | None, label_selector: str = ""
    ) -> AsyncIterator[tuple[list[dict[str, Any]], str]]:
        cont = ""
        while True:  # bounded by the server's pages: each answer moves `continue` forward
            query = [("limit", "500")]
            if label_selector:
                query.append(("labelSelector", label_selector))
            if cont:
                query.append(("continue", cont))
            data = await self._json(await self._request("GET", resource.path(namespace), query))
            items = data.get("items") or []
            for item in items:
                # list items lack kind/apiVersion; put them back so views are self-describing
                item.setdefault("apiVersion", resource.api_version)
                item.setdefault("kind", resource.kind)
            meta = data.get("metadata") or {}
            cont = meta.get("continue") or ""
            yield items, str(meta.get("resourceVersion", ""))
            if not cont:
                return

    async def list_objects(
        self, resource: Resource, namespace: str | None, label_selector: str = ""
    ) -> tuple[list[dict[str, Any]], str]:
        items: list[dict[str, Any]] = []
        rv = ""
        async for page, page_rv in self.list_pages(resource, namespace, label_selector):
            items.extend(page)
            rv = page_rv
        return items, rv

    async def watch(
        self,
        resource: Resource,
        namespace: str | None,
        resource_version: str,
        label_selector: str = "",
        timeout_seconds: int = 300,
        silence_seconds: float = 90.0,
    ) -> AsyncIterator[dict[str, Any]]:
        query = [
            ("watch", "1"),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout_seconds)),
        ]
        if resource_version:
            query.append(("resourceVersion", resource_version))
        if label_selector:
            query.append(("labelSelector", label_selector))
        # a stream silent for silence_seconds raises TimeoutError (aiohttp's read timeout,
        # rearmed by every packet: one timer per read, not a cancel scope per chunk)
        timeout = aiohttp.ClientTimeout(
            total=None, connect=self._timeout, sock_read=silence_seconds
        )
        resp = await self._request("GET", resource.path(namespace), query, timeout=timeout)
        try:
            if resp.status >= 400:
                await self._json(resp)
            buf = b""
            while True:  # ends when the server closes the stream (timeoutSeconds) or on silence
                chunk = await resp.content.readany()
                if not chunk:
                    return
                # every complete line of the chunk, in one split (a chunk carries many events)
                *lines, buf = (buf + chunk).split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    event = loads(line)
                    if event.get("type") == "ERROR":
                        status = event.get("object") or {}
                        if status.get("code") == 410:
                            raise GoneError(str(status.get("message", "")))
                        raise ApiError(
                            int(status.get("code") or 500), str(status.get("message", ""))
                        )
                    yield event
        finally:
            resp.release()
            resp.close()

    async def get(
        self, resource: Resource, namespace: str | None, name: str
    ) -> dict[str, Any] | None:
        try:
            return await self._json(await self._request("GET", resource.path(namespace, name)))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def json_patch(
        self, resource: Resource, namespace: str | None, name: str, ops: list[dict[str, Any]]
    ) -> dict[str, Any]:
        resp = await self._request(
            "PATCH",
            resource.path(namespace, name),
            body=ops,
            content_type="application/json-patch+json",
        )
        return await self._json(resp)

    async def json_patch_dry_run(
        self, resource: Resource, namespace: str | None, name: str, ops: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """The same patch with ``dryRun=All``: admission (webhooks, policies) and validation
        run, nothing is stored. ``ungater explain`` asks it whether a release would be refused."""
        resp = await self._request(
            "PATCH",
            resource.path(namespace, name),
            query=[("dryRun", "All")],
            body=ops,
            content_type="application/json-patch+json",
        )
        return await self._json(resp)

    async def create(
        self, resource: Resource, namespace: str | None, body: dict[str, Any]
    ) -> dict[str, Any]:
        return await self._json(await self._request("POST", resource.path(namespace), body=body))

    async def merge_patch(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        body: dict[str, Any],
        subresource: str = "",
    ) -> dict[str, Any]:
        """A JSON merge patch (RFC 7386), optionally on a subresource such as ``status``."""
        path = resource.path(namespace, name) + (f"/{subresource}" if subresource else "")
        resp = await self._request(
            "PATCH", path, body=body, content_type="application/merge-patch+json"
        )
        return await self._json(resp)

    async def delete(self, resource: Resource, namespace: str | None, name: str) -> bool:
        """Delete an object; False if it was already gone."""
        try:
            await self._json(await self._request("DELETE", resource.path(namespace, name)))
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def served_versions(self, group: str) -> list[str]:
        try:
            data = await self._json(await self._request("GET", f"/apis/{group}"))
        except ApiError as exc:
            if exc.status == 404:
                return []
            raise
        return [str(v["version"]) for v in data.get("versions") or () if "version" in v]

    async def close(self) -> None:
        await self._api.close()


async def connect(
    kubeconfig: str | Path | None = None,
    context: str | None = None,
    qps: float = 200.0,
    burst: int = 400,
    request_timeout: float = 30.0,
    pool_size: int = 100,
) -> ApiClientKube:
    """A client from ``kubeconfig``, else $KUBECONFIG or ~/.kube/config, else in-cluster config."""
    client, config = kubernetes_client()
    cfg = client.Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG") or None
    if path is not None:
        _require_kubeconfig(str(path), "--kubeconfig" if kubeconfig else "KUBECONFIG")
    default = Path.home() / ".kube" / "config"
    if path is None and default.exists():
        path = default
    if path is not None:
        await config.load_kube_config(
            config_file=str(path), context=context, client_configuration=cfg
        )
    else:
        try:
            config.load_incluster_config(client_configuration=cfg)
        except config.ConfigException as exc:
            raise RuntimeError(
                "no kubeconfig found (give --kubeconfig, set KUBECONFIG or create "
                f"~/.kube/config) and not running in a cluster: {exc}"
            ) from exc
    cfg.connection_pool_maxsize = pool_size
    _resolve_env_proxy(cfg)
    api = client.ApiClient(configuration=cfg)
    _tune_session(api.rest_client)
    return ApiClientKube(api, RateLimiter(qps, burst), request_timeout)


def _require_kubeconfig(path: str, source: str) -> None:
    """Refuse a kubeconfig that is not there, naming it: the library would only log a warning
    and then complain that the (empty) config lacks a current-context. A list joined by
    ``os.pathsep`` is merged by the library, skipping missing files; one must exist."""
    files = [f for f in path.split(os.pathsep) if f]
    if not any(Path(f).expanduser().is_file() for f in files):
        if len(files) == 1:
            raise FileNotFoundError(f"kubeconfig {files[0]} (from {source}) does not exist")
        named = ", ".join(files) or repr(path)
        raise FileNotFoundError(f"none of the kubeconfig files {named} (from {source}) exists")


#: Idle pooled connections are kept this long (aiohttp's default is 15 s). The API server closes
#: them after 90 s (client-go keeps them as long); below that, a release after a quiet minute
#: reuses warm connections instead of paying a TLS handshake per concurrent patch.
KEEPALIVE_SECONDS = 60.0


def _resolve_env_proxy(cfg: Any) -> None:
    """Apply HTTP(S)_PROXY / NO_PROXY for the API server once, up front.

    kubernetes-asyncio's session has ``trust_env=True``, which makes aiohttp re-read the proxy
    environment and ``~/.netrc`` in a worker thread on *every* request (two thread hand-offs per
    patch). The proxy settings are resolved here instead, exactly as aiohttp would; netrc basic
    auth never authenticates to an API server, so it is not carried over.
    """
    if cfg.proxy:
        return
    from aiohttp.helpers import get_env_proxy_for_url
    from yarl import URL

    try:
        proxy, auth = get_env_proxy_for_url(URL(cfg.host))
    except LookupError:  # no proxy configured for this host, or NO_PROXY matches it
        return
    cfg.proxy = str(proxy)
    if auth is not None:
        cfg.proxy_headers = {"Proxy-Authorization": auth.encode()}


def _tune_session(rest_client: Any) -> None:
    """Give kubernetes-asyncio's REST client a session on the same connector (its TLS settings
    untouched) that skips the per-request environment look-ups; keep idle connections longer."""
    old: aiohttp.ClientSession = rest_client.pool_manager
    connector = old.connector
    if connector is None:
        return
    if hasattr(connector, "_keepalive_timeout"):  # only a constructor argument in aiohttp
        connector._keepalive_timeout = KEEPALIVE_SECONDS
    rest_client.pool_manager = aiohttp.ClientSession(
        connector=connector,
        trust_env=False,
        read_bufsize=2**21,  # as kubernetes-asyncio sets it: watch events can be large
    )
    old.detach()  # the connector now belongs to the new session
