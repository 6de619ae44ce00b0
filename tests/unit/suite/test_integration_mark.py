"""Every test under tests/integration carries the ``integration`` mark, its module's own
``pytestmark`` or not: the hook in tests/integration/conftest.py adds it (a ``pytestmark`` in a
conftest marks nothing)."""

from __future__ import annotations

from pathlib import Path

import pytest

INTEGRATION_CONFTEST = Path(__file__).parents[2] / "integration" / "conftest.py"


@pytest.fixture
def tree(pytester: pytest.Pytester) -> pytest.Pytester:
    """A test tree with the integration conftest over one unmarked module, and a test beside."""
    (pytester.path / "integration").mkdir()
    (pytester.path / "integration" / "conftest.py").write_text(INTEGRATION_CONFTEST.read_text())
    (pytester.path / "integration" / "test_unmarked.py").write_text(
        "def test_inside():\n    pass\n"
    )
    (pytester.path / "test_outside.py").write_text("def test_outside():\n    pass\n")
    return pytester


def test_not_integration_leaves_out_an_unmarked_integration_module(tree: pytest.Pytester) -> None:
    result = tree.runpytest_inprocess("-p", "no:cacheprovider", "-m", "not integration", "-v")
    result.assert_outcomes(passed=1, deselected=1)
    result.stdout.fnmatch_lines(["*test_outside.py::test_outside PASSED*"])


def test_integration_selects_it(tree: pytest.Pytester) -> None:
    result = tree.runpytest_inprocess("-p", "no:cacheprovider", "-m", "integration", "-v")
    result.assert_outcomes(passed=1, deselected=1)
    result.stdout.fnmatch_lines(["*integration/test_unmarked.py::test_inside PASSED*"])
