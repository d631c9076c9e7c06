"""One training step at N = 32 against the compute floor: 32 × (forward + backward + Adam).

The floor is the same model and micro-batch run 32 times in one thread with plain fp32
parameters and torch.optim.Adam — what the ranks' arithmetic costs without ZeRO's bookkeeping.
Target (issue 18): the work-matched ratio ≤ 1.25 for every stage (the plain step/floor ratio is
shown beside it; issue 3's ≤ 1.3 / 1.6 on it is no longer the asserted one).

That floor holds N Adam passes over Ψ: stage 0's work, but more than stages 1–3 do (N ranks ×
Ψ/N elements = one pass). So the output also shows a work-matched ratio, against the floor less
N − 1 Adam passes for stages 1–3 (an Adam pass timed on its own in the same run): equal work on
both sides, so this is the ratio asserted.
"""
from __future__ import annotations

import contextlib
import statistics

import pytest
import torch

from zerospec.model import gpt
from zerospec.model.data import BigramData
from zerospec.optim.adam import AdamConfig, reference_optimizer
from zerospec.cluster.threads import torch_threads
from zerospec.training.config import TrainConfig
from zerospec.training.run import train

from conftest import best_of

N, STEPS, ROUNDS = 32, 6, 3
TARGET = 1.25   # work-matched, every stage (issue 18)


def _floor():
    cfg = gpt.SMALL
    init = gpt.init_params(cfg, 0)
    params = [{n: torch.nn.Parameter(t.clone()) for n, t in ps.items()} for ps in init.values()]
    idx, tgt = BigramData(cfg.vocab_size, cfg.block_size, 0).batch(0, 2)

    @contextlib.contextmanager
    def fetch(i, last=False):
        yield params[i]
    opts = [reference_optimizer(list(p.values()), AdamConfig()) for p in params]

    def step():
        for _ in range(N):
            loss = gpt.forward(cfg, idx, tgt, fetch)
            loss.backward()
            for o in opts:
                o.step()
                o.zero_grad(set_to_none=True)

    def adam_passes():
        """N Adam steps over the whole model (on one backward's gradients)."""
        gpt.forward(cfg, idx, tgt, fetch).backward()
        for _ in range(N):
            for o in opts:
                o.step()
        for o in opts:
            o.zero_grad(set_to_none=True)
    return step, adam_passes


@pytest.mark.parametrize("stage", range(4))
def test_step_time_at_32_ranks_over_compute_floor(stage, benchmark, capsys):
    """Step time of a 32-rank run / the 32× single-thread compute floor, per stage."""
    floor, adam_passes = _floor()
    floor()
    steps, floors, adams = [], [], []

    def ours():
        res = train(TrainConfig(stage=stage, n_d=N, steps=STEPS))
        # the interior steps: each the whole cycle of 32 forward+backward passes, 32 optimizer
        # steps and the collectives (the first also holds start-up and ranks running ahead into
        # step 2, the last lacks the next step's forward: see Result.step_seconds)
        steps.extend(res.step_seconds[1:-1])
        with torch_threads(1):             # the cluster's setting, for a fair floor
            for _ in range(STEPS - 2):     # as many samples as of ours, at the same time
                floors.append(best_of(floor, 1))
            adams.append(best_of(adam_passes, 1) / N)
    benchmark.pedantic(ours, rounds=ROUNDS, iterations=1)
    # best of the samples for both, as everywhere in benchmarks/ (conftest.py): what the machine
    # allows when nothing else gets in the way
    step, fl = min(steps), min(floors)
    ratio = step / fl
    matched = fl - (N - 1) * min(adams) if stage else fl   # stages 1–3: one Adam pass in all
    benchmark.extra_info.update(step_s=step, floor_s=fl, ratio=step / matched, plain_ratio=ratio,
                                median_ratio=statistics.median(steps) / statistics.median(floors),
                                matched_floor_s=matched, matched_ratio=step / matched,
                                target=TARGET)
    with capsys.disabled():
        print(f"\nstage {stage}: step {step * 1e3:.0f} ms, floor {fl * 1e3:.0f} ms, "
              f"ratio {ratio:.2f} (medians {benchmark.extra_info['median_ratio']:.2f}); work-matched "
              f"{step / matched:.2f} (target ≤ {TARGET})")
    assert step / matched <= TARGET
