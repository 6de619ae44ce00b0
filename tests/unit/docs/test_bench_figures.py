"""Every benchmark figure in the docs can be traced to a committed result file.

The pages are docs/benchmarks.md and docs/kueue-ungater.md (``PAGES``). The convention, written
down in docs/benchmarks.md, "How figures are cited":

(a) a generated table sits between ``<!-- bench report bench/results/NAME.json [--section S] -->``
    and ``<!-- end bench report -->`` and is exactly what ``python -m bench report`` prints for
    that file and section (``bench.doc_report.report``, markdown);
(b) every other figure sits in a section (the text under a heading, down to the next heading)
    that names at least one ``bench/results/NAME.json``;
(c) every ``bench/results/NAME.json`` a page names exists and is tracked by git.

A figure is a number followed by one of these units, with a space or without:
``ns``, ``µs`` (or ``us``), ``ms``, ``s``, ``min`` (time); ``B``, ``KB``, ``kB``, ``MB``, ``GB``, ``KiB``,
``MiB``, ``GiB`` (memory); ``%``; ``/s``, ``pods/s`` (rates); ``CPU-s`` (CPU time); ``x``
right after the number, a ratio such as ``2.5x``; ``cores`` after a fraction (``1.3 cores``, a
measured share of the machine).

Not figures: a number after a comparison (a goal: ``< 0.3 s``, ``>= 0.85x``); a number glued
to a letter or a dot before it (``k8s``, ``v0.19.2``); a count or a size with any other word
(``10k pods``, ``2 cores``, ``32 concurrent``, ``1 CPU per pod``, ``qps 200``, ``100 x 10``);
and a duration whose unit is spelled out (``30 seconds``, ``one second``), which is how the
pages write settings such as timeouts and batch periods.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from bench.doc_report import report
from bench.stats import summarize

ROOT = Path(__file__).resolve().parents[3]
PAGES = ("docs/benchmarks.md", "docs/kueue-ungater.md")

_CITED = re.compile(r"bench/results/[\w.\-]+\.json")
_BEGIN = re.compile(r"^<!-- bench report (?P<args>.*?) -->$")
_END = "<!-- end bench report -->"
_FIGURE = re.compile(
    r"(?<![\w.])(?P<number>\d+(?:[.,]\d+)*)"
    r"(?:\s?(?:[num]s|µs|s|min|[KkMG]i?B|B|CPU-s|pods/s|/s)(?![\w/%-])"
    r"|\s?%"
    r"|x\b"
    r"|\s(?P<cores>cores?)\b)"
)


def figures(line: str) -> list[str]:
    """The figures on one line of text."""
    found = []
    for m in _FIGURE.finditer(line):
        before = line[: m.start()].rstrip()
        if before.endswith(("<", ">", "≤", "≥", "<=", ">=")) and not before.endswith("->"):
            continue  # a goal
        if m["cores"] and "." not in m["number"]:
            continue  # the machine's cores, not a share of them
        found.append(m[0])
    return found


def _report_args(args: str) -> tuple[str, str | None] | None:
    words = args.split()
    if len(words) == 1:
        return words[0], None
    if len(words) == 3 and words[1] == "--section":
        return words[0], words[2]
    return None


def problems(page: str, text: str, root: Path, tracked: set[str]) -> list[str]:
    """What breaks the convention in ``text`` (the page ``page``, files relative to ``root``,
    ``tracked``: the paths git tracks), one message per finding, naming the line."""
    out: list[str] = []
    sections: list[list[tuple[int, str]]] = [[]]  # the lines of each section, numbered
    in_code = False
    generated: tuple[int, str, str | None, list[str]] | None = None  # start, file, section
    for no, line in enumerate(text.splitlines(), 1):
        if generated is not None:
            if line.strip() != _END:
                generated[3].append(line)
                continue
            start, path, section, table = generated
            generated = None
            if path in tracked and (root / path).is_file():
                try:
                    expected = report(root / path, section)
                except (OSError, ValueError, KeyError) as e:
                    out.append(f"{page}:{start}: python -m bench report {path}: {e}")
                    continue
                if "\n".join(table).strip() != expected:
                    out.append(
                        f"{page}:{start}: the table differs from `python -m bench report "
                        f"{path}{f' --section {section}' if section else ''}`"
                    )
            continue
        if line.lstrip().startswith("```"):
            in_code = not in_code
        elif not in_code and re.match(r"#{1,6} ", line):
            sections.append([])
        elif not in_code and (m := _BEGIN.match(line)):
            args = _report_args(m["args"])
            if args is None:
                out.append(f"{page}:{no}: not `bench/results/NAME.json [--section S]`: {line}")
            else:
                generated = (no, args[0], args[1], [])
        sections[-1].append((no, line))
    if generated is not None:
        out.append(f"{page}:{generated[0]}: the generated table has no `{_END}`")
    for lines in sections:
        cited = [(no, path) for no, line in lines for path in _CITED.findall(line)]
        for no, path in cited:
            if not (root / path).is_file():
                out.append(f"{page}:{no}: {path} does not exist")
            elif path not in tracked:
                out.append(f"{page}:{no}: {path} is not committed (git ls-files)")
        if cited:
            continue
        for no, line in lines:
            found = figures(line)
            if found:
                out.append(
                    f"{page}:{no}: {', '.join(repr(f) for f in found)} in a section that "
                    "cites no bench/results/NAME.json"
                )
    return out


def _tracked() -> set[str]:
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--", "bench/results"],
        capture_output=True,
        text=True,
        check=True,
    )
    return set(filter(None, listed.stdout.split("\0")))


@pytest.mark.parametrize("page", PAGES)
def test_every_figure_of_the_page_cites_a_committed_result(page: str) -> None:
    found = problems(page, (ROOT / page).read_text(), ROOT, _tracked())
    assert not found, "\n".join(found)


# The checker itself, on small pages.


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("released in 55-125 ms, 7.6 to 39 ms a read", ["125 ms", "39 ms"]),
        (
            "RSS 267 MB, peak 1.2 GB, 990 B per view, 23.5 GiB",
            ["267 MB", "1.2 GB", "990 B", "23.5 GiB"],
        ),
        (
            "2.06 CPU-s, 310/s, 176 pods/s, -27 %, 1.80x, 3x",
            ["2.06 CPU-s", "310/s", "176 pods/s", "27 %", "1.80x", "3x"],
        ),
        ("synced in 30.3 s (p95 33.1s), 8 min, 424 µs", ["30.3 s", "33.1s", "8 min", "424 µs"]),
        ("kube-apiserver on 1.3 cores", ["1.3 cores"]),
        ("10k pods on 2 cores, 32 concurrent, 1 CPU per pod, qps 200 / burst 400", []),
        ("Kueue v0.19.2, kubernetes-asyncio 36.1.0, kueue.x-k8s.io, 100 x 10 pods, 10 -> 20", []),
        ("goals: median < 0.3 s, < 200 MB, >= 0.85x, <= 1.5x the loop's", []),
        ("stalled 30 seconds after, a one-second batch, 15/15/10/8 repeats, 2026-12-05", []),
    ],
)
def test_what_counts_as_a_figure(line: str, expected: list[str]) -> None:
    assert figures(line) == expected


def _result(root: Path, name: str) -> str:
    path = f"bench/results/{name}"
    (root / "bench" / "results").mkdir(parents=True, exist_ok=True)
    metrics = {"freed_slot_latency": {"raised": summarize([0.014, 0.012, 0.02], "s")}}
    (root / path).write_text(json.dumps({"metrics": metrics, "table": []}))
    return path


def test_a_figure_in_a_section_that_cites_nothing_fails(tmp_path: Path) -> None:
    page = "# T\n\n## Method\n\nThe pod waits 30 seconds.\n\n## Results\n\nFreed slot: 14 ms.\n"
    assert problems("p.md", page, tmp_path, set()) == [
        "p.md:9: '14 ms' in a section that cites no bench/results/NAME.json"
    ]


def test_a_citation_covers_its_section_only(tmp_path: Path) -> None:
    path = _result(tmp_path, "run.json")
    page = f"## A\n\nFreed slot: 14 ms ({path}).\n\n### B\n\n12 ms.\n"
    assert problems("p.md", page, tmp_path, {path}) == [
        "p.md:7: '12 ms' in a section that cites no bench/results/NAME.json"
    ]


def test_citing_a_file_that_is_not_committed_or_missing_fails(tmp_path: Path) -> None:
    path = _result(tmp_path, "run.json")
    page = f"## Results\n\nFreed slot: 14 ms ({path}).\n\nSee bench/results/gone.json.\n"
    assert problems("p.md", page, tmp_path, set()) == [
        f"p.md:3: {path} is not committed (git ls-files)",
        "p.md:5: bench/results/gone.json does not exist",
    ]


def test_a_generated_table_must_be_the_report_of_its_file(tmp_path: Path) -> None:
    path = _result(tmp_path, "run.json")
    table = report(tmp_path / path, "freed")
    good = f"## Results\n\n<!-- bench report {path} --section freed -->\n{table}\n{_END}\n"
    assert problems("p.md", good, tmp_path, {path}) == []
    bad = good.replace("| 14 ms |", "| 13 ms |")
    assert bad != good
    assert problems("p.md", bad, tmp_path, {path}) == [
        f"p.md:3: the table differs from `python -m bench report {path} --section freed`"
    ]
    unclosed = good.replace(_END, "")
    assert problems("p.md", unclosed, tmp_path, {path}) == [
        "p.md:3: the generated table has no `<!-- end bench report -->`"
    ]


def test_a_section_with_no_rows_in_the_file_fails(tmp_path: Path) -> None:
    path = _result(tmp_path, "run.json")
    page = f"## Results\n\n<!-- bench report {path} --section scale -->\n{_END}\n"
    assert problems("p.md", page, tmp_path, {path}) == [
        f"p.md:3: python -m bench report {path}: {tmp_path / path}: no rows of section 'scale'"
    ]


def test_a_good_page_passes(tmp_path: Path) -> None:
    path = _result(tmp_path, "run.json")
    page = (
        "# Benchmarks\n\nHow it measures: 20 samples, a stall after 30 seconds.\n\n"
        "```console\n# not a heading: 5 ms in a code block of the same section\n```\n\n"
        f"## Results\n\n<!-- bench report {path} -->\n{report(tmp_path / path)}\n{_END}\n\n"
        f"The freed slot took 14 ms at the median ({path}).\n"
    )
    assert problems("p.md", page.replace("5 ms", "5 seconds"), tmp_path, {path}) == []
    assert problems("p.md", page, tmp_path, {path}) == [
        "p.md:6: '5 ms' in a section that cites no bench/results/NAME.json"
    ]
