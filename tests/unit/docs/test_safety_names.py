"""docs/safety.md names, for every path it argues, the test that fails without the mechanism:
each name must lead to a test that exists, or the argument points at nothing."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SAFETY = ROOT / "docs" / "safety.md"
#: `dir/test_file.py::test_name` or, after one, `::test_name` (the same file)
NAME = re.compile(r"`((?:[\w/]+/)?test_\w+\.py)?::(test_\w+)`")


def named_tests(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    last = ""
    for match in NAME.finditer(text):
        path, test = match.groups()
        last = path or last
        out.append((last, test))
    return out


def test_every_test_named_in_safety_md_exists() -> None:
    named = named_tests(SAFETY.read_text())
    assert len(named) > 30  # the page names its tests; a parse that finds none proves nothing
    missing = []
    for path, test in named:
        source = ROOT / "tests" / "unit" / path
        if not source.exists():
            source = ROOT / "tests" / path
        text = source.read_text() if source.exists() else ""
        if not re.search(rf"^(async )?def {test}\(", text, re.M):
            missing.append(f"{path}::{test}")
    assert not missing, f"docs/safety.md names tests that do not exist: {missing}"


def test_a_renamed_test_is_caught() -> None:
    assert named_tests("`controller/test_x.py::test_a`, `::test_b`") == [
        ("controller/test_x.py", "test_a"),
        ("controller/test_x.py", "test_b"),
    ]
