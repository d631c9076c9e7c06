"""zerospec/evaluation/cached_memory.py's search and figure on made-up steps (the paper-scale runs are the
slow claim tests C47/C48 in tests/claims/test_evaluation.py)."""
from __future__ import annotations

import dataclasses

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
    monkeypatch.setattr(plots, "figure7", lambda size: fake)   # the name it calls
    paths = plots.fragmentation_by_config(tmp_path, "40B")
    assert [p.name for p in paths] == ["fragmentation_by_config_40B.png",
                                       "fragmentation_by_config_40B.svg"]
    assert all(p.stat().st_size > 0 for p in paths)


# -- a step's rank classes, one at a time --------------------------------------------------------
SMALL = dict(gpus=14, n_m=2, micro_batch=1, d=64, heads=4)   # N_d = 7: ranks 0–5 and 6 (padded)


@pytest.fixture
def onlys(monkeypatch):
    """The rank class each of step_memory's meta steps was asked to step (None: all)."""
    asked = []
    measure = cached.measure

    def spy(config, **how):
        asked.append(how.get("only"))
        return measure(config, **how)
    monkeypatch.setattr(cached, "measure", spy)
    return asked


@pytest.mark.slow   # four meta steps of GPT-2's vocabulary with cold kernels: ~1 s
def test_a_step_that_runs_out_on_its_first_gpu_steps_no_other_class(onlys):
    """until="oom": the first rank class runs out on a device of its own allocated peak, so the
    step stops there, at its OOM, and says so (1 of 2 classes, stopped); going on from it for
    the whole step's peaks steps both classes to their ends, and they are the whole step's peaks
    and the same OOM, found by replaying the first class's whole trace."""
    whole = cached.step_memory(CONFIGS["C5"], 1, None, **SMALL)
    cap = whole.allocated                  # its reserved peak is above: the capped replay runs out
    assert onlys == [None] and whole.complete and whole.of == 2 and whole.reserved > cap
    first = cached.step_memory(CONFIGS["C5"], 1, cap, until="oom", **SMALL)
    assert onlys[1:] == [0] and (first.classes, first.of) == (1, 2) and not first.complete
    assert first.oom is not None and first.stopped and first.allocated <= cap
    rest = cached.step_memory(CONFIGS["C5"], 1, cap, until="oom", start=first, **SMALL)
    assert rest is first and onlys[2:] == []           # settled already: nothing stepped
    both = cached.step_memory(CONFIGS["C5"], 1, cap, start=first, **SMALL)
    assert onlys[2:] == [0, 1] and both.complete and not both.stopped
    assert (both.ledger, both.allocated, both.reserved) == (whole.ledger, whole.allocated,
                                                            whole.reserved)
    assert both.oom.event == first.oom.event and both.oom.phase == first.oom.phase


@pytest.mark.slow   # its own cold meta kernels: ~1 s
def test_a_step_over_the_capacity_on_its_first_gpu_stops_there_and_one_that_fits_steps_all(onlys):
    """until="over": a class whose allocated peak exceeds the device settles it; where none
    does, every class is stepped (fitting is every GPU's)."""
    whole = cached.step_memory(CONFIGS["C1"], 1, None, **SMALL)
    over = cached.step_memory(CONFIGS["C1"], 1, whole.allocated - 1, until="over", **SMALL)
    fits = cached.step_memory(CONFIGS["C1"], 1, whole.allocated, until="over", **SMALL)
    assert onlys == [None, 0, 0, 1]
    assert (over.classes, over.of, over.allocated) == (1, 2, whole.allocated)
    assert fits.complete and fits.allocated == whole.allocated


def test_step_memory_names_a_bad_until():
    with pytest.raises(ValueError, match="until must be one of .* got 'fits'"):
        cached.step_memory(CONFIGS["C1"], 1, 10, until="fits", **SMALL)


@pytest.mark.slow   # its own cold meta kernels: ~1 s
def test_a_step_that_ran_out_outside_every_phase_is_stepped_whole_to_name_the_phase(monkeypatch):
    """A step ended at an OOM no phase marker followed (made so here: the live replay's phase
    dropped) cannot name the phase the whole step's replay names: it is stepped again whole,
    and its OOM is the whole trace's."""
    whole = cached.step_memory(CONFIGS["C5"], 1, None, **SMALL)
    calls, measure = [], cached.measure

    def no_marker(config, **how):
        r = measure(config, **how)
        calls.append(how.get("capacity"))
        c = r.classes[0]
        if c.oom is not None:
            r.classes[0] = dataclasses.replace(c, oom=dataclasses.replace(c.oom, phase=None))
        return r
    monkeypatch.setattr(cached, "measure", no_marker)
    m = cached.step_memory(CONFIGS["C5"], 1, whole.allocated, until="oom", **SMALL)
    assert calls == [whole.allocated, None] and not m.stopped
    assert m.oom.phase is not None and m.allocated == whole.allocated


@pytest.mark.slow   # its own cold meta kernels: ~1 s
def test_the_ledger_search_steps_a_layer_count_to_its_first_gpu_over_and_one_that_fits_on_all(
        monkeypatch):
    """configs.peak_bytes with ``over``: a step whose first class peaks above ``over`` stops
    there (that GPU's peak); one within it steps every class, the whole step's highest."""
    from zerospec.evaluation import configs
    asked, measure = [], configs.measure

    def spy(config, **how):
        asked.append(how.get("only"))
        return measure(config, **how)
    monkeypatch.setattr(configs, "measure", spy)
    whole = configs.peak_bytes(CONFIGS["C1"], 1, **SMALL)
    over = configs.peak_bytes(CONFIGS["C1"], 1, over=whole - 1, **SMALL)
    fits = configs.peak_bytes(CONFIGS["C1"], 1, over=whole, **SMALL)
    assert asked == [None, 0, 0, 1] and over == fits == whole
