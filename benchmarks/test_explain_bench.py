"""Speed of the OOM explainer's meta steps (issue 48): time budgets for whole jobs, no baseline.

Budgets on 2 CPU cores: one meta step of Llama-3.1-405B on 16,384 GPUs (N_d = 2,048 × N_m = 8)
in ≤ 30 s per stage; ``zerospec plan --explain`` of Llama-3-70B on 64 H100s in ≤ 10 s from a
cold process (import, one traced meta step, the allocator replay, the tables); of Llama-3.1-405B
on 16,384 H100s (seq 8,192) in ≤ 10 s where it fits (a checkpoint every block) and ≤ 30 s where
it does not and the answer adds its suggestions (a meta step per change, searches for the
sequence length). Nothing here has a
baseline to be a ratio to (no other tool answers the question), so each records ``seconds`` and
its ``target`` (tools/benchtable.py) and asserts the budget, as test_scale_bench.py does. The
405B step is fast at 16,384 GPUs because every rank of a unit-aligned model is in one rank class
(zerospec.training.scale.rank_classes): one rank is stepped and stands for all. Run:

    pytest -o addopts="" benchmarks/test_explain_bench.py
"""
from __future__ import annotations

import resource
import subprocess
import sys
import time

import pytest

from zerospec.model.presets import preset
from zerospec.training.config import TrainConfig
from zerospec.training.scale import measure

STEP_BUDGET, EXPLAIN_BUDGET, SUGGEST_BUDGET = 30.0, 10.0, 30.0
EXPLAIN = ["plan", "--preset", "llama-3-70b", "--gpus", "64", "--machine", "dgx-h100", "--stage",
           "3", "--seq", "8192", "--micro-batch", "1", "--checkpoint-activations", "1", "--explain"]


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_405b_on_16384_gpus_one_meta_step(benchmark, capsys, stage):
    m = preset("llama-3.1-405b").model
    cfg = TrainConfig.of(stage=stage, n_d=2048, model=m, n_m=8)
    r = benchmark.pedantic(measure, args=(cfg,), rounds=1, iterations=1)
    seconds = benchmark.stats.stats.max
    benchmark.extra_info.update(seconds=seconds, target=STEP_BUDGET, step_s=round(r.seconds, 3),
                                ranks_run=[c.rep for c in r.classes])
    with capsys.disabled():
        print(f"\n405B @ 16,384 (2,048 × 8), stage {stage}: {seconds:.1f} s "
              f"(budget {STEP_BUDGET:g} s), {len(r.classes)} rank class(es)")
    assert seconds <= STEP_BUDGET


def _cold(benchmark, argv, budget):
    """``zerospec ARGV`` in a fresh process, once: its output, wall seconds and CPU seconds (on a
    loaded machine the two part), recorded beside the budget."""
    def run():
        return subprocess.run([sys.executable, "-m", "zerospec", *argv], capture_output=True,
                              text=True, check=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = benchmark.pedantic(run, rounds=1, iterations=1)
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    benchmark.extra_info.update(seconds=seconds, target=budget, cpu_s=round(cpu, 2))
    return out, seconds, cpu


def test_plan_explain_llama_3_70b_at_64_gpus_from_cold(benchmark, capsys):
    out, seconds, cpu = _cold(benchmark, EXPLAIN, EXPLAIN_BUDGET)
    with capsys.disabled():
        print(f"\nplan --explain llama-3-70b @ 64: {seconds:.1f} s (budget {EXPLAIN_BUDGET:g} s; "
              f"CPU {cpu:.1f} s)")
    assert "explain" not in out.stderr and "Peak per phase" in out.stdout
    assert seconds <= EXPLAIN_BUDGET


EXPLAIN_405B = ["plan", "--preset", "llama-3.1-405b", "--gpus", "16384", "--machine", "dgx-h100",
                "--stage", "3", "--seq", "8192", "--explain"]
CASES_405B = {"fits": (EXPLAIN_405B + ["--checkpoint-activations", "1"], EXPLAIN_BUDGET),
              "suggestions": (EXPLAIN_405B, SUGGEST_BUDGET)}


@pytest.mark.parametrize("case", list(CASES_405B))
def test_plan_explain_405b_at_16384_gpus_from_cold(benchmark, capsys, case):
    argv, budget = CASES_405B[case]
    out, seconds, cpu = _cold(benchmark, argv, budget)
    with capsys.disabled():
        print(f"\nplan --explain llama-3.1-405b @ 16,384, {case}: {seconds:.1f} s (budget "
              f"{budget:g} s; CPU {cpu:.1f} s)")
    assert "Peak per phase" in out.stdout
    assert ("What would make it fit" in out.stdout) == (case == "suggestions")
    assert seconds <= budget
