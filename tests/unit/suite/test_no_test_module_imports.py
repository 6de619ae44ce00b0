"""No test module is a library of another: shared helpers live in support modules named by what
they hold (docs/testing.md, "Where the helpers live"), so a test module can be moved, split or
deleted without breaking one that borrowed from it, and no test is collected twice by being
imported. Inner pytest sessions written as strings (``pytester``) count too."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
_FROM_IN_TEXT = re.compile(r"^\s*from\s+([\w.]+)\s+import\s+\(?\s*([\w\s,]+)", re.M)
_IMPORT_IN_TEXT = re.compile(r"^\s*import\s+([\w.]+)", re.M)


def _is_test(name: str) -> bool:
    return name.rsplit(".", 1)[-1].startswith("test_")


def _bad(module: str, names: list[str]) -> bool:
    """``from module import names`` reaches into a test module (or takes a test from one)."""
    return _is_test(module) or any(n.startswith("test_") for n in names)


def _imports(source: str) -> Iterator[tuple[int, str, list[str]]]:
    """(line, module, names) of every import, nested ones and those in string literals too."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            yield node.lineno, node.module or "", [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name, []
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            for m in _FROM_IN_TEXT.finditer(node.value):
                names = [n.strip() for n in m.group(2).replace("\n", ",").split(",") if n.strip()]
                yield node.lineno, m.group(1), [n.split()[0] for n in names]
            for m in _IMPORT_IN_TEXT.finditer(node.value):
                yield node.lineno, m.group(1), []


def offenders(root: Path) -> list[str]:
    """Every import, under tests/ and examples/*/tests, of a module named ``test_*``."""
    files = [*root.glob("tests/**/*.py"), *root.glob("examples/*/tests/**/*.py")]
    found = []
    for path in sorted(files):
        for line, module, names in _imports(path.read_text()):
            if _bad(module, names):
                what = f"from {module} import {', '.join(names)}" if names else f"import {module}"
                found.append(f"{path.relative_to(root)}:{line}: {what}")
    return found


def test_no_test_module_imports_from_another() -> None:
    assert offenders(ROOT) == []


def test_every_form_of_such_an_import_is_found(tmp_path: Path) -> None:
    # the samples say T_ for test_, or this module's own strings would be found
    cases = {
        "tests/integration/test_a.py": "from tests.integration.T_b import helper\n",
        "tests/unit/test_c.py": "from tests.unit import T_d\n",
        "tests/unit/x/test_e.py": "def f():\n    import tests.unit.T_f\n",
        "examples/ex/tests/test_g.py": "from .T_h import helper\n",
        "tests/unit/test_i.py": 'INNER = """\nimport pytest\n\nfrom tests.unit.T_j import S\n"""\n',
        "tests/unit/test_k.py": "from tests.unit.support import (\n    T_case,\n)\n",
    }
    fine = {
        "tests/integration/test_ok.py": "from tests.integration.jobs import make_job\n",
        "tests/unit/test_ok2.py": "from tests.unit import harness\nimport testing_lib\n",
        "examples/ex/tests/test_ok3.py": "from ungater.testing import owner_ref\n",
    }
    for rel, text in {**cases, **fine}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text.replace("T_", "test_"))
    assert sorted(o.split(":", 1)[0] for o in offenders(tmp_path)) == sorted(cases)
