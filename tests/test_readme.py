"""The front door tells the present: README.md and docs/performance.md are short, and what they
quote from measurements is rendered from the pinned snapshots and the benchmark table."""
from __future__ import annotations

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import benchtable  # noqa: E402
import readme  # noqa: E402


def test_the_readme_is_short():
    """At most 10 KB: what it is, how to start, what is verified, the commands; history is in git."""
    assert len((ROOT / "README.md").read_bytes()) <= 10 * 1024


def test_the_performance_page_is_short():
    """At most 15 KB: how each benchmark measures, what limits it, the latest table."""
    assert len((ROOT / "docs" / "performance.md").read_bytes()) <= 15 * 1024


def test_the_verified_claims_are_rendered_from_the_snapshots_and_the_spec_index():
    """README's "What is verified" block is tools/readme.py's rendering of today's snapshots and
    spec/README.md's statuses (`python tools/readme.py` rewrites it)."""
    block = readme.BLOCK.search(readme.README.read_text())
    assert block is not None and block.group(2) == readme.render(), \
        "stale: run python tools/readme.py"


def test_the_verified_claims_table_is_on_the_first_screen():
    """A reader sees the headline claims without scrolling far: the table starts in the first 50
    lines."""
    lines = readme.README.read_text().splitlines()
    assert lines.index("| claim | what | measured here | paper | status |") < 50


def test_the_readmes_benchmark_summary_is_the_latest_run_of_the_performance_table():
    """README's benchmark rows are benchtable.summary of docs/performance.md's table."""
    table = benchtable.BLOCK.search(benchtable.PAGE.read_text())
    summary = benchtable.SUMMARY.search(benchtable.README.read_text())
    assert table is not None and summary is not None
    assert summary.group(2) == benchtable.summary(table.group(2)), \
        "stale: python tools/benchtable.py BENCH.json rewrites both"
