"""zerospec.report.measure: the numbers in the report's tables are this run's measurements (where
they agree with the paper's closed forms: tests/claims/test_memory_report.py)."""
from __future__ import annotations

from fractions import Fraction

import pytest

from tests.support.report import N, column, m, tables  # noqa: F401 (fixtures)
from zerospec.report.measure import VARIANTS, ReportConfig, setup_model_states
from zerospec.report.writeup import TABLES



def test_every_variant_runs_and_every_table_is_built(m, tables):
    """Five runs (ZeRO-0, both ZeRO-1 variants, ZeRO-2, ZeRO-3), all eight tables, and the four
    ZeRO-R options."""
    assert [r.key for r in m.runs] == list(VARIANTS)
    assert list(tables) == list(TABLES)
    assert all(len(t.rows) == len(m.runs) for n, t in tables.items() if n not in ("scaled", "zero_r"))
    assert len(tables["zero_r"].rows) == len(m.zero_r) == 4


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


def test_setup_measurement_equals_the_training_runs_own_ledger(m):
    """The sweep's set-up-only measurement reads the same bytes a full training run reports."""
    for run in m.runs:
        stage, zero1, _ = VARIANTS[run.key]
        assert set(setup_model_states(stage, N, zero1_comm=zero1).values()) == {run.result.model_states(0)}


def test_bad_report_config_names_the_value():
    """An unknown stage name is an error naming it and the accepted ones."""
    with pytest.raises(ValueError, match=r"unknown stage '9'.*0, 1, 1ar, 2, 3"):
        ReportConfig(variants=("0", "9"))


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
