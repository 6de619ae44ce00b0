"""Reading the config file: YAML into the schema, with errors that name file, key and need.

A key given twice, a YAML 1.1 boolean (``yes``, ``on``) and any schema error stop the start with
one message that says where (file, key path) and what is needed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ungater._model.config import Config

__all__ = ["ConfigError", "load_config"]


class ConfigError(Exception):
    """A config file that cannot be used; the message names the file and the key."""


def _location(loc: Iterable[int | str]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


class _Loader(yaml.SafeLoader):
    """YAML 1.2 booleans only (``true``/``false``): ``yes``, ``on`` or ``n`` stay strings, and
    so are refused where a boolean is expected instead of silently meaning true or false."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool",
    re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
    list("tTfF"),
)


def _duplicate_keys(node: yaml.Node, path: tuple[int | str, ...] = ()) -> list[str]:
    """``key: given twice (lines a and b)`` for every mapping key that repeats."""
    out: list[str] = []
    if isinstance(node, yaml.MappingNode):
        first: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            line = key_node.start_mark.line + 1
            if key is not None and key in first:
                out.append(
                    f"{_location((*path, key))}: given twice (lines {first[key]} and {line}); "
                    "a YAML key may appear once"
                )
            elif key is not None:
                first[key] = line
            out += _duplicate_keys(value_node, (*path, key) if key is not None else path)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            out += _duplicate_keys(item, (*path, i))
    return out


def _parse_yaml(text: str, p: Path) -> Any:
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        duplicates = _duplicate_keys(node)
        if duplicates:
            raise ConfigError("\n".join(f"{p}: {d}" for d in duplicates))
        return loader.construct_document(node)
    finally:
        loader.dispose()


_SHOW_INPUT = frozenset(
    {"literal_error", "enum", "greater_than", "greater_than_equal", "less_than", "less_than_equal"}
)


def _message(err: Any) -> str:
    if err["type"] == "extra_forbidden":
        return "unknown key"
    msg = str(err["msg"])
    if msg.startswith("Value error, "):
        msg = msg.removeprefix("Value error, ")
    if err["type"].endswith("_type") or err["type"] in _SHOW_INPUT:
        msg += f" (got {err['input']!r})"
    return msg


def load_config(path: str | Path | None) -> Config:
    """Load and validate a config file; None gives the built-in defaults."""
    if path is None:
        return Config()
    p = Path(path)
    try:
        raw = _parse_yaml(p.read_text(encoding="utf-8"), p)
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: not UTF-8 text: {exc.reason} at byte {exc.start}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {exc}") from exc
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{p}: expected a mapping at the top level, got {type(raw).__name__}")
    try:
        return Config.model_validate(raw)
    except ValidationError as exc:
        lines = [f"{p}: {_location(tuple(e['loc']))}: {_message(e)}" for e in exc.errors()]
        raise ConfigError("\n".join(lines)) from exc
