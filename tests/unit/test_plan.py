"""zerospec.plan.closed_form and zerospec.paper.estimators: the paper's tables, its Figure 1 example and the other tools'
accountings, checked against printed values (the paper's, DeepSpeed's docs, Megatron's table)."""
from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction

import pytest

from zerospec.plan import closed_form as plan
from zerospec.paper import theory
from zerospec.paper.estimators import estimators

GB, GIB = 10**9, 2**30

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


# -- estimators ----------------------------------------------------------------------------------
def test_deepspeed_zero3_matches_its_documented_printout():
    """DeepSpeed docs (memory.rst, 2851M params, 32M largest layer, 8 GPUs): 6.09 / 0.78 / 0.12 GiB."""
    from zerospec.paper.estimators import deepspeed_bytes
    psi, layer = 2851 * 10**6, 32 * 10**6
    printed = {(False, False): "6.09", (True, False): "0.78", (True, True): "0.12"}
    for (opt, params), gib in printed.items():
        got = Fraction(deepspeed_bytes(3, psi, 8, layer, opt, params), GIB)
        assert abs(got - Fraction(gib)) <= Fraction(5, 1000), (opt, params, float(got))


def test_deepspeed_zero2_is_2psi_plus_18psi_over_n_and_2psi_offloaded():
    """ZeRO-2 at 2851M params on 8 GPUs: 5.31 GiB offloaded (docs); 2Ψ + 18Ψ/8 = 12,116,750,000 B."""
    est = estimators()["deepspeed"]
    assert est.model_state_bytes(2, 2851 * 10**6, 8) == 12_116_750_000
    from zerospec.paper.estimators import deepspeed_bytes
    assert abs(Fraction(deepspeed_bytes(2, 2851 * 10**6, 8, offload_optimizer=True), GIB)
               - Fraction("5.31")) <= Fraction(5, 1000)
    assert est.model_state_bytes(0, 10**9, 8) is None     # DeepSpeed has no stage-0 estimator


def test_megatron_distributed_optimizer_table():
    """Megatron's bytes per parameter: fp16 20 replicated, 4 + 16/d distributed (d = 4: 8 B)."""
    est = estimators()["megatron"]
    assert est.model_state_bytes(0, 10**9, 4) == 20 * 10**9
    assert est.model_state_bytes(1, 10**9, 4) == 8 * 10**9
    assert est.model_state_bytes(2, 10**9, 4) is None
    bf16 = estimators(megatron_dtype="bf16")["megatron"]
    assert bf16.model_state_bytes(1, 10**9, 4) == 9 * 10**9          # 6 + 12/4


def test_estimators_disagree_by_the_buffers_they_count():
    """At the same Ψ and N, DeepSpeed's ZeRO-2 exceeds the paper's by its fp32 gradient shard, 4Ψ/N."""
    e = estimators()
    psi, n = 10**9, 8
    extra = e["deepspeed"].model_state_bytes(2, psi, n) - e["paper"].model_state_bytes(2, psi, n)
    assert extra == 4 * psi // n


def test_max_params_is_the_largest_psi_that_still_fits():
    """One more parameter would not fit: checked for every estimator with a formula."""
    for est in estimators(largest_layer=10**6).values():
        for s in range(4):
            psi = est.max_params(s, 32 * GB, 64)
            if psi is None:
                continue
            assert est.model_state_bytes(s, psi, 64) <= 32 * GB < est.model_state_bytes(s, psi + 1, 64)


# -- parsing -------------------------------------------------------------------------------------
@pytest.mark.parametrize("text,value", [("7.5e9", 7_500_000_000), ("7.5B", 7_500_000_000),
                                        ("175M", 175_000_000), ("1T", 10**12), ("128b", 128 * 10**9)])
def test_parameter_counts_take_decimal_suffixes(text, value):
    """7.5e9, 7.5B, 175M, 1T are parameter counts."""
    assert plan.parse_count(text) == value


@pytest.mark.parametrize("text,value", [("32GB", 32 * GB), ("80GiB", 80 * GIB), ("512 MB", 512 * 10**6)])
def test_memory_sizes_are_decimal_unless_binary_is_named(text, value):
    """GB is 10^9 bytes, as the paper uses; GiB is 2^30."""
    assert plan.parse_bytes(text) == value


@pytest.mark.parametrize("text,value", [("50GB/s", 50 * GB), ("25GiB/s", 25 * GIB),
                                        ("400Gbps", 50 * GB), ("100Gbit/s", 12_500_000_000)])
def test_bandwidths_in_bytes_or_bits_per_second(text, value):
    """50GB/s and 400Gbps are the same link."""
    assert plan.parse_bandwidth(text) == value


@pytest.mark.parametrize("parse,text,match", [
    (plan.parse_count, "-5", "must be >= 1, got '-5'"),
    (plan.parse_count, "7.5X", "cannot read parameter count '7.5X'.*7.5B"),
    (plan.parse_count, "0", "must be >= 1"),
    (plan.parse_bytes, "32", "cannot read memory size '32'.*GB"),
    (plan.parse_bytes, "0GB", "must be > 0"),
    (plan.parse_bandwidth, "50GB", "cannot read bandwidth '50GB'"),
    (plan.parse_gpus, "0", "must be >= 1, got '0'"),
    (plan.parse_stage, "4", "accepted: 0, 1, 2, 3"),
])
def test_bad_values_are_named_with_what_is_accepted(parse, text, match):
    """Errors name the bad value and the accepted forms."""
    with pytest.raises(ValueError, match=match):
        parse(text)
