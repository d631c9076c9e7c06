"""``zerospec paper`` through the real entry point: a table, a figure drawn, and bad input."""
from __future__ import annotations

import json
import pathlib

import pytest

from tests.support.cli import assert_usage_error, run_cli

FIGURE8_SNAPSHOT = (pathlib.Path(__file__).resolve().parents[2] / "claims" / "__snapshots__" / "test_evaluation"
                    / "test_figure8_table.md")


def test_paper_table3_prints_each_configuration_beside_the_papers_cells(capsys):
    """`paper --table 3`: one row per configuration C1–C5, as run here and as the paper prints it."""
    rc, out, err = run_cli(capsys, "paper", "--table", "3")
    assert rc == 0 and err == ""
    assert "| C5 | P_os+g | C_B + M_D + P_a+cpu | P_os+g | C_B + M_D + P_a+cpu |" in out
    assert sum(line.startswith("| C") for line in out.splitlines()) == 5


def test_paper_table3_as_json_keeps_the_columns_and_writes_no_figure(capsys, tmp_path):
    """`paper --table 3 --format json`: the one table with its five rows; a table draws nothing."""
    rc, out, _ = run_cli(capsys, "paper", "--table", "3", "--format", "json", "--out",
                         str(tmp_path / "figs"))
    doc = json.loads(out)
    assert rc == 0 and doc["meta"] == {"table": 3}
    assert [t["name"] for t in doc["tables"]] == ["table3"]
    assert [r[0] for r in doc["tables"][0]["rows"]] == ["C1", "C2", "C3", "C4", "C5"]
    assert not (tmp_path / "figs").exists()


@pytest.mark.slow   # five 75-layer meta steps with FLOPs: ~10 s
def test_paper_figure8_prints_its_table_with_the_papers_claim_and_draws_the_figure(capsys,
                                                                                 tmp_path):
    """`paper --figure 8 --out DIR`: the Figure 8 table (saying which configuration fits), the
    paper's statement under it, and paper_figure8.png/.svg written into DIR."""
    rc, out, err = run_cli(capsys, "paper", "--figure", "8", "--out", str(tmp_path))
    assert rc == 0
    # the CLI prints the table the claim test pins (tests/claims/test_evaluation.py), row for row
    for row in FIGURE8_SNAPSHOT.read_text().splitlines():
        assert row in out
    assert "| C3 | 32 | 58,386,197,376 | no |" in out      # C3 does not fit 32 GB, and says so
    assert "paper: throughput follows the batch" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["paper_figure8.png", "paper_figure8.svg"]
    assert "paper_figure8.png" in err


@pytest.mark.slow   # ten meta steps of 50 and 125 layers with storage traces: ~25 s
def test_paper_figure7_prints_the_allocator_models_cached_memory(capsys):
    """`paper --figure 7 --no-figures`: Figure 7's table (zerospec/evaluation/tables.py), both
    models, all five configurations, and the paper's claims under it; nothing written."""
    rc, out, err = run_cli(capsys, "paper", "--figure", "7", "--no-figures")
    assert rc == 0 and err == ""
    assert sum(line.startswith(("| 40B | C", "| 100B | C")) for line in out.splitlines()) == 10
    assert "paper: C1 → C2 drops" in out


@pytest.mark.parametrize("argv,named", [
    (("--figure", "5"), "--figure must be one of 2, 3, 4, 6, 7, 8 (the ones reproduced), got '5'"),
    (("--figure", "two"), "--figure must be one of 2, 3, 4, 6, 7, 8"),
    (("--table", "4"), "--table must be one of 3 (the ones reproduced), got '4'"),
    ((), "one of the arguments --figure --table is required"),
    (("--figure", "2", "--table", "3"), "not allowed with argument"),
], ids=["figure-not-reproduced", "figure-not-a-number", "table-not-reproduced", "neither",
        "both"])
def test_paper_bad_input_is_one_line_and_exit_2(capsys, argv, named):
    """A figure or table not reproduced, neither or both: one line naming it, exit 2."""
    assert_usage_error(capsys, "paper", *argv, named=named)


def test_paper_an_out_that_cannot_be_a_directory_fails_before_measuring(capsys, tmp_path):
    """`--out` under a file: refused at once, naming the path (no minute of meta steps first)."""
    (tmp_path / "file").write_text("")
    assert_usage_error(capsys, "paper", "--figure", "6", "--out", str(tmp_path / "file" / "figs"),
                       named="cannot create that directory")
