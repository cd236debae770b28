"""A measured figure lives in one place, ``benchmarks/README.md``; the README and the docs link to
it (a figure written twice drifts: the docs and the benchmarks once disagreed on the same run)."""

from __future__ import annotations

import re

from tests.support import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BENCHMARKS = ROOT / "benchmarks" / "README.md"

# A number with a unit of time, size or rate, beside a word that reports a measurement.
FIGURE = re.compile(
    r"\b\d[\d,.]*(?: to \d[\d,.]*)? ?(?:ms|µs|s|MiB|MB|GiB|x|scores/s|spans/s|traces/s)\b"
)
MEASURED = re.compile(
    r"\b(?:took|peaked|measured|costs?|percentile|median|p50|p99|stays? under|stayed)\b", re.I
)


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_no_measured_figure_outside_the_benchmarks_readme() -> None:
    found = []
    for doc in DOCS:
        for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            if FIGURE.search(line) and MEASURED.search(line):
                found.append(f"{doc.relative_to(ROOT)}:{number}: {line.strip()}")
    assert found == [], "move the figure to benchmarks/README.md and link it"


def test_the_links_to_the_benchmark_figures_resolve() -> None:
    headings = {
        _anchor(line.lstrip("#"))
        for line in BENCHMARKS.read_text(encoding="utf-8").splitlines()
        if line.startswith("#")
    }
    links = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        links += [
            (doc.relative_to(ROOT), anchor)
            for anchor in re.findall(r"benchmarks/README\.md#([\w-]+)", text)
        ]
    assert len(links) >= 5
    assert [(str(doc), a) for doc, a in links if a not in headings] == []
