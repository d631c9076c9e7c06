"""The paper's Table 1, Table 2, Figure 1 and Table 1's bold cells from the closed forms of
zerospec.plan (spec/tables.md), checked against the printed values, directly and through
``zerospec plan``'s real entry point (its Markdown Table 1 pinned by a snapshot)."""
from __future__ import annotations

import csv
import io
import json
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction

import pytest

from tests.support.cli import run_cli
from zerospec.plan import closed_form as plan
from zerospec.paper import theory

GB = 10**9

# Table 1 as printed (claims.md C15/C16): rows N_d = 1, 4, 16, 64, 256, 1024; per model P_os,
# P_os+g, P_os+g+p.
TABLE1_PAPER = {
    7.5e9: (["120", "52.5", "35.6", "31.4", "30.4", "30.1"],
            ["120", "41.3", "21.6", "16.6", "15.4", "15.1"],
            ["120", "30", "7.5", "1.88", "0.47", "0.12"]),
    128e9: (["2048", "896", "608", "536", "518", "513"],
            ["2048", "704", "368", "284", "263", "257"],
            ["2048", "512", "128", "32", "8", "2"]),
    1e12: (["16000", "7000", "4750", "4187", "4046", "4011"],
           ["16000", "5500", "2875", "2218", "2054", "2013"],
           ["16000", "4000", "1000", "250", "62.5", "15.6"]),
}
# C15: bold cells, (model, stage) -> N_d
TABLE1_BOLD = {(7.5e9, 1): 64, (7.5e9, 2): 16, (7.5e9, 3): 4, (128e9, 3): 64, (1e12, 3): 1024}
# Table 2 as printed (C17): MP -> baseline, P_os, P_os+g, P_os+g+p
TABLE2_PAPER = {1: ("2B", "7.6B", "14.4B", "128B"), 2: ("4B", "15.2B", "28.8B", "256B"),
                4: ("8B", "30.4B", "57.6B", "0.5T"), 8: ("16B", "60.8B", "115.2B", "1T"),
                16: ("32B", "121.6B", "230.4B", "2T")}


def last_digit_unit(printed: str) -> Fraction:
    """One unit in the last printed digit: '41.3' -> 0.1, '2048' -> 1."""
    return Fraction(1, 10 ** len(printed.split(".")[1])) if "." in printed else Fraction(1)


def within_printed_precision(printed: str, exact) -> bool:
    return abs(Fraction(printed) - Fraction(exact)) < last_digit_unit(printed)


# -- Table 1 --------------------------------------------------------------------------------------
@pytest.mark.claim("C16", status="closed_form")
@pytest.mark.parametrize("psi", list(TABLE1_PAPER), ids=["7.5B", "128B", "1T"])
def test_table1_layout_matches_every_printed_cell_within_its_last_digit(psi):
    """Table 1: each cell of the plan's layout is within one unit of the paper's last printed digit."""
    t = plan.table1([psi], theory.TABLE1_ND)
    for r, row in enumerate(t.rows):
        for k in range(3):
            paper = TABLE1_PAPER[psi][k][r]
            assert within_printed_precision(paper, row[1 + k]), (row[0], k + 1, paper, row[1 + k])


@pytest.mark.claim("C16", status="closed_form")
def test_table1_prints_each_cell_within_one_unit_of_its_own_last_digit():
    """The plan's own rounding never moves a cell by a full printed digit (41.25 -> 41.3, not 41)."""
    t = plan.table1(list(TABLE1_PAPER), theory.TABLE1_ND)
    for row in t.rows:
        for i, exact in enumerate(row[1:], start=1):
            assert within_printed_precision(t.cell_text(i, exact), exact)


@pytest.mark.claim("C15", status="closed_form")
def test_table1_bold_marks_the_smallest_fitting_n_d_as_the_paper_does():
    """Bold cells: 7.5B P_os@64, P_os+g@16, P_os+g+p@4; 128B P_os+g+p@64; 1T P_os+g+p@1024."""
    psis = list(TABLE1_PAPER)
    t = plan.table1(psis, theory.TABLE1_ND)
    bold = {(psis[(c - 1) // 3], (c - 1) % 3 + 1): theory.TABLE1_ND[r] for r, c in t.bold}
    assert bold == TABLE1_BOLD


# -- Table 2 --------------------------------------------------------------------------------------
def _paper_count(text: str) -> tuple[Decimal, int]:
    return Decimal(text[:-1]), {"B": 10**9, "T": 10**12}[text[-1]]


@pytest.mark.claim("C17", status="closed_form")
@pytest.mark.parametrize("mp", list(TABLE2_PAPER))
def test_table2_printed_cells_are_the_mp1_maximum_rounded_to_a_tenth_times_mp(mp):
    """Table 2: B cells = MP × (MP=1 maximum rounded to 0.1B); T cells = the maximum rounded to 0.1T."""
    ours = plan.table2([mp]).rows[0]
    mp1 = plan.table2([1]).rows[0]
    assert ours[:2] == [mp, 64 * mp]
    for s in range(4):
        value, scale = _paper_count(TABLE2_PAPER[mp][s])
        if scale == 10**9:
            tenth = (Decimal(mp1[2 + s].numerator) / mp1[2 + s].denominator / scale).quantize(
                Decimal("0.1"), ROUND_HALF_UP)
            assert value == mp * tenth
        else:
            exact = Decimal(ours[2 + s].numerator) / ours[2 + s].denominator / scale
            assert value == exact.quantize(Decimal("0.1"), ROUND_HALF_UP)


@pytest.mark.claim("C13", status="closed_form")
def test_max_model_at_64_gpus_is_7_6b_14_4b_128b():
    """At N_d = 64 on 32 GB: P_os fits 7.6B, P_os+g 14.4B, P_os+g+p 128B (Table 2's 0.1B precision)."""
    t = plan.max_model_table(64, 32 * GB, names=("paper",))
    got = [Fraction(row[1], 10**9) for row in t.rows]
    assert got[0] == 2
    for printed, exact in zip(("7.6", "14.4", "128"), got[1:]):
        assert within_printed_precision(printed, exact)


# -- Figure 1 and the seed's scaled table -------------------------------------------------------------
@pytest.mark.claim("C14", status="closed_form")
def test_figure1_example_7_5b_on_64_gpus():
    """Ψ = 7.5B, N_d = 64: 120 GB, 31.4 GB, 16.6 GB, 1.88 GB per GPU; only DP misses 32 GB."""
    t = plan.plan_table(7_500_000_000, 64, 32 * GB, 50 * GB)
    assert [row[3] for row in t.rows] == [120 * GB, 31_406_250_000, 16_640_625_000, 1_875_000_000]
    assert [row[4] for row in t.rows] == [False, True, True, True]
    assert [t.cell_text(3, row[3]) for row in t.rows] == ["120 GB", "31.4 GB", "16.6 GB", "1.88 GB"]


@pytest.mark.claim("C21", status="closed_form")
@pytest.mark.claim("C24", status="closed_form")
def test_seed_scaled_table_at_32_gpus_with_the_exact_ring_factor():
    """The seed's 7.5B projection at N = 32: states 120/32.8/18.3/3.75 GB; comm 30/30/30/45 GB at
    large N, × (N−1)/N = 31/32 exactly here; 0.6/0.9 s at 50 GB/s likewise."""
    t = plan.plan_table(7_500_000_000, 32, 32 * GB, 50 * GB)
    seed = [("120", 30, "0.6"), ("32.8", 30, "0.6"), ("18.3", 30, "0.6"), ("3.75", 45, "0.9")]
    for row, (mem, comm_gb, secs) in zip(t.rows, seed):
        assert within_printed_precision(mem, Fraction(row[3], GB))
        assert row[6] == comm_gb * GB * Fraction(31, 32)
        assert row[7] == Fraction(secs) * Fraction(31, 32)
    assert [row[4] for row in t.rows] == [False, False, True, True]


# -- `zerospec plan` ------------------------------------------------------------------------------
@pytest.mark.claim("C15", status="closed_form")
@pytest.mark.claim("C16", status="closed_form")
def test_plan_table1_markdown_snapshot(capsys, md_snapshot):
    """`plan --table1` prints the paper's Table 1 layout with its bold cells (pinned)."""
    rc, out, err = run_cli(capsys, "plan", "--table1")
    assert rc == 0 and err == ""
    assert "| 64 | **31.4** | 16.6 | 1.88 | 536 | 284 | **32** |" in out
    assert out == md_snapshot


@pytest.mark.claim("C14", status="closed_form")
def test_plan_json_gives_exact_bytes_for_the_figure1_example(capsys):
    """`plan --params 7.5e9 --gpus 64 --format json`: 120e9, 31.40625e9, 16.640625e9, 1.875e9 bytes."""
    rc, out, _ = run_cli(capsys, "plan", "--params", "7.5e9", "--gpus", "64", "--format", "json")
    assert rc == 0
    tables = {t["name"]: t for t in json.loads(out)["tables"]}
    plan_t = tables["plan"]
    col = plan_t["columns"].index("Model states /GPU")
    assert [row[col] for row in plan_t["rows"]] == [120e9, 31.40625e9, 16.640625e9, 1.875e9]
    assert set(tables) == {"plan", "estimators"}


@pytest.mark.claim("C9", status="closed_form")
def test_plan_csv_one_stage_fits_and_its_time_at_the_bandwidth(capsys):
    """`plan --stage 3 --format csv`: ZeRO-3 at 1T on 1024 GPUs holds 15.625 GB (C12) and moves
    3Ψ(N−1)/N fp16 elements, 5.994 s at 1 TB/s."""
    rc, out, _ = run_cli(capsys, "plan", "--params", "1T", "--gpus", "1024", "--stage", "3",
                         "--bandwidth", "1TB/s", "--format", "csv")
    assert rc == 0
    block = out.split("\n\n")[0].splitlines()
    assert block[0].startswith("# plan:")
    rows = list(csv.DictReader(io.StringIO("\n".join(block[1:]))))
    assert len(rows) == 1
    assert float(rows[0]["Model states /GPU"]) == 15.625e9
    assert rows[0]["Fits 32 GB?"] == "True"
    assert float(rows[0]["Time @ 1000 GB/s"]) == pytest.approx(3 * 1e12 * 1023 / 1024 * 2 / 1e12)


@pytest.mark.claim("C17", status="closed_form")
def test_plan_table2_and_max_model(capsys):
    """`plan --table2 --max-model`: Table 2's rows per MP, and the largest model per stage."""
    rc, out, _ = run_cli(capsys, "plan", "--table2", "--max-model", "--format", "json")
    assert rc == 0
    tables = {t["name"]: t for t in json.loads(out)["tables"]}
    assert [row[:2] for row in tables["table2"]["rows"]] == [[1, 64], [2, 128], [4, 256], [8, 512],
                                                            [16, 1024]]
    paper_col = tables["max_model"]["columns"].index("paper")
    assert tables["max_model"]["rows"][3][paper_col] == 128 * 10**9
