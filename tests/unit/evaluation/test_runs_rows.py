"""zerospec/evaluation/runs.py: each evaluation row is measured at its own shape, grid, batch and
ZeRO configuration — checked on what the runs code hands to ``measure``, without running a step.

``measure`` is replaced by a recorder (each call returns its index + 1 as its "result"), and the
timing by the identity, so a :class:`~zerospec.evaluation.runs.Timed` row carries the index of the
step it was timed on. The paper-scale steps themselves are the slow tests' (tests/claims/).
"""
from __future__ import annotations

from typing import NamedTuple

import pytest

from zerospec.evaluation import runs as pr
from zerospec.model.family import GPTConfig
from zerospec.paper import evaluation as ev


class Measured(NamedTuple):
    """One call of ``measure``: the model, ZeRO-DP stage, N_d and keyword arguments."""
    model: GPTConfig
    stage: int
    n_d: int
    kw: dict


@pytest.fixture
def measured(monkeypatch) -> list[Measured]:
    """The ``measure`` calls the runs code makes, in order; its caches cleared before and after
    (the recorder's tokens must not outlive the test, nor real steps leak into it)."""
    calls: list[Measured] = []

    def record(cfg, **how):
        kw = {"n_m": cfg.n_m, "partition_activations": cfg.partition_activations,
              "cpu_checkpointing": cfg.cpu_checkpointing, **how}
        calls.append(Measured(cfg.model, cfg.stage, cfg.n_d, kw))
        return len(calls)

    monkeypatch.setattr(pr, "measure", record)
    monkeypatch.setattr(pr, "step_time", lambda r, machine, *a, **kw: r)
    monkeypatch.setattr(pr, "highest_peak", lambda r: 0)
    pr.step.cache_clear()
    pr.timed.cache_clear()
    yield calls
    pr.step.cache_clear()
    pr.timed.cache_clear()


def shape(model: GPTConfig) -> tuple[int, int, int]:
    return model.n_layer, model.n_embd, model.n_head


def row_id(run: ev.Run) -> str:
    return f"{run.size}-{run.who}-{run.gpus}gpus-mp{run.mp}-bs{run.batch_per_gpu}"


def test_every_appendix_rows_step_measures_its_layers_width_heads_grid_and_batch(measured):
    """For every row of the appendix tables (Figures 2–4, 6–8), the step the runs code measures
    ("baseline" for a Baseline row, else "zero") is of the row's (layers, hd, heads) on its
    N_d × MP grid at its batch per GPU."""
    for run in ev.APPENDIX:
        call = measured[pr.step(run, "baseline" if run.who == "Baseline" else "zero") - 1]
        assert shape(call.model) == (run.layers, run.hd, run.heads), row_id(run)
        assert (call.n_d, call.kw["n_m"], call.kw["micro_batch"]) == (
            run.n_d, run.mp, run.batch_per_gpu), row_id(run)


FIGURES = {"figure2": lambda: [t for pair in pr.figure2() for t in pair],
           "figure3": pr.figure3, "figure4": pr.figure4_rows,
           "figure8": lambda: list(pr.figure8().values())}
ROWS = {"figure2": ev.FIGURE2, "figure3": ev.FIGURE3, "figure4": ev.FIGURE4,
        "figure8": ev.FIGURE8[:5]}


@pytest.mark.parametrize("figure", list(FIGURES))
def test_each_figure_times_its_appendix_rows_at_their_own_shapes(measured, figure):
    """A figure's timed rows are its appendix table's rows, in order, each timed on a step of that
    row's (layers, hd, heads) and grid: no row is run at another row's shape or head count."""
    timed = FIGURES[figure]()
    assert [t.run for t in timed] == list(ROWS[figure])
    for t in timed:
        call = measured[t.none - 1]
        assert (shape(call.model), call.n_d, call.kw["n_m"]) == (
            (t.run.layers, t.run.hd, t.run.heads), t.run.n_d, t.run.mp), row_id(t.run)


def test_figure3_is_appendix_table_2_as_printed():
    """[SC] appendix Table 2 (arXiv Table 6): 60B, ZeRO, on 64/128/256/400 GPUs at MP 16, 75 layers
    of 8192 with 32 heads, 16/48/48/64 sequences per GPU (64/384/768/1600 in all)."""
    assert [(r.size, r.who, r.gpus, r.mp, r.layers, r.hd, r.heads, r.batch_per_gpu, r.total_batch)
            for r in ev.FIGURE3] == [
        ("60B", "ZeRO", 64, 16, 75, 8192, 32, 16, 64),
        ("60B", "ZeRO", 128, 16, 75, 8192, 32, 48, 384),
        ("60B", "ZeRO", 256, 16, 75, 8192, 32, 48, 768),
        ("60B", "ZeRO", 400, 16, 75, 8192, 32, 64, 1600)]


ZERO_ROWS = [next(r for r in ev.FIGURE2 if (r.size, r.who) == ("1.5B", "ZeRO")),     # MP 1
             next(r for r in ev.FIGURE4 if r.size == "13B"),                         # MP 1
             next(r for r in ev.FIGURE2 if (r.size, r.who) == ("8B", "ZeRO")),       # MP 4
             next(r for r in ev.FIGURE2 if (r.size, r.who) == ("100B", "ZeRO"))]     # MP 16


@pytest.mark.parametrize("run", ZERO_ROWS, ids=row_id)
def test_zero_rows_run_c4_with_model_parallelism_and_c3_without(measured, run):
    """ZeRO's rows run as Table 3's C4 (P_os+g with C_B, M_D and P_a over the MP group), but as
    C3 (no P_a) at MP 1, where there is no MP group to partition activations over."""
    expected = "C4" if run.mp > 1 else "C3"
    assert pr.zero_config(run).name == expected
    call = measured[pr.step(run) - 1]
    assert (call.stage, call.kw["n_m"], call.kw["partition_activations"],
            call.kw["cpu_checkpointing"]) == (2, run.mp, run.mp > 1, False)
