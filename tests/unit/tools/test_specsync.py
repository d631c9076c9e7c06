"""tools/specsync.py: spec/'s tables and quoted numbers are rewritten from the snapshots, a stale
one is listed, and ``--refresh`` runs exactly the tests whose snapshots spec/ shows."""
from __future__ import annotations

import pytest

from tools import specsync

TABLE = """| model | config | peak (B) | ratio | ratio |
|---|---|---|---|---|
| 40B | C1 | 28,774,066,578 | 1.14 | 0.96 |
| 40B | C2 | 16,191,154,578 | 1.55 | 1.26 |
| 100B | C1 | 101,574,401,682 | 0.96 | 0.91 |

| model | most layers |
|---|---|
| 40B | 56 |
"""


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """A repository with one snapshot file and a spec/ folder, as specsync's ROOT."""
    snap = tmp_path / "tests/claims/__snapshots__/test_x/test_t.md"
    snap.parent.mkdir(parents=True)
    snap.write_text(TABLE)
    (tmp_path / "spec").mkdir()
    monkeypatch.setattr(specsync, "ROOT", tmp_path)
    return tmp_path


def quote(row: str, col: str, value: str, fmt: str = "") -> str:
    return f"<!-- cell: test_x/test_t.md :: {row} :: {col}{fmt} -->{value}<!-- /cell -->"


def test_a_cell_is_found_by_its_rows_leading_cells_and_its_column():
    assert specsync.cell(TABLE, "40B & C2", "ratio") == "1.55"
    assert specsync.cell(TABLE, "100B", "peak (B)") == "101,574,401,682"
    assert specsync.cell(TABLE, "40B", "most layers") == "56"      # the table with that column
    assert specsync.cell(TABLE, "40B & C2", "ratio#2") == "1.26"    # the second of that name


@pytest.mark.parametrize("row,col", [("40B", "ratio"), ("70B", "ratio"), ("40B & C1", "peak"),
                                     ("40B & C1", "ratio#3")])
def test_an_ambiguous_or_missing_cell_is_an_error_naming_it(row, col):
    with pytest.raises(LookupError, match=f"rows match {row!r} in a table with column {col!r}"):
        specsync.cell(TABLE, row, col)


def test_a_byte_count_is_quoted_in_gb_to_the_asked_decimals():
    assert specsync.formatted("28,774,066,578", "GB1") == "28.8"
    assert specsync.formatted("28,774,066,578", "GB2") == "28.77"
    assert specsync.formatted("1.55", None) == "1.55"


def test_a_stale_quote_is_listed_then_rewritten(tree):
    page = tree / "spec" / "p.md"
    fresh = (f"C1 peaks at {quote('40B & C1', 'peak (B)', '28.8', ' :: GB1')} GB "
             f"({quote('40B & C1', 'ratio', '1.14')}×).")
    page.write_text(fresh.replace(">1.14<", ">1.12<").replace(">28.8<", ">29.0<"))
    assert specsync.sync(page, write=False) == ["test_x/test_t.md (40B & C1 :: peak (B))",
                                                "test_x/test_t.md (40B & C1 :: ratio)"]
    assert specsync.sync(page, write=True) and page.read_text() == fresh
    assert specsync.sync(page, write=False) == []


def test_a_stale_block_is_rewritten_and_a_missing_snapshot_named(tree):
    page = tree / "spec" / "p.md"
    marker = "<!-- snapshot: tests/claims/__snapshots__/test_x/test_t.md -->\n"
    page.write_text(marker + "| old |\n<!-- /snapshot -->\n")
    assert specsync.sync(page, write=True) == ["tests/claims/__snapshots__/test_x/test_t.md"]
    assert page.read_text() == marker + TABLE + "<!-- /snapshot -->\n"
    page.write_text(quote("40B", "most layers", "56").replace("test_t", "test_gone"))
    with pytest.raises(FileNotFoundError, match="test_x/test_gone.md does not exist"):
        specsync.sync(page, write=False)


def test_a_snapshot_belongs_to_the_test_file_beside_its_folder():
    assert specsync.test_file("tests/claims/__snapshots__/test_evaluation/test_figure3_table.md") \
        == "tests/claims/test_evaluation.py"
    assert specsync.test_file("tests/unit/zero/__snapshots__/test_ds3/test_a.md") \
        == "tests/unit/zero/test_ds3.py"


def marks(cmd: list[str]) -> str:
    """The -m expression of a ``python -m pytest ... -m EXPR`` command."""
    return cmd[len(cmd) - cmd[::-1].index("-m")]


def test_refresh_updates_the_snapshots_spec_shows_then_rewrites_and_draws(monkeypatch):
    """--refresh: pytest on the test files of every snapshot spec/'s pages and figures read, with
    --snapshot-update and -m "not deepspeed" (--quick: "not slow and not deepspeed"); then the pages,
    then the README's verified block, then the figures."""
    calls = []
    monkeypatch.setattr(specsync.subprocess, "call", lambda cmd, cwd: calls.append(cmd) or 0)
    monkeypatch.setattr(specsync, "main", lambda argv: calls.append(["sync"]) or 0)
    assert specsync.refresh(quick=True) == 0
    pytest_cmd, sync, readme, figures = calls
    files = [a for a in pytest_cmd if a.endswith(".py")]
    assert "tests/claims/test_evaluation.py" in files and "tests/claims/test_tables_spec.py" in files
    assert "tests/claims/test_allocator.py" in files      # the README's C30 cell (tools/readme.py)
    assert readme[-1].endswith("readme.py")
    assert files == sorted(set(files))
    assert marks(pytest_cmd) == "not slow and not deepspeed"
    assert "--snapshot-update" in pytest_cmd and sync == ["sync"] and figures[-1].endswith("specfigures.py")
    calls.clear()
    specsync.refresh(quick=False)
    assert marks(calls[0]) == "not deepspeed"
