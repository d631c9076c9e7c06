"""Model parallelism's speed: one step on 32 virtual GPUs as 8 × 4 (DP × MP), and 100B on 400
meta GPUs at MP 16 with checkpointing and P_a, every stage (issue: ZeRO-R part 1).

The 8 × 4 step is held against the compute floor of the same run: the 32 ranks' own arithmetic
in one thread — each rank's Megatron slice (model/megatron.py) through forward, backward and
torch's Adam, with the MP operators as identities (no all-reduce) and no ZeRO. So the ratio is
what the collectives, the thread hand-offs and ZeRO's bookkeeping add, as in the stage benchmark;
MP's own extra arithmetic (every MP rank repeats the replicated LayerNorms; the embedding, LM
head and cross-entropy are split by vocabulary, as in the run) is in the floor too.
"""
from __future__ import annotations

import contextlib
import functools
import time

import pytest
import torch

from zerospec.cluster.threads import torch_threads
from zerospec.model import gpt, megatron
from zerospec.model.data import BigramData
from zerospec.model.presets import preset
from zerospec.optim.adam import AdamConfig, reference_optimizer
from zerospec.training.config import TrainConfig
from zerospec.training.sections import MeshOptions, ZeroROptions
from zerospec.training.sections import MeshOptions
from zerospec.training.run import train
from zerospec.training.scale import measure

from conftest import best_of

N_D, N_M, STEPS, ROUNDS = 8, 4, 6, 2
TARGET = 2.0          # MP step / the 32 ranks' own arithmetic (see the module docstring)
META_BUDGET = 30.0    # seconds, 100B at 400 GPUs, all four stages


class _NoComm:
    """MP rank ``index``'s operators without their all-reduces: each rank's arithmetic alone
    (its vocabulary rows in the embedding, the head and the cross-entropy included)."""
    n_m = N_M

    def __init__(self, index: int):
        self.index = index
        self.comm = self

    @staticmethod
    def enter(x):
        return x

    @staticmethod
    def exit(x):
        return x

    @staticmethod
    def all_reduce(t, op):
        return t


def _floor():
    cfg = gpt.SMALL
    init = gpt.init_params(cfg, 0)
    ranks = []
    for j in range(N_M):
        sliced = megatron.shard(cfg, init, N_M, j)
        params = [{n: torch.nn.Parameter(t.clone()) for n, t in ps.items()} for ps in sliced.values()]
        ranks.append((params, [reference_optimizer(list(p.values()), AdamConfig()) for p in params],
                      _NoComm(j)))
    idx, tgt = BigramData(cfg.vocab_size, cfg.block_size, 0).batch(0, 2)

    def step():
        for _ in range(N_D):
            for params, opts, mp in ranks:
                @contextlib.contextmanager
                def fetch(i, last=False, params=params):
                    yield params[i]
                run_blocks = functools.partial(gpt.blocks, mp=mp)
                gpt.forward(cfg, idx, tgt, fetch, run_blocks, mp=mp).backward()
                for o in opts:
                    o.step()
                    o.zero_grad(set_to_none=True)
    return step


@pytest.mark.parametrize("stage", [0, 3])
def test_step_at_8_by_4_over_the_replicas_floor(stage, benchmark, capsys):
    floor = _floor()
    floor()
    steps, floors = [], []

    def ours():
        res = train(TrainConfig(stage=stage, n_d=N_D, steps=STEPS, mesh=MeshOptions(n_m=N_M)))
        steps.extend(res.step_seconds[1:-1])   # interior steps: one whole cycle each
        with torch_threads(1):
            for _ in range(STEPS - 2):
                floors.append(best_of(floor, 1))
    benchmark.pedantic(ours, rounds=ROUNDS, iterations=1)
    step, fl = min(steps), min(floors)
    benchmark.extra_info.update(step_s=step, floor_s=fl, ratio=step / fl, target=TARGET)
    with capsys.disabled():
        print(f"\n8 × 4, stage {stage}: step {step * 1e3:.0f} ms, the 32 ranks' floor "
              f"{fl * 1e3:.0f} ms, ratio {step / fl:.2f} (target ≤ {TARGET})")
    assert step / fl <= TARGET


def test_100b_at_400_gpus_mp16_with_p_a_every_stage_on_meta(benchmark, capsys):
    m = preset("t4-100B-125x8192").model

    def all_stages():
        return {s: measure(TrainConfig(stage=s, n_d=25, model=m,
                                       zero_r=ZeroROptions(checkpoint_activations=1,
                                                           partition_activations=True),
                                       mesh=MeshOptions(n_m=16)), micro_batch=1) for s in range(4)}
    t0 = time.perf_counter()
    results = benchmark.pedantic(all_stages, rounds=1, iterations=1)
    seconds = time.perf_counter() - t0
    benchmark.extra_info.update({f"stage{s}_s": round(r.seconds, 3) for s, r in results.items()})
    benchmark.extra_info.update(seconds=seconds, target=META_BUDGET)
    with capsys.disabled():
        print(f"\n100B @ 400 (25 × 16), P_a, 4 stages: {seconds:.1f} s (budget {META_BUDGET:g} s)")
    assert seconds <= META_BUDGET
