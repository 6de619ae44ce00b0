"""kubernetes-asyncio's kubeconfig loading and ``ApiClient``, without its generated code.

``import kubernetes_asyncio`` runs package ``__init__`` files that import every generated API and
model class: about 850 modules, 36 MB of RSS in a fresh interpreter (36.1.0, measured). The
controller sends its own JSON through ``ApiClient.call_api`` and never builds a model, so it needs
five of those modules. This loads them alone: the three packages go into ``sys.modules`` created
but not run, and a package runs its own ``__init__`` the first time someone asks it for a name it
lacks. Code in the same process that imports the library the ordinary way still gets all of it.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from typing import Any

#: Packages whose ``__init__`` would import the generated code, parents first.
_DEFERRED = ("kubernetes_asyncio", "kubernetes_asyncio.client", "kubernetes_asyncio.client.models")
#: The client modules the controller uses, in an order where each finds what it imports from
#: its package already there (a ``from package import name`` asks the package first).
_NEEDED = ("exceptions", "configuration", "rest", "api_client")


class _DeferredPackage(types.ModuleType):
    """A package created but not run; its ``__init__`` runs on the first name it lacks."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or self.__dict__.get("_lean_running"):
            raise AttributeError(name)
        self.__dict__["_lean_running"] = True
        spec = self.__spec__
        assert spec is not None and spec.loader is not None
        spec.loader.exec_module(self)
        self.__class__ = types.ModuleType  # type: ignore[assignment]
        return getattr(self, name)


def _defer(name: str) -> None:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.submodule_search_locations is None:
        raise ImportError(f"{name} is not a package")
    module = importlib.util.module_from_spec(spec)
    module.__class__ = _DeferredPackage
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)


def kubernetes_client() -> tuple[Any, Any]:
    """``(kubernetes_asyncio.client, kubernetes_asyncio.config)``, loading the least it can.

    When the library is already imported, or its layout is not the one this expects, it is
    imported the ordinary way.
    """
    if "kubernetes_asyncio" not in sys.modules:
        try:
            return _lean()
        except Exception:  # any surprise in the layout: fall back, never fail
            for name in [m for m in sys.modules if m.startswith("kubernetes_asyncio")]:
                del sys.modules[name]
    from kubernetes_asyncio import client, config

    return client, config


def _lean() -> tuple[Any, Any]:
    for name in _DEFERRED:
        _defer(name)
    client = sys.modules["kubernetes_asyncio.client"]
    for name in _NEEDED:
        importlib.import_module(f"kubernetes_asyncio.client.{name}")
    # what the config package takes from the client package
    client.__dict__["ApiClient"] = client.api_client.ApiClient
    client.__dict__["Configuration"] = client.configuration.Configuration
    config = importlib.import_module("kubernetes_asyncio.config")
    return client, config
