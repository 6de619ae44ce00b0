"""Docs that must track the code: every hook and every config key is documented, and every
link between the docs leads to a file (and a heading) that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from ungater._model.config import Config
from ungater._plugins import hookspecs as hookspecs

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs"


def _hook_names() -> list[str]:
    return [n for n in dir(hookspecs) if n.startswith("ungater_")]


def test_every_hook_is_documented_in_the_hooks_reference() -> None:
    text = (DOCS / "plugins" / "hooks.md").read_text()
    missing = [n for n in _hook_names() if f"### `{n}(" not in text]
    assert _hook_names(), "no hook specs found"
    assert not missing, f"hooks without a heading in docs/plugins/hooks.md: {missing}"


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


def _pages() -> list[Path]:
    return sorted(
        [ROOT / "README.md", *DOCS.rglob("*.md"), *(ROOT / "examples").glob("*/README.md")]
    )


_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # no headings in code
    return {_anchor(m) for m in re.findall(r"^#+ (.+)$", text, re.M)}


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_leads_somewhere(page: Path) -> None:
    broken = []
    for target in _LINK.findall(re.sub(r"```.*?```", "", page.read_text(), flags=re.S)):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        heading_missing = anchor and dest.suffix == ".md" and anchor not in _anchors(dest)
        if not dest.exists() or heading_missing:
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: links to nothing: {broken}"
