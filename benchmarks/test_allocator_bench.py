"""Speed of the caching allocator model: replaying a paper-scale step's storage trace (issue 15).

Budget on 2 CPU cores: every rank class's trace of one 100B step (Table 4's 125 × 8192, MP 16,
N_d = 25: the 400 GPUs of the paper's runs, P_os+g, P_a, a checkpoint per block, 32 sequences per
GPU) replayed at 32 GB and unbounded in ≤ 10 s. Recording the trace (one meta step, ~6 s) is
not timed. Run:

    pytest -o addopts="" benchmarks/test_allocator_bench.py
"""
from __future__ import annotations

from zerospec.model.presets import preset
from zerospec.paper import theory
from zerospec.runtime.trace import replay
from zerospec.training.scale import measure
from zerospec.training.config import TrainConfig
from zerospec.training.sections import MeshOptions, ZeroROptions

BUDGET = 10.0


def test_replay_of_a_100b_step_on_400_gpus(benchmark):
    r = measure(TrainConfig(stage=2, n_d=25, model=preset("t4-100B-125x8192").model,
                            zero_r=ZeroROptions(checkpoint_activations=1,
                                                partition_activations=True),
                            mesh=MeshOptions(n_m=16)), micro_batch=32, trace=True)
    traces = [c.allocations for c in r.classes]

    def replay_all():
        return [(replay(t, theory.V100_BYTES), replay(t)) for t in traces]

    out = benchmark.pedantic(replay_all, rounds=3, iterations=1)
    seconds = benchmark.stats.stats.max
    benchmark.extra_info.update(classes=len(traces), events=sum(map(len, traces)), seconds=seconds,
                                target=BUDGET)
    assert all(unbounded.oom is None for _, unbounded in out)
    assert seconds <= BUDGET, (f"replaying {sum(map(len, traces))} events of {len(traces)} rank "
                               f"classes twice took {seconds:.2f} s; the budget is {BUDGET:g} s")
