"""Speed of measuring paper-size models on meta tensors: one step of all four stages (issue 7).

Budgets on 2 CPU cores: 7.5B on 64 GPUs in ≤ 10 s, 1T on 1024 GPUs in ≤ 60 s. Each stage's step
is one cold round: the process's table of meta kernels emptied first (``metacache.forget``; the
first case in a process also pays PyTorch's one-time import of its Python meta kernels, about 1 s). Run:

    pytest -o addopts="" benchmarks/test_scale_bench.py

(``-o addopts=""`` drops the project's default ``--benchmark-skip``.)
"""
from __future__ import annotations

import pytest

from zerospec.model.presets import preset
from zerospec.training.config import TrainConfig
from zerospec.runtime import metacache
from zerospec.training.scale import measure

CASES = [("7.5B", 64, 10.0), ("1T", 1024, 60.0)]


def measure_stages(config: TrainConfig) -> dict:
    """Each stage's step from an empty table of meta kernels, as a process's first step."""
    out = {}
    for s in (0, 1, 2, 3):
        metacache.forget()
        out[s] = measure(config.replace(stage=s))
    return out


@pytest.mark.parametrize("name,n_d,budget", CASES, ids=[f"{m}@{n}" for m, n, _ in CASES])
def test_one_step_of_every_stage_on_meta(benchmark, name, n_d, budget):
    results = benchmark.pedantic(measure_stages, args=(TrainConfig(model=preset(name).model, n_d=n_d),),
                                 rounds=1,
                                 iterations=1)
    seconds = benchmark.stats.stats.max
    benchmark.extra_info.update({f"stage{s}_s": round(r.seconds, 3) for s, r in results.items()})
    benchmark.extra_info["ranks_run"] = {s: [c.rep for c in r.classes] for s, r in results.items()}
    benchmark.extra_info.update(seconds=seconds, target=budget)
    assert sorted(results) == [0, 1, 2, 3]
    assert seconds <= budget, (f"{name} on {n_d} GPUs took {seconds:.1f} s for one step of all four "
                               f"stages; the budget is {budget:g} s on 2 cores")
