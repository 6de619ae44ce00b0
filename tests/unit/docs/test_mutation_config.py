"""`make mutation` mutates and tests only what pyproject's ``[tool.mutmut]`` names: a file that
was renamed or moved would silently drop out of the mutation run, so every path must exist."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_every_file_mutmut_mutates_or_runs_exists() -> None:
    mutmut = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    named = [
        p for key in ("only_mutate", "pytest_add_cli_args_test_selection") for p in mutmut[key]
    ]
    assert len(named) > 20
    assert [p for p in named if not (ROOT / p).exists()] == []
