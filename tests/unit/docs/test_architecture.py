"""The tree and its map agree: docs/architecture.md describes every folder of ungater/ and
names every module in it, each folder says what it is, and each import-linter contract breaks
on the import it exists to forbid."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ungater_devtools.ci import in_ci

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "ungater"


def _folders() -> set[str]:
    return {p.parent.name for p in PACKAGE.glob("*/__init__.py")}


def _tree_section() -> str:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    start = doc.index("## The tree")
    end = doc.index("\n## ", start + 1)
    return doc[start:end]


def _bullets() -> dict[str, str]:
    """Folder name -> its bullet's text, from the list under "The tree"."""
    out: dict[str, str] = {}
    for bullet in re.split(r"\n- ", _tree_section())[1:]:
        m = re.match(r"\*\*`(_\w+)/`\*\*", bullet)
        if m:
            out[m.group(1)] = bullet
    return out


def test_every_folder_is_described_and_every_described_folder_exists() -> None:
    assert set(_bullets()) == _folders()


@pytest.mark.parametrize("folder", sorted(_folders()))
def test_the_description_of_a_folder_names_each_of_its_modules(folder: str) -> None:
    bullet = _bullets().get(folder, "")
    modules = sorted(p.name for p in (PACKAGE / folder).glob("*.py") if p.name != "__init__.py")
    unnamed = [m for m in modules if f"`{m}`" not in bullet]
    assert not unnamed, f"docs/architecture.md, {folder}/: not described: {unnamed}"


@pytest.mark.parametrize("folder", sorted(_folders()))
def test_each_folder_says_what_it_is_in_one_docstring(folder: str) -> None:
    init = ast.parse((PACKAGE / folder / "__init__.py").read_text())
    doc = ast.get_docstring(init) or ""
    assert len(doc.split()) >= 15, f"{folder}/__init__.py needs a paragraph saying what it is"
    assert len(init.body) == 1, f"{folder}/__init__.py holds only its docstring (no re-exports)"


# Each contract of .importlinter, and one import it exists to forbid: (file, line to add).
BREAKS = {
    "layers": ("ungater/_decide/decision.py", "import ungater._controller.state"),
    "controller-layers": ("ungater/_controller/state.py", "import ungater._controller.reconciler"),
    "pure-folders": ("ungater/_model/views.py", "import asyncio"),
    "runtime-ships-no-dev-tools": ("ungater/_cli/main.py", "import ungater_devtools"),
    "private-internals": ("ungater_plugins/job.py", "import ungater._decide.decision"),
    "plugins-are-pure": ("ungater_plugins/raycluster.py", "import anyio"),
    "example-plugin-stands-alone": (
        "ungater_leaderworkerset/__init__.py",
        "import ungater_plugins.job",
    ),
    "builtin-plugins-independent": ("ungater_plugins/job.py", "import ungater_plugins.jobset"),
    # hidden in a function, the way the plane once reached for the peers
    "plane-knows-no-peers": (
        "ungater_devtools/devcluster/plane/plane.py",
        "def _peers() -> None: import ungater_devtools.devcluster.peers.runner",
    ),
}


def _contracts() -> list[str]:
    return re.findall(
        r"^\[importlinter:contract:([\w-]+)\]", (ROOT / ".importlinter").read_text(), re.M
    )


def test_every_contract_has_an_import_that_breaks_it() -> None:
    assert sorted(BREAKS) == sorted(_contracts())


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The packages import-linter reads, copied under the names they are imported by."""
    dest = tmp_path_factory.mktemp("tree")
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for source, name in (
        (PACKAGE, "ungater"),
        (ROOT / "plugins", "ungater_plugins"),
        (ROOT / "devtools" / "ungater_devtools", "ungater_devtools"),
        (ROOT / "examples" / "ungater-leaderworkerset" / "ungater_leaderworkerset", None),
    ):
        shutil.copytree(source, dest / (name or source.name), ignore=skip)
    shutil.copy2(ROOT / ".importlinter", dest / ".importlinter")
    return dest


def _lint(tree: Path, contract: str) -> subprocess.CompletedProcess[str]:
    lint = Path(sys.executable).with_name("lint-imports")
    if not lint.exists():  # the `lint` dependency group, which `make install` adds
        why = f"{lint} missing: pip install --group lint"
        if in_ci():
            pytest.fail(why)
        pytest.skip(why)
    return subprocess.run(
        [str(lint), "--no-cache", "--contract", contract],
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("contract", sorted(BREAKS))
def test_a_forbidden_import_breaks_its_contract(tree: Path, contract: str) -> None:
    relative, line = BREAKS[contract]
    target = tree / relative
    original = target.read_text()
    kept = _lint(tree, contract)
    assert kept.returncode == 0 and "KEPT" in kept.stdout, kept.stdout + kept.stderr
    try:
        target.write_text(original + f"\n{line}  # noqa\n")
        broken = _lint(tree, contract)
    finally:
        target.write_text(original)
    assert broken.returncode != 0 and "BROKEN" in broken.stdout, broken.stdout + broken.stderr


def test_the_unit_tests_have_a_folder_for_each_runtime_folder() -> None:
    tests = {p.parent.name for p in (ROOT / "tests" / "unit").glob("*/__init__.py")}
    missing = sorted(f for f in _folders() if f.lstrip("_") not in tests)
    assert not missing, f"tests/unit/ has no folder for {missing}"
    loose = sorted(p.name for p in (ROOT / "tests" / "unit").glob("test_*.py"))
    assert not loose, f"unit tests outside a folder: {loose}"
