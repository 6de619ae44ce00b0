"""The runtime wheel ships only the runtime: built from exactly what the image's build context
admits (deploy/Dockerfile.dockerignore), it holds no local control plane, no demo, no pytest
plugin and requires no cryptography, in any extra. The dev tools are devtools/'s own wheel."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _build_context(dest: Path) -> None:
    """Copy what the Dockerfile's context admits (its `!path` lines), caches left out."""
    ignore = (ROOT / "deploy" / "Dockerfile.dockerignore").read_text().split()
    admitted = [line[1:].rstrip("/") for line in ignore if line.startswith("!")]
    assert "pyproject.toml" in admitted and "ungater" in admitted, admitted
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for rel in admitted:
        source, target = ROOT / rel, dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=skip)
        else:
            shutil.copy2(source, target)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    src = tmp_path_factory.mktemp("context")
    out = tmp_path_factory.mktemp("wheels")
    _build_context(src)
    # no build isolation: the venv's setuptools (the test extra) builds it, with no network
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index"]
    proc = subprocess.run(
        [*pip, "-q", "-w", str(out), str(src)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (built,) = out.glob("ungater-*.whl")
    return zipfile.ZipFile(built)


def _dist_info(wheel: zipfile.ZipFile, name: str) -> str:
    (path,) = [n for n in wheel.namelist() if n.endswith(f".dist-info/{name}")]
    return wheel.read(path).decode()


def test_the_runtime_wheel_holds_the_runtime_and_nothing_of_the_dev_tools(
    wheel: zipfile.ZipFile,
) -> None:
    names = wheel.namelist()
    sources = {p.relative_to(ROOT).as_posix() for p in (ROOT / "ungater").rglob("*.py")}
    missing = sorted(sources - set(names))
    assert not missing, f"modules left out of the wheel (pyproject's packages?): {missing}"
    assert "ungater/_cli/main.py" in names and "ungater_plugins/job.py" in names
    assert "ungater/py.typed" in names
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"ungater", "ungater_plugins"}, tops
    unwanted = [n for n in names if "devcluster" in n or "devtools" in n or n.endswith("demo.py")]
    assert not unwanted, unwanted
    assert not [n for n in names if n.endswith((".go.tmpl", "pytest_plugin.py"))]


def test_the_runtime_wheel_registers_no_pytest_plugin_and_no_dev_command(
    wheel: zipfile.ZipFile,
) -> None:
    entry_points = _dist_info(wheel, "entry_points.txt")
    groups = {line.strip()[1:-1] for line in entry_points.splitlines() if line.startswith("[")}
    assert groups == {"console_scripts", "ungater.plugins"}, groups
    assert "devcluster" not in entry_points and "ungater_devtools" not in entry_points


def test_the_runtime_wheel_requires_no_cryptography_in_any_extra(wheel: zipfile.ZipFile) -> None:
    metadata = Parser().parsestr(_dist_info(wheel, "METADATA"))
    requires = metadata.get_all("Requires-Dist") or []
    assert requires, "the runtime's dependencies are missing from METADATA"
    assert not [r for r in requires if r.lower().startswith(("cryptography", "ungater-devtools"))]
    assert "devcluster" not in (metadata.get_all("Provides-Extra") or [])
