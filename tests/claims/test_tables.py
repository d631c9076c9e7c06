"""The paper's closed-form numbers — Figure 1, Table 1, Table 2 and the text — from theory.py.

These check the formulas against the paper's printed values. The same formulas are checked
against measured bytes in test_memory.py (toy scale) and test_scale.py (paper scale, on meta).
Printed values are literals here, on the expected side, each with its claim id.
"""
from __future__ import annotations

import pathlib
import re
from decimal import Decimal
from fractions import Fraction

import pytest

from zerospec.paper import theory
from zerospec.paper.theory import GB, TABLE1_ND, V100_BYTES

# Table 1 as printed (C15/C16): N_d -> model -> (P_os, P_os+g, P_os+g+p), GB
TABLE1 = {
    1: {"7.5B": ("120", "120", "120"), "128B": ("2048", "2048", "2048"), "1T": ("16000", "16000", "16000")},
    4: {"7.5B": ("52.5", "41.3", "30"), "128B": ("896", "704", "512"), "1T": ("7000", "5500", "4000")},
    16: {"7.5B": ("35.6", "21.6", "7.5"), "128B": ("608", "368", "128"), "1T": ("4750", "2875", "1000")},
    64: {"7.5B": ("31.4", "16.6", "1.88"), "128B": ("536", "284", "32"), "1T": ("4187", "2218", "250")},
    256: {"7.5B": ("30.4", "15.4", "0.47"), "128B": ("518", "263", "8"), "1T": ("4046", "2054", "62.5")},
    1024: {"7.5B": ("30.1", "15.1", "0.12"), "128B": ("513", "257", "2"), "1T": ("4011", "2013", "15.6")},
}
# C15: bold = the smallest N_d at which each stage fits 32 GB
BOLD = {"7.5B": {1: 64, 2: 16, 3: 4}, "128B": {1: None, 2: None, 3: 64}, "1T": {1: None, 2: None, 3: 1024}}
# Table 2 as printed (C17): MP -> (baseline, P_os, P_os+g, P_os+g+p)
TABLE2 = {1: ("2B", "7.6B", "14.4B", "128B"), 2: ("4B", "15.2B", "28.8B", "256B"),
          4: ("8B", "30.4B", "57.6B", "0.5T"), 8: ("16B", "60.8B", "115.2B", "1T"),
          16: ("32B", "121.6B", "230.4B", "2T")}
TABLE2_MEASURED_POS = {1: 6.2, 2: 12.5, 4: 25, 8: 50, 16: 100}   # C18, measured P_os (B)


def within_last_digit(printed: str, exact: Fraction) -> bool:
    """C16: |printed − exact| < 1 unit in the printed value's last digit (the paper rounds
    half-up in some cells and truncates in others, so Python's round() is not the test)."""
    d = Decimal(printed)
    unit = Decimal(1).scaleb(d.as_tuple().exponent)
    return abs(Fraction(d) - exact) < Fraction(unit)


@pytest.mark.claim("C14", status="closed_form")
def test_figure1_7_5b_on_64_gpus(claim_values):
    """Ψ = 7.5B, N_d = 64: 120 GB → 31.4 → 16.6 → 1.9 GB per device (C14)."""
    gb = [theory.model_state_bytes(s, Fraction(75, 10) * GB, 64) / GB for s in range(4)]
    claim_values(" / ".join(f"{float(x):.4g}" for x in gb) + " GB", "120 / 31.4 / 16.6 / 1.9 GB (C14)")
    assert gb == [120, Fraction(3140625, 100000), Fraction(16640625, 1000000), Fraction(1875, 1000)]
    assert [within_last_digit(p, x) for p, x in zip(["120", "31.4", "16.6", "1.9"], gb)] == [True] * 4


@pytest.mark.parametrize("n_d", TABLE1_ND)
@pytest.mark.parametrize("model", list(theory.TABLE1_PSI))
@pytest.mark.claim("C16", status="closed_form")
def test_table1_every_cell_at_its_printed_precision(model, n_d):
    """Table 1: per-device GB of P_os, P_os+g, P_os+g+p, each within its last printed digit (C16)."""
    cells = theory.table1(Fraction(theory.TABLE1_PSI[model]), n_d)
    for stage, printed in zip((1, 2, 3), TABLE1[n_d][model]):
        assert within_last_digit(printed, cells[stage]), (model, n_d, stage, printed, float(cells[stage]))


@pytest.mark.parametrize("model", list(theory.TABLE1_PSI))
@pytest.mark.claim("C15", status="closed_form")
def test_table1_bold_cells_are_the_smallest_n_d_that_fits_32gb(model):
    """Bold marks where each stage first fits a 32 GB V100, inclusive: 128B at 64 is exactly 32 (C15)."""
    assert theory.table1_bold(Fraction(theory.TABLE1_PSI[model])) == BOLD[model]


def _parse_size(s: str) -> Fraction:
    return Fraction(Decimal(s[:-1])) * (10**12 if s.endswith("T") else 10**9)


@pytest.mark.parametrize("n_m", theory.TABLE2_MP)
@pytest.mark.claim("C17", status="closed_form")
def test_table2_theoretical_max_model_size(n_m):
    """Table 2 = 32 GB per GPU, N_d = 64 in every row, model states / MP; printed = MP-1 value
    rounded to 0.1B, times MP; T cells within 0.05T (C17)."""
    row = theory.table2_row(n_m)
    for stage, printed in enumerate(TABLE2[n_m]):
        exact = row[stage]
        if printed.endswith("T"):
            assert abs(_parse_size(printed) - exact) <= Fraction(5, 100) * 10**12
        else:
            mp1_tenths = round(theory.table2_row(1)[stage] / 10**8)   # MP-1 value in 0.1B
            assert _parse_size(printed) == mp1_tenths * 10**8 * n_m


@pytest.mark.claim("C18", status="closed_form")
def test_table2_measured_p_os_is_about_82_percent_of_theory():
    """The caption says measured P_os "matches" theory; it is 6.2/7.6 ≈ 0.82 in every row (C18)."""
    ratios = {m: TABLE2_MEASURED_POS[m] * 10**9 / float(theory.table2_row(m)[1]) for m in theory.TABLE2_MP}
    assert all(0.80 < r < 0.83 for r in ratios.values()), ratios


@pytest.mark.claim("C13", status="closed_form")
def test_max_model_size_per_stage_at_64_gpus(claim_values):
    """At N_d = 64 on 32 GB: P_os ≈ 7.6B (text: 7.5B), P_os+g ≈ 14.4B (text: 14B), P_os+g+p 128B (C13, C56)."""
    sizes = [theory.max_params(s, V100_BYTES, 64) / 10**9 for s in (1, 2, 3)]
    claim_values(" / ".join(f"{float(x):.2f}B" for x in sizes), "7.5 (7.6) / 14 (14.4) / 128B (C13)")
    assert [int(x * 10) / 10 for x in sizes] == [7.6, 14.4, 128]
    assert sizes[0] >= Fraction(75, 10) and sizes[1] >= 14        # the text's rounder values fit
    assert theory.max_params(3, 16 * GB, 1024) >= 10**12          # and 1T on 1024 GPUs


@pytest.mark.parametrize("stage,limit", [(1, 4), (2, 8)])
@pytest.mark.claim("C13", status="closed_form")
def test_reduction_factors_approach_4x_8x_and_grow_with_n_d_for_stage3(stage, limit):
    """P_os and P_os+g cut memory by up to 4× and 8×; P_os+g+p by N_d (C7, C8, C9, C13)."""
    factors = [theory.reduction_factor(stage, n) for n in (1, 4, 64, 1024, 10**9)]
    assert factors == sorted(factors) and factors[0] == 1 and factors[-1] < limit
    assert limit - factors[-1] < Fraction(1, 10**6)
    assert theory.reduction_factor(3, 64) == 64


@pytest.mark.claim("C3", status="closed_form")
def test_gpt2_1_5b_needs_24gb_of_model_states_for_3gb_of_weights():
    """GPT-2 1.5B: 3 GB of fp16 weights, at least 24 GB of model states (C3)."""
    psi = Fraction(15, 10) * 10**9
    assert theory.FP16 * psi == 3 * GB and theory.model_state_bytes(0, psi, 1) == 24 * GB


@pytest.mark.claim("C12", status="closed_form")
def test_one_trillion_parameters_need_16tb_or_15_6gb_on_1024_gpus():
    """1T with Adam in 16-bit: 16 TB of model states; over 1024 GPUs 15.625 GB each (C12, C56)."""
    assert theory.model_state_bytes(0, 10**12, 1) == 16 * 10**12
    assert theory.model_state_bytes(3, 10**12, 1024) == Fraction(15625, 1000) * GB


@pytest.mark.claim("C11", status="closed_form")
def test_zero_with_model_parallelism_reduces_memory_by_n_d_times_n_m():
    """Stage 3 with MP: the per-device reduction over DP is N_d × N_m (C11)."""
    assert theory.max_params(3, GB, 64, n_m=16) / theory.max_params(0, GB, 1) == 64 * 16


@pytest.mark.claim("C26", status="closed_form")
def test_mp_moves_more_than_zero_dp_beyond_a_few_dozen_sequences():
    """MP/ZeRO-DP volume = b·s/(3·hd): > 1 past a few dozen sequences, > 10 at batch 512 (C26)."""
    seq, hd = 1024, 5000
    assert theory.mp_over_zero_comm(14, seq, hd) < 1 < theory.mp_over_zero_comm(15, seq, hd)
    assert theory.mp_over_zero_comm(512, seq, hd) > 10


@pytest.mark.claim("C27", status="closed_form")
def test_gpt2_activation_estimate_is_about_60gb():
    """12·hd·b·s·L fp16 elements for GPT-2 1.5B, seq 1K, batch 32 ≈ 60 GB (C27 footnote)."""
    b = theory.FP16 * theory.activation_elements(hd=1600, batch=32, seq=1024, layers=48)
    assert round(b / GB, 1) == 60.4


@pytest.mark.claim("C29", status="closed_form")
@pytest.mark.claim("C36", status="closed_form")
def test_fused_fp32_buffers_grow_with_the_model():
    """A 32-bit flat buffer over all gradients: 6 GB at 1.5B (C29), 12 GB at 3B (C36)."""
    assert theory.fused_buffer_bytes(15 * 10**8) == 6 * GB
    assert theory.fused_buffer_bytes(3 * 10**9) == 12 * GB


@pytest.mark.claim("C50", status="closed_form")
@pytest.mark.parametrize("layers,hd,size", [(48, 1600, 1.5), (72, 3072, 8), (98, 4096, 20),
                                            (88, 6144, 40), (132, 6144, 60), (212, 8192, 170)])
def test_table4_shapes_give_their_model_sizes(layers, hd, size):
    """Table 4 (SC version): 12·L·hd² matches each model's nominal size within 10% (C50)."""
    assert abs(theory.transformer_params(layers, hd) / (size * 1e9) - 1) < 0.10


# -- the stage table (theory.STAGES): every label, formula text and claim id derives from it ------
def _evaluate(formula: str, psi: Fraction, n_d: int) -> Fraction:
    """A formula as the paper writes it ("4Ψ+12Ψ/N") at Ψ = psi, N = n_d: a sum of aΨ and aΨ/N terms."""
    terms = [re.fullmatch(r"(\d+)Ψ(/N)?", t) for t in formula.split("+")]
    assert all(terms), f"not a sum of aΨ and aΨ/N terms: {formula!r}"
    return sum(int(t[1]) * psi / (n_d if t[2] else 1) for t in terms)


@pytest.mark.parametrize("stage", theory.STAGES, ids=lambda s: s.label)
def test_each_stages_formula_text_is_its_closed_form(stage):
    """The formula the tables print (16Ψ, 4Ψ+12Ψ/N, 2Ψ+14Ψ/N, 16Ψ/N) equals model_state_bytes."""
    psi = Fraction(7_500_000_000)
    for n_d in (1, 3, 64, 1024):
        assert _evaluate(stage.formula, psi, n_d) == theory.model_state_bytes(stage.index, psi, n_d)


CLAIMS_MD = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "claims.md").read_text()


@pytest.mark.parametrize("stage", theory.STAGES, ids=lambda s: s.label)
def test_each_stages_claim_ids_are_the_claims_that_name_it(stage):
    """Its memory (C6–C9) and comm (C21–C24) claim ids head docs/claims.md entries naming its label."""
    for cid in (stage.memory_claim, stage.comm_claim):
        heading = re.search(rf"\*\*{cid}\. (.*?)\*\*", CLAIMS_MD)[1]        # "P_os (stage 1):"
        assert stage.label in [w.strip(":.,()") for w in heading.split()], (cid, heading)


def test_the_stage_classes_and_the_reports_rows_carry_the_tables_labels():
    """zero's stage classes, the report's variants and plan's rows all read their names from STAGES."""
    from zerospec.report import measure
    from zerospec.plan import closed_form as plan
    from zerospec.zero import STAGES
    labels = [s.label for s in theory.STAGES]
    assert [STAGES[i].label for i in range(4)] == labels
    assert [measure.VARIANTS[k][2] for k in ("0", "1", "2", "3")] == [s.name for s in theory.STAGES]
    assert measure.VARIANTS["1ar"][2] == "ZeRO-1 (P_os, all-reduce)"
    assert [row[0] for row in plan.plan_table(10**9, 8, 32 * GB, 50 * GB).rows] == [
        "ZeRO-0 (DP)", "ZeRO-1 (P_os)", "ZeRO-2 (P_os+g)", "ZeRO-3 (P_os+g+p)"]


@pytest.mark.parametrize("bad", [4, -1, "1", None])
def test_an_unknown_stage_is_refused_by_name(bad):
    """theory.stage(4): ValueError naming the value and the accepted 0, 1, 2, 3."""
    with pytest.raises(ValueError, match=rf"stage must be one of 0, 1, 2, 3, got {re.escape(repr(bad))}"):
        theory.stage(bad)
