"""zerospec.report.measure: the numbers in the report's tables are this run's measurements, and they agree
with the paper's closed forms (theory.py) where the paper makes a claim."""
from __future__ import annotations

from fractions import Fraction

import pytest

from zerospec.paper import theory
from zerospec.report.measure import VARIANTS, ReportConfig, measure, setup_model_states
from zerospec.report.tables import TABLES, build_tables

N = 4


@pytest.fixture(scope="module")
def m():
    # One small measurement serves the module: every variant, 4 ranks, 1 step (~4 s CPU). One step
    # is enough for every claim here: the step's update is what the master-weight comparison sees.
    return measure(ReportConfig(ranks=N, steps=1), quiet=True)


@pytest.fixture(scope="module")
def tables(m):
    return {t.name: t for t in build_tables(m)}


def stage_claims(claim):
    """Mark a test with ``claim(stage)`` of every stage in theory's stage table (C6–C9, C21–C24)."""
    def mark(test):
        for s in theory.STAGES:
            test = pytest.mark.claim(claim(s))(test)
        return test
    return mark


def column(table, name):
    i = table.columns.index(name)
    return [row[i] for row in table.rows]


def test_every_variant_runs_and_every_table_is_built(m, tables):
    """Five runs (ZeRO-0, both ZeRO-1 variants, ZeRO-2, ZeRO-3), all eight tables, and the four
    ZeRO-R options."""
    assert [r.key for r in m.runs] == list(VARIANTS)
    assert list(tables) == list(TABLES)
    assert all(len(t.rows) == len(m.runs) for n, t in tables.items() if n not in ("scaled", "zero_r"))
    assert len(tables["zero_r"].rows) == len(m.zero_r) == 4


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


def test_activations_are_the_same_in_every_stage_and_only_zero3_gathers(tables):
    """ZeRO-DP partitions model states, not activations; only ZeRO-3 holds gathered parameters."""
    t = tables["activations"]
    acts = column(t, "Activations (peak)")
    assert len(set(acts)) == 1 and acts[0] > 0
    assert column(t, "Gathered params (peak)")[:4] == [0, 0, 0, 0]
    assert column(t, "Gathered params (peak)")[4] > 0
    # the proportion is exact underneath (a Fraction) and shown to 3 significant digits at most
    i = t.columns.index("Activations / model states")
    for row in t.rows:
        text = t.cell_text(i, row[i])
        assert row[i] == Fraction(row[2], row[1]), text
        assert sum(c.isdigit() for c in text.lstrip("0.")) <= 3, text


def test_wallclock_replay_is_never_slower_than_the_serial_run(m, tables):
    """N parallel clocks finish no later than the ranks taking turns; collectives are paired 1:1."""
    t = tables["wallclock"]
    for serial, parallel in zip(column(t, "Serial step (measured)"), column(t, "Parallel step (replayed)")):
        assert 0 < parallel <= serial
    for run in m.runs:
        assert run.replay.n_collectives == run.result.comm.count(0, step=m.config.steps)


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


def test_setup_measurement_equals_the_training_runs_own_ledger(m):
    """The sweep's set-up-only measurement reads the same bytes a full training run reports."""
    for run in m.runs:
        stage, zero1, _ = VARIANTS[run.key]
        assert set(setup_model_states(stage, N, zero1_comm=zero1).values()) == {run.result.model_states(0)}


def test_bad_report_config_names_the_value():
    """An unknown stage name is an error naming it and the accepted ones."""
    with pytest.raises(ValueError, match=r"unknown stage '9'.*0, 1, 1ar, 2, 3"):
        ReportConfig(variants=("0", "9"))


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


def test_the_timeline_draws_each_replayed_segment_once_where_it_happened(m, tmp_path, monkeypatch):
    """Every compute and collective segment of each run's replayed step is one bar on its rank's
    row, spanning its time; waits are gaps."""
    import matplotlib.pyplot as plt

    from zerospec.report import figures

    drawn = []
    monkeypatch.setattr(figures, "save_figure", lambda fig, out, name: drawn.append(fig) or [])
    figures.timeline(m, tmp_path)
    try:
        for ax, run in zip(drawn[0].axes, m.runs, strict=True):
            # in the figure's units (ms), computed as it computes them: equal bit for bit
            bars = sorted((round(p.vertices[:, 1].mean()), p.vertices[:, 0].min(),
                           p.vertices[:, 0].max())
                          for c in ax.collections for p in c.get_paths())
            segs = sorted((s.rank, s.start * 1e3, (s.start + s.seconds) * 1e3)
                          for s in run.replay.segments if s.kind != "wait" and s.seconds > 0)
            assert len(segs) > 2 * N and bars == segs
    finally:
        plt.close(drawn[0])
