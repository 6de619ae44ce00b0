"""Start-up kind resolution: which plugin serves each configured kind, and with which gate.

One pure function, ``resolve_kinds``, called by ``ungater run`` (the controller) and by
``ungater check-config``, so the two cannot disagree about what refuses to start. It reads the
config and the loaded plugin registry, does no I/O and logs nothing: the caller reports the
plugin failures and the skipped kinds it returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ungater._model.config import Config
from ungater._model.errors import StartupError
from ungater._model.views import Kind
from ungater._plugins.registry import KindHandler, PluginInfo, PluginRegistry

__all__ = ["KindResolution", "ResolvedKind", "SkippedKind", "resolve_kinds"]


@dataclass(frozen=True, slots=True)
class ResolvedKind:
    handler: KindHandler
    gate: str


@dataclass(frozen=True, slots=True)
class SkippedKind:
    kind: Kind
    reason: str


@dataclass(frozen=True)
class KindResolution:
    """The kinds to serve (in config order), the kinds skipped because a plugin that may have
    served them failed to load, and those failures."""

    kinds: dict[Kind, ResolvedKind] = field(default_factory=dict)
    skipped: list[SkippedKind] = field(default_factory=list)
    failures: list[PluginInfo] = field(default_factory=list)


def resolve_kinds(
    config: Config, registry: PluginRegistry, allow: Sequence[str] | None = None
) -> KindResolution:
    """Resolve ``config.kinds`` against ``registry``; raise ``StartupError`` when run must not
    start: a name in the allow list (``allow``, default ``config.plugins.allow``) that is no
    installed plugin, a plugin failure under ``plugins.failOnError``, a kind no plugin serves,
    a kind the named plugin does not serve, a kind several plugins serve with none named, or no
    kind left to serve at all."""
    allowed = config.plugins.allow if allow is None else allow
    if allowed is not None:
        unknown = [name for name in allowed if name not in registry.plugins]
        if unknown:
            names = ", ".join(repr(n) for n in unknown)
            raise StartupError(
                f"plugins.allow: no installed plugin is named {names} "
                "(`ungater plugins` lists the installed ones)"
            )
    failures = registry.failures
    if failures and config.plugins.fail_on_error:
        names = ", ".join(f.label for f in failures)
        raise StartupError(f"plugins failed to load and plugins.failOnError is set: {names}")
    out = KindResolution(failures=list(failures))
    for kc in config.kinds:
        kind = Kind(kc.group, kc.kind)
        try:
            handler = registry.handler(kind, kc.plugin)
        except LookupError as exc:
            if failures and not registry.providers(kind):
                # a broken plugin may have served it: skip the kind, keep the rest working
                out.skipped.append(SkippedKind(kind, str(exc)))
                continue
            raise StartupError(f"config kinds: {exc}") from exc
        out.kinds[kind] = ResolvedKind(handler, config.gate_for(kc))
    if not out.kinds:
        raise StartupError("no elastic kind can be served (see the plugin errors above)")
    return out
