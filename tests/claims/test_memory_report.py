"""``zerospec report``'s tables are this run's measurements, and they are the paper's closed forms
where the paper makes a claim: model states per stage (C6–C9, memory.md, the report's first
table), and with them its traffic (C21–C24), equivalence (P1), FLOPs (P2) and ZeRO-R rows (C32,
C35); through the real entry point, the pinned Markdown tables and the CSV."""
from __future__ import annotations

import csv
import io
from fractions import Fraction

import pytest

from tests.support.cli import run_cli
from tests.support.report import N, SMALL_RUN, column, m, measured_calls, tables  # noqa: F401 (fixtures)
from zerospec.paper import theory
from zerospec.report.measure import VARIANTS
from tools import specfigures



def stage_claims(claim):
    """Mark a test with ``claim(stage)`` of every stage in theory's stage table (C6–C9, C21–C24)."""
    def mark(test):
        for s in theory.STAGES:
            test = pytest.mark.claim(claim(s))(test)
        return test
    return mark


@stage_claims(lambda s: s.memory_claim)
def test_memory_table_measured_bytes_equal_the_stage_formulas(m, tables):
    """Measured per-GPU model states = 16Ψ, 4Ψ+12Ψ/N, 2Ψ+14Ψ/N, 16Ψ/N exactly (ratio 1)."""
    t = tables["memory"]
    psi = m.runs[0].result.psi
    expected = [theory.model_state_bytes(VARIANTS[k][0], psi, N) for k in VARIANTS]
    assert column(t, "Measured /GPU (B)") == expected
    assert column(t, "Measured /GPU (B)") == [r.result.memory[0].model_states() for r in m.runs]
    assert column(t, "Ratio") == [1] * 5


@stage_claims(lambda s: s.comm_claim)
def test_comm_table_is_2_2_3_2_3_psi_times_the_ring_factor(m, tables):
    """Per GPU per step: 2Ψ(N−1)/N for DP, ZeRO-1, ZeRO-2; 3Ψ(N−1)/N for all-reduce ZeRO-1, ZeRO-3."""
    t = tables["comm"]
    ring = Fraction(N - 1, N)
    assert column(t, "Measured") == [2 * ring, 2 * ring, 3 * ring, 2 * ring, 3 * ring]
    assert column(t, "Measured") == column(t, "Paper")
    # ...and the measured side is read from this run's comm ledger, not from theory
    assert column(t, "Measured") == [r.result.comm.mean_elements(step=1) / r.result.psi for r in m.runs]
    # ZeRO-3's extra Ψ is the second all-gather (C57): two gathers, one reduce-scatter.
    zero3 = t.rows[-1]
    assert zero3[3] == 2 * zero3[2] and zero3[1] == 0


@pytest.mark.claim("P1")
def test_equivalence_every_stage_is_bit_identical_to_dp(tables):
    """Same seed and data: every stage's losses and final weights equal ZeRO-0's bit for bit."""
    t = tables["equivalence"]
    assert column(t, "Bit-identical") == [None, True, True, True, True]
    assert column(t, "Max |Δmaster| vs ZeRO-0")[1:] == [0.0] * 4


@pytest.mark.claim("P2")
def test_flops_are_the_models_matmuls_in_every_stage_and_only_the_optimizer_shrinks(m, tables):
    """Forward = the GPT's matmul count in every stage, backward = 2× forward; Adam touches Ψ/N."""
    t = tables["flops"]
    g = m.config.model
    fwd = theory.gpt_forward_flops(g.n_layer, g.n_embd, g.vocab_size, m.config.micro_batch, g.block_size)
    assert column(t, "Forward FLOPs") == [fwd] * 5
    assert column(t, "Backward FLOPs") == [2 * fwd] * 5
    psi = m.runs[0].result.psi
    assert column(t, "Optimizer elements") == [psi] + [psi // N] * 4


@pytest.mark.claim("C14", status="closed_form")
def test_scaled_table_is_the_7_5b_projection_at_the_runs_n(tables):
    """The scaled table: Ψ = 7.5B at N = 4 from the closed forms, DP and ZeRO-1 do not fit 32 GB."""
    t = tables["scaled"]
    assert column(t, "Model states /GPU") == [theory.model_state_bytes(s, 7_500_000_000, N) for s in range(4)]
    assert column(t, "Fits 32 GB?") == [False, False, False, True]


@pytest.mark.claim("C9")
def test_memory_sweep_matches_the_formulas_until_padding_shows(m):
    """Set-up memory vs N: exactly the formula while N divides every unit (N ≤ 128 here); at N = 256
    the per-unit padding is real memory, so the measurement exceeds 16Ψ/N."""
    psi = m.runs[0].result.psi
    for s, points in m.sweep.items():
        for n, measured in points.items():
            if n <= 128:
                assert measured == theory.model_state_bytes(s, psi, n), (s, n)
            elif s > 0:
                assert measured > theory.model_state_bytes(s, psi, n), (s, n)


@pytest.mark.claim("C32")
@pytest.mark.claim("C35")
def test_the_zero_r_table_reads_each_option_off_its_own_ledgers(tables, m):
    """Checkpointing holds one b·s·d input per block; P_a half of it per rank (N_m = 2); P_a+cpu
    none on the GPU, the same on the host and twice that over the host link."""
    t = tables["zero_r"]
    assert column(t, "Option") == ["no checkpointing", "a checkpoint per block", "P_a (N_m = 2)",
                                   "P_a+cpu (N_m = 2)"]
    g, mb = m.config.model, m.config.micro_batch
    whole = g.n_layer * mb * g.block_size * g.n_embd * 2            # fp16 on meta
    assert column(t, "Checkpoints on GPU") == [0, whole, whole // 2, 0]
    assert column(t, "Checkpoints on host") == [0, 0, 0, whole // 2]
    assert column(t, "Host link") == [0, 0, 0, whole]
    assert column(t, "MP elements")[:2] == [0, 0] and column(t, "MP elements")[2] > 0


# -- `zerospec report` ----------------------------------------------------------------------------
@pytest.mark.claim("C6")
@pytest.mark.claim("C21")
def test_small_report_markdown_snapshot(capsys, md_snapshot):
    """A 2-GPU report's exact-integer tables (bytes, elements, collectives, FLOPs) are pinned."""
    rc, out, _ = run_cli(capsys, *SMALL_RUN, "--tables", "memory,comm,flops", "--no-figures", "--quiet")
    assert rc == 0
    assert "| ZeRO-3 (P_os+g+p) | + parameters | 4,288,512 |" in out      # 16Ψ/2 bytes (C9)
    assert out == md_snapshot


@pytest.mark.claim("C23")
def test_report_csv_without_stage0_has_no_equivalence_reference(capsys, monkeypatch):
    """`--stages 1ar,3 --format csv`: the all-reduce ZeRO-1 moves 3Ψ(N−1)/N = 1.5Ψ at N = 2, as
    ZeRO-3 does; with no ZeRO-0 the equivalence columns are empty; --quiet writes nothing to stderr."""
    seen = measured_calls(monkeypatch)
    rc, out, err = run_cli(capsys, *SMALL_RUN, "--stages", "1ar,3", "--tables", "equivalence,comm",
                           "--format", "csv", "--no-figures", "--quiet")
    assert rc == 0 and err == ""
    assert [(k["c30"], m.c30) for k, m in seen] == [(False, {})]   # no figure: no C30 traces
    blocks = {b.splitlines()[0].split(":")[0]: b.splitlines()[1:] for b in out.strip().split("\n\n")}
    assert list(blocks) == ["# equivalence", "# comm"]
    comm = list(csv.DictReader(io.StringIO("\n".join(blocks["# comm"]))))
    assert [float(r["Measured"]) for r in comm] == [1.5, 1.5]
    eq = list(csv.DictReader(io.StringIO("\n".join(blocks["# equivalence"]))))
    assert [r["Max |Δmaster| vs ZeRO-0"] for r in eq] == ["", ""]


@pytest.mark.slow   # `zerospec report` at its defaults: 5 variants × 3 steps on 32 ranks, ~40 s
def test_report_figures_data_at_32_gpus(md_snapshot):
    """The data of spec/'s report figures (memory per stage, memory vs N, communication per stage:
    tools/specfigures.py draws them only from these), from `zerospec report` at its defaults:
    bytes per buffer, elements per collective and the N sweep, integers the same on every machine."""
    assert md_snapshot == specfigures.report_figures_data(specfigures.report())
