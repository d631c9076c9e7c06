"""zerospec/evaluation/cached_memory.py's search and figure on made-up steps (the paper-scale runs are the
slow claim tests C47/C48 in tests/claims/test_evaluation.py)."""
from __future__ import annotations

import pytest

from zerospec.evaluation import cached_memory as cached
from zerospec.evaluation.cached_memory import StepMemory, max_layers_replayed
from zerospec.evaluation.configs import CONFIGS

CAP = 100


@pytest.fixture
def steps(monkeypatch):
    """A step of L layers holds 10 + 2L bytes (L_a = 45 on 100) and runs out at 40, 42, 43, 44
    and 45 through fragmentation: 41 is the largest that runs, below it 38 runs out too."""
    runs_out = {38, 40, 42, 43, 44, 45}
    measured = []

    def step_memory(config, L, capacity, **shape):
        measured.append(L)
        held = 10 + 2 * L
        oom = "OOM" if held > capacity or L in runs_out else None
        return StepMemory(ledger=held, allocated=held, reserved=held, oom=oom)
    monkeypatch.setattr(cached, "step_memory", step_memory)
    return measured


def test_the_allocator_search_walks_down_from_l_a_past_every_fragmentation_oom(steps):
    """Not a bisection: from L_a (45: 100 bytes held; 46 would hold 102) every L is replayed
    down to the first that runs (41); 38's OOM below it does not matter, nor is it measured."""
    seen: dict = {}
    assert max_layers_replayed(CONFIGS["C1"], CAP, seen=seen) == 41
    assert sorted(seen) == [8, 16, 41, 42, 43, 44, 45, 46]


def test_the_allocator_search_answers_0_when_no_layer_count_runs(monkeypatch):
    """Every layer count runs out, down to 1: the answer is 0 layers, not 1."""
    monkeypatch.setattr(cached, "step_memory", lambda c, L, cap, **s: StepMemory(
        ledger=L, allocated=L, reserved=L, oom="OOM"))
    assert max_layers_replayed(CONFIGS["C1"], 20) == 0


def test_the_cached_memory_figure_draws_one_panel_per_configuration(monkeypatch, tmp_path):
    """fragmentation_by_config writes PNG and SVG from each configuration's (allocated, reserved)
    series; here made up, so no paper-scale step runs."""
    from zerospec.evaluation import plots
    series = [(0, 0), (5 * 10**9, 6 * 10**9), (10**9, 6 * 10**9)]
    fake = {n: StepMemory(1, 5 * 10**9, 6 * 10**9, None, series) for n in CONFIGS}
    monkeypatch.setattr(plots, "figure7", lambda size, samples=False: fake)   # the name it calls
    paths = plots.fragmentation_by_config(tmp_path, "40B")
    assert [p.name for p in paths] == ["fragmentation_by_config_40B.png",
                                       "fragmentation_by_config_40B.svg"]
    assert all(p.stat().st_size > 0 for p in paths)
