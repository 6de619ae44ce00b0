"""Every figure of README.md, docs/*.md and docs/plugins/*.md is listed, with what backs it, in
docs/figures.txt, and the backed ones equal their source (``bench/doc_figures.py``).

The ledger is compared with the pages figure by figure, in order: a figure changed, added or
removed in a page fails until its line says what backs the new one; a measurement (``bench``),
a timing (``timing``) or a default (``code``) fails when its source no longer gives it to the
precision it is printed with. The planted drifts below are run on copies of the real pages.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from bench import doc_figures
from bench.doc_figures import LEDGER, _numbers, figures, pages, problems, read_ledger, skeleton

ROOT = doc_figures.ROOT


def test_every_figure_is_listed_and_equals_its_source() -> None:
    found = problems()
    assert not found, "\n".join(found)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the pages and the ledger (the result files are read from the real tree)."""
    for page in pages(ROOT):
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / page, tmp_path / page)
    shutil.copy2(ROOT / LEDGER, tmp_path / LEDGER)
    return tmp_path


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} is not once in {path}"
    path.write_text(text.replace(old, new))


def test_the_figure_the_issue_names_cannot_drift(tree: Path) -> None:
    """Issue 41: "57 ms" (55 ms in the spans) changed to "5 ms" in docs/benchmarks.md."""
    assert problems(tree) == []
    _edit(
        tree / "docs/benchmarks.md", "medians): 55 ms on a scale-up", "medians): 5 ms on a scale-up"
    )
    assert any("docs/benchmarks.md" in p and "'5 ms'" in p for p in problems(tree))


def test_a_claim_replaced_by_a_new_figure_fails(tree: Path) -> None:
    """Issue 41: the "ahead on N of 8 cases" claim of docs/kueue-ungater.md made "99x faster"."""
    _edit(tree / "docs/kueue-ungater.md", "on 7 of 8 cases in this run", "99x faster in this run")
    assert any("docs/kueue-ungater.md" in p and "'99x'" in p for p in problems(tree))


def test_a_figure_changed_in_the_page_and_the_ledger_alike_fails_on_its_source(
    tree: Path,
) -> None:
    _edit(
        tree / "docs/benchmarks.md",
        "medians): 55 ms on a scale-up",
        "medians): 57 ms on a scale-up",
    )
    ledger = (tree / LEDGER).read_text()
    (tree / LEDGER).write_text(ledger.replace("\n55 ms | bench span(", "\n57 ms | bench span(", 1))
    (found,) = problems(tree)
    assert found.startswith("docs/benchmarks.md:") and "'57 ms' is 54.759 by its source" in found


def _bumped(text: str) -> str:
    """The figure with its first number raised by two units of its last printed digit."""
    m = re.search(r"\d+(?:,\d{3})*(?:\.(\d+))?", text)
    assert m is not None
    places = len(m[1] or "")
    number = float(m[0].replace(",", "")) + 2 * 10**-places
    return text[: m.start()] + f"{number:.{places}f}" + text[m.end() :]


PAGES_WITH_FIGURES = [p for p in pages(ROOT) if figures((ROOT / p).read_text())]


@pytest.mark.parametrize("page", PAGES_WITH_FIGURES)
def test_every_figure_of_the_page_fails_when_it_drifts(tree: Path, page: str) -> None:
    """Each figure of the page, raised in the page alone, fails; and each backed one, raised in
    the page and the ledger alike, fails on its source."""
    text = (ROOT / page).read_text()
    lines = text.splitlines(keepends=True)
    entries = read_ledger((ROOT / LEDGER).read_text())[page]
    ledger = (ROOT / LEDGER).read_text().splitlines(keepends=True)
    for fig, entry in zip(figures(text), entries, strict=True):
        drifted = _bumped(fig.text)
        changed = lines.copy()
        line = changed[fig.line - 1]
        assert line[fig.column :].startswith(fig.text)
        changed[fig.line - 1] = line[: fig.column] + drifted + line[fig.column + len(fig.text) :]
        (tree / page).write_text("".join(changed))
        assert problems(tree, page), f"{page}:{fig.line}: {fig.text!r} -> {drifted!r} passed"
        if entry.kind != "setting":
            moved = ledger.copy()
            moved[entry.line - 1] = moved[entry.line - 1].replace(fig.text, drifted, 1)
            (tree / LEDGER).write_text("".join(moved))
            assert problems(tree, page), f"{page}:{fig.line}: {drifted!r} in both passed its source"
            (tree / LEDGER).write_text("".join(ledger))
    (tree / page).write_text(text)
    assert problems(tree, page) == []


# The reader of figures and the ledger, on small pages.


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("released in 55-125 ms, 7.6 to 39 ms a read", ["55-125 ms", "7.6 to 39 ms"]),
        (
            "RSS 267 MB, peak 1.2 GB, 990 B per view, 2.2 KB",
            ["267 MB", "1.2 GB", "990 B", "2.2 KB"],
        ),
        (
            "2.06 CPU-s, 310/s, 176 pods/s, 27 %, 1.80x, 3x",
            ["2.06 CPU-s", "310/s", "176 pods/s", "27 %", "1.80x", "3x"],
        ),
        (
            "1149 tests, 191 pass, 9 fail, 32 passed, 17 of 200 seeds",
            ["1149 tests", "191 pass", "9 fail", "32 passed", "17 of 200"],
        ),
        (
            "1.86 of the 2 cores, ratios 0.74\u20130.82, 6 of 8 cases.",
            ["1.86 of the 2", "0.74\u20130.82", "6 of 8"],
        ),
        ("kube-apiserver on 1.3 cores, 2 cores, v0.19.2, k8s, 10k pods", ["1.3 cores"]),
        ("goals: median < 0.3 s, < 200 MB, >= 0.85x; `5 ms` in code; <!-- 7 ms -->", []),
    ],
)
def test_what_counts_as_a_figure(line: str, expected: list[str]) -> None:
    assert [f.text for f in figures(line)] == expected


def test_code_blocks_and_generated_tables_hold_no_figures() -> None:
    page = (
        "a 5 ms\n```\n6 ms\n```\n<!-- bench report bench/results/x.json -->\n| 7 ms |\n"
        "<!-- end bench report -->\nand 8 ms\n"
    )
    assert [(f.text, f.line) for f in figures(page)] == [("5 ms", 1), ("8 ms", 8)]


def test_the_numbers_of_a_figure_and_their_rounding() -> None:
    assert _numbers("55 ms") == [(55.0, 0.5)]
    assert _numbers("0.49x") == [(0.49, 0.005)]
    assert _numbers("7 of 8") == [(7.0, 0.5), (8.0, 0.5)]
    assert _numbers("103,301,282 B") == [(103301282.0, 0.5)]


def _mini(tmp_path: Path, page: str, ledger: str) -> Path:
    (tmp_path / "docs").mkdir(parents=True)
    (tmp_path / "README.md").write_text(page)
    (tmp_path / LEDGER).write_text(ledger)
    return tmp_path


def test_a_figure_missing_from_the_ledger_or_left_there_fails(tmp_path: Path) -> None:
    root = _mini(tmp_path, "Took 2 s.\n", "[README.md]\n")
    assert problems(root) == [f"README.md:1: '2 s' is not in {LEDGER}"]
    root = _mini(tmp_path / "b", "Took long.\n", "[README.md]\n2 s | setting a test's wait\n")
    assert problems(root) == [f"{LEDGER}:2: '2 s' is no longer in README.md"]


def test_a_setting_says_what_it_is_and_an_unknown_kind_fails(tmp_path: Path) -> None:
    root = _mini(tmp_path, "Waits 2 s, then 3 s.\n", "[README.md]\n2 s | setting\n3 s | guess 3\n")
    assert problems(root) == [
        f"{LEDGER}:2: '2 s': ValueError: a setting says what it is",
        f"{LEDGER}:3: '3 s': ValueError: unknown kind 'guess'",
    ]


def test_a_default_is_checked_against_the_code(tmp_path: Path) -> None:
    page = "Stalled after 30 s.\n"
    good = "[README.md]\n30 s | code bench.sizes:FULL.kueue_stall_s\n"
    assert problems(_mini(tmp_path, page, good)) == []
    bad = _mini(tmp_path / "b", page.replace("30 s", "20 s"), good.replace("30 s", "20 s"))
    assert problems(bad) == [
        f"README.md:1: '20 s' is 30 by its source ({LEDGER}:2: code bench.sizes:FULL.kueue_stall_s)"
    ]


def test_a_timing_comes_from_the_committed_record(tmp_path: Path) -> None:
    root = _mini(tmp_path, "CI took 512 s.\n", "[README.md]\n512 s | timing ci-warm\n")
    (root / "bench" / "results").mkdir(parents=True)
    record = '{"machine": {"nproc": 2}, "timings": {"ci-warm": {"seconds": 511.8}}}'
    (root / doc_figures.TIMINGS).write_text(record)
    assert problems(root) == []
    (root / doc_figures.TIMINGS).write_text(record.replace("511.8", "498"))
    assert problems(root) == [
        f"README.md:1: '512 s' is 498 by its source ({LEDGER}:2: timing ci-warm)"
    ]


def test_the_timing_record_names_its_machine() -> None:
    """A timing is only comparable on a named machine: the record says which, and how it was
    read; each timing says what ran, at which commit and when."""
    record = json.loads((ROOT / doc_figures.TIMINGS).read_text())
    machine = record["machine"]
    assert machine["nproc"] >= 1 and machine["mem_total_gib"] > 0 and machine["how"]
    for key, timing in record["timings"].items():
        assert {"seconds", "command", "commit", "date"} <= set(timing), key


def test_the_skeleton_keeps_the_sources_of_figures_that_stayed(tmp_path: Path) -> None:
    ledger = "[README.md]\n2 s | setting a wait\n3 s | setting another\n"
    root = _mini(tmp_path, "Waits 2 s, then 9 ms, then 3 s.\n", ledger)
    assert skeleton(root).splitlines()[:4] == [
        "[README.md]",
        "2 s | setting a wait",
        "9 ms | ?  # line 1",
        "3 s | setting another",
    ]
