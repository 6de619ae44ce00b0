"""Docs that must track the code: every hook and every config key is documented."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from ungater._model.config import Config
from ungater._plugins import hookspecs as hookspecs

DOCS = Path(__file__).resolve().parents[3] / "docs"


def _hook_names() -> list[str]:
    return [n for n in dir(hookspecs) if n.startswith("ungater_")]


def test_every_hook_is_documented_in_plugins_md() -> None:
    text = (DOCS / "plugins.md").read_text()
    missing = [n for n in _hook_names() if f"`{n}" not in text]
    assert _hook_names(), "no hook specs found"
    assert not missing, f"hooks missing from docs/plugins.md: {missing}"


def _keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    out = []
    for name, field in model.model_fields.items():
        key = prefix + (field.alias or name)
        out.append(key)
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out.extend(_keys(ann, key + "."))
    return out


def test_every_config_key_is_documented_in_config_md() -> None:
    text = (DOCS / "config.md").read_text()
    missing = [k for k in _keys(Config) if f"`{k}`" not in text]
    assert not missing, f"config keys missing from docs/config.md: {missing}"
