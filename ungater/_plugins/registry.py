"""Discovers plugins through the ``ungater.plugins`` entry point group and wraps them.

Built-in and third-party plugins load the same way. A plugin that fails to import, or whose
``ungater_kinds`` raises, is recorded as a failure with its name and distribution; the others
keep working. The core talks to plugins only through ``KindHandler``, a typed facade that calls
exactly one plugin's hooks and turns a raising or ill-typed hook into a ``PluginError``.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import pluggy

from ungater._model.views import Kind, ObjectRef, PodView
from ungater._plugins import hookspecs as hookspecs
from ungater.plugin_api import PROJECT, KindSpec, ReleaseGroup

__all__ = ["ENTRY_POINT_GROUP", "KindHandler", "PluginError", "PluginInfo", "PluginRegistry"]

ENTRY_POINT_GROUP = "ungater.plugins"
ALLOW_ENV = "UNGATER_PLUGINS"
log = logging.getLogger("ungater.registry")


class PluginError(Exception):
    """A plugin hook raised or returned something outside its contract."""

    def __init__(self, plugin: PluginInfo, hook: str, detail: str) -> None:
        super().__init__(f"plugin {plugin.label}: {hook}: {detail}")
        self.plugin = plugin
        self.hook = hook
        self.detail = detail


@dataclass
class PluginInfo:
    name: str
    distribution: str = ""
    version: str = ""
    kinds: list[KindSpec] = field(default_factory=list)
    error: str = ""

    @property
    def label(self) -> str:
        dist = f" ({f'{self.distribution} {self.version}'.strip()})" if self.distribution else ""
        return f"{self.name}{dist}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "kinds": [str(k.group_kind) for k in self.kinds],
            "error": self.error,
        }


def _direct(pm: pluggy.PluginManager, hook: str, plugin: str) -> Callable[..., Any] | None:
    """The one plain implementation of ``hook`` by ``plugin``, called with the arguments it
    declares; None when pluggy's own dispatch is needed (wrappers, several implementations).

    Every per-kind hook is ``firstresult`` and has exactly one implementation (the plugin that
    serves the kind), so pluggy's generic dispatch gives the same answer at several times the
    cost: called about four times per candidate pod, it was most of a reconcile
    (docs/benchmarks.md).
    """
    caller = getattr(pm.hook, hook)
    impls = [i for i in caller.get_hookimpls() if i.plugin_name == plugin]
    spec = caller.spec
    if len(impls) != 1 or spec is None or not spec.opts.get("firstresult"):
        return None
    if impls[0].hookwrapper or impls[0].wrapper:
        return None
    function, names = impls[0].function, impls[0].argnames

    def call(**kwargs: Any) -> Any:
        return function(*[kwargs[n] for n in names])

    return call


class KindHandler:
    """Typed calls into the one plugin that serves a kind."""

    def __init__(self, spec: KindSpec, plugin: PluginInfo, pm: pluggy.PluginManager) -> None:
        self.spec = spec
        self.plugin = plugin
        others = [p for name, p in pm.list_name_plugin() if name != plugin.name]

        def caller(hook: str) -> Callable[..., Any]:
            direct = _direct(pm, hook, plugin.name)
            return direct if direct is not None else pm.subset_hook_caller(hook, others)

        self._pod_selector = caller("ungater_pod_selector")
        self._owns_pod = caller("ungater_owns_pod")
        self._pod_set = caller("ungater_pod_set")
        self._sort_key = caller("ungater_sort_key")
        self._release_group = caller("ungater_release_group")
        self._owner_facts = caller("ungater_owner_facts")
        self._desired_counts = caller("ungater_desired_counts")

    @property
    def kind(self) -> Kind:
        return self.spec.group_kind

    def _call(self, hook: str, caller: Any, **kwargs: Any) -> Any:
        try:
            return caller(**kwargs)
        except Exception as exc:  # a plugin bug must not take the controller down
            raise PluginError(self.plugin, hook, f"{type(exc).__name__}: {exc}") from exc

    def pod_selector(self, owner: ObjectRef) -> dict[str, str]:
        result = self._call("ungater_pod_selector", self._pod_selector, owner=owner)
        if not isinstance(result, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in result.items()
        ):
            raise PluginError(self.plugin, "ungater_pod_selector", f"not a str map: {result!r}")
        if self.spec.pod_label not in result:
            raise PluginError(
                self.plugin, "ungater_pod_selector", f"selector lacks {self.spec.pod_label!r}"
            )
        return dict(result)

    def owns_pod(self, owner: ObjectRef, pod: PodView, chain: Sequence[ObjectRef]) -> bool:
        result = self._call(
            "ungater_owns_pod", self._owns_pod, owner=owner, pod=pod, chain=tuple(chain)
        )
        if result is None:  # no answer (pluggy skips None): not proven, so not ours
            return False
        if not isinstance(result, bool):
            # a wrong type ("yes", 1) must not read as a silent "not ours" in `explain`
            raise PluginError(self.plugin, "ungater_owns_pod", f"not a bool: {result!r}")
        return result

    def pod_set(self, owner: ObjectRef, pod: PodView) -> str | None:
        result = self._call("ungater_pod_set", self._pod_set, owner=owner, pod=pod)
        if result is not None and not isinstance(result, str):
            raise PluginError(self.plugin, "ungater_pod_set", f"not a str: {result!r}")
        return result or None

    def sort_key(self, owner: ObjectRef, pod: PodView) -> tuple[int | str, ...]:
        result = self._call("ungater_sort_key", self._sort_key, owner=owner, pod=pod)
        if result is None:
            return ()
        if not isinstance(result, tuple) or not all(isinstance(x, int | str) for x in result):
            raise PluginError(
                self.plugin, "ungater_sort_key", f"not a tuple of int/str: {result!r}"
            )
        return result

    def release_group(
        self, owner: ObjectRef, pod: PodView, owner_facts: Mapping[str, Any] | None = None
    ) -> ReleaseGroup | None:
        result = self._call(
            "ungater_release_group",
            self._release_group,
            owner=owner,
            pod=pod,
            owner_facts=owner_facts or {},
        )
        if result is not None and not isinstance(result, ReleaseGroup):
            raise PluginError(
                self.plugin, "ungater_release_group", f"not a ReleaseGroup: {result!r}"
            )
        return result

    def owner_facts(self, owner_object: Mapping[str, Any]) -> dict[str, Any]:
        result = self._call("ungater_owner_facts", self._owner_facts, owner_object=owner_object)
        if result is None:
            return {}
        if not isinstance(result, Mapping):
            raise PluginError(self.plugin, "ungater_owner_facts", f"not a mapping: {result!r}")
        return dict(result)

    def desired_counts(self, owner_facts: Mapping[str, Any]) -> dict[str, int] | None:
        result = self._call("ungater_desired_counts", self._desired_counts, owner_facts=owner_facts)
        if result is None:
            return None
        if not isinstance(result, Mapping) or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
            for k, v in result.items()
        ):
            raise PluginError(
                self.plugin,
                "ungater_desired_counts",
                f"not a map of pod set names to non-negative ints: {result!r}",
            )
        return dict(result)


class PluginRegistry:
    """All loaded plugins, the kinds they serve, and the failures met while loading."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager(PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.plugins: dict[str, PluginInfo] = {}

    @classmethod
    def discover(cls, allow: Iterable[str] | None = None) -> PluginRegistry:
        """Load every plugin of the entry point group (or only those allowed).

        ``allow`` defaults to the comma-separated env var ``UNGATER_PLUGINS`` when set.
        """
        if allow is None and os.environ.get(ALLOW_ENV):
            allow = [n.strip() for n in os.environ[ALLOW_ENV].split(",") if n.strip()]
        allowed = set(allow) if allow is not None else None
        registry = cls()
        for ep in sorted(
            importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name
        ):
            if allowed is not None and ep.name not in allowed:
                continue
            dist = ep.dist
            info = PluginInfo(
                name=ep.name,
                distribution=dist.metadata["Name"] if dist else "",
                version=dist.version if dist else "",
            )
            try:
                module = ep.load()
            except Exception as exc:
                info.error = f"import failed: {type(exc).__name__}: {exc}"
                registry.plugins[info.name] = info
                log.error("plugin %s failed to load: %s", info.label, info.error)
                continue
            registry.add(module, info)
        return registry

    @classmethod
    def from_modules(cls, modules: Mapping[str, ModuleType | object]) -> PluginRegistry:
        """Register plugins directly (tests, embedding) instead of through entry points."""
        registry = cls()
        for name, module in modules.items():
            registry.add(module, PluginInfo(name=name))
        return registry

    def add(self, module: ModuleType | object, info: PluginInfo) -> None:
        self.plugins[info.name] = info
        try:
            self.pm.register(module, name=info.name)
        except Exception as exc:  # a hook with a wrong signature, for one
            info.error = f"registration failed: {type(exc).__name__}: {exc}"
            log.error("plugin %s rejected: %s", info.label, info.error)
            return
        try:
            self.pm.check_pending()  # a misspelt hook name must not be silently ignored
        except pluggy.PluginValidationError as exc:
            info.error = f"registration failed: {exc}"
            log.error("plugin %s rejected: %s", info.label, info.error)
            self.pm.unregister(name=info.name)
            return
        impls = [
            i for i in self.pm.hook.ungater_kinds.get_hookimpls() if i.plugin_name == info.name
        ]
        for impl in impls:
            try:
                kinds = list(impl.function())  # type: ignore[call-overload]
                if not all(isinstance(k, KindSpec) for k in kinds):
                    raise TypeError(f"expected KindSpec items, got {kinds!r}")
            except Exception as exc:
                info.error = f"ungater_kinds failed: {type(exc).__name__}: {exc}"
                log.error("plugin %s: %s", info.label, info.error)
                self.pm.unregister(name=info.name)
                return
            info.kinds.extend(kinds)

    @property
    def failures(self) -> list[PluginInfo]:
        return [p for p in self.plugins.values() if p.error]

    def providers(self, kind: Kind) -> list[PluginInfo]:
        return [
            p
            for p in self.plugins.values()
            if not p.error and any(k.group_kind == kind for k in p.kinds)
        ]

    def all_kinds(self) -> list[Kind]:
        seen: dict[Kind, None] = {}
        for p in self.plugins.values():
            if not p.error:
                for k in p.kinds:
                    seen.setdefault(k.group_kind, None)
        return list(seen)

    def handler(self, kind: Kind, plugin: str | None = None) -> KindHandler:
        """The facade for ``kind``, served by ``plugin`` or by its only provider.

        Raises LookupError naming the kind when no plugin (or more than one, unnamed) serves it.
        """
        providers = self.providers(kind)
        if plugin is not None:
            providers = [p for p in providers if p.name == plugin]
            if not providers:
                raise LookupError(
                    f"plugin {plugin!r} does not serve kind {kind} (or failed to load)"
                )
        if not providers:
            raise LookupError(f"no plugin serves kind {kind}")
        if len(providers) > 1:
            names = ", ".join(p.name for p in providers)
            raise LookupError(f"kind {kind} is served by several plugins ({names}); name one")
        info = providers[0]
        spec = next(k for k in info.kinds if k.group_kind == kind)
        return KindHandler(spec, info, self.pm)
