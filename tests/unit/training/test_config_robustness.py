"""The robustness fields of TrainConfig refuse bad values up front, naming the value and what is accepted."""
from __future__ import annotations

import pytest
import torch
from hypothesis import strategies as st

from tests.support.examples import examples
from zerospec.training import checkpoint
from zerospec.cluster.threads import VirtualCluster
from zerospec.optim.loss_scale import LossScale
from zerospec.model.gpt import ODD
from zerospec.testing.faults import inject_overflow
from zerospec.training.config import TrainConfig
from zerospec.training.sections import BatchOptions, OptimOptions
from zerospec.training.run import train


@pytest.mark.parametrize("kwargs,match", [
    pytest.param({"grad_accum_steps": 0}, r"grad_accum_steps must be an integer >= 1, got 0", id="G=0"),
    pytest.param({"grad_accum_steps": 1.5}, r"grad_accum_steps must be an integer >= 1, got 1.5", id="G=1.5"),
    pytest.param({"n_d": 4, "grad_accum_steps": 2, "global_batch": 12},
                 r"global_batch=12 must be a positive multiple of n_d=4 × grad_accum_steps=2", id="batch"),
    pytest.param({"clip_grad_norm": -1.0}, r"clip_grad_norm must be a finite number > 0 or None, got -1.0",
                 id="clip<0"),
    pytest.param({"clip_grad_norm": float("inf")}, r"clip_grad_norm must be a finite number > 0 or None, got inf",
                 id="clip=inf"),
    pytest.param({"loss_scale": 1024.0}, r"loss_scale must be a LossScale or None, got 1024.0", id="scale-float"),
    pytest.param({"grad_accum_steps": 2, "precision": "bf16"},
                 r"exact gradient sums \(grad_accum_steps > 1 or exact_grads\) need precision='fp16', "
                 r"got 'bf16'", id="accum-bf16"),
    pytest.param({"n_d": 4096, "grad_accum_steps": 4},
                 r"n_d × grad_accum_steps = 16384 exceeds 8192, the most fp16 gradients fp64 sums exactly",
                 id="too-many-terms"),
    pytest.param({"stage": 3, "dpu": 2, "offload_optimizer": "cpu", "flavour": "fsdp2",
                  "precision": "bf16"},
                 r"DPU with FSDP2 flavour of stage 3 is refused: under CPUOffloadPolicy",
                 id="refused-pair"),
])
def test_bad_robustness_settings_are_refused(kwargs, match):
    """Each invalid setting raises ValueError naming the value and the accepted range."""
    with pytest.raises(ValueError, match=match):
        TrainConfig.of(**kwargs)


def test_an_overflow_at_a_step_or_rank_the_run_lacks_is_named():
    """inject_overflow(step=9) around a 2-step run, or rank 4 on 4 ranks: ValueError naming both."""
    cfg = TrainConfig(n_d=4, model=ODD, steps=2, optim=OptimOptions(loss_scale=LossScale()))
    for step, rank in ((9, 0), (1, 4)):
        with pytest.raises(ValueError, match=rf"inject_overflow\(step={step}, rank={rank}, unit=0\) "
                                             r"never fired: the runs inside reached steps 1..2, ranks 0..3"):
            with inject_overflow(step=step, rank=rank):
                train(cfg)


def test_defaults_are_the_plain_paper_step():
    """No scaler, no clipping, G = 1 and fp16 gradient sums: today's behaviour unchanged."""
    cfg = TrainConfig()
    assert (cfg.loss_scale, cfg.clip_grad_norm, cfg.grad_accum_steps, cfg.exact) == (None, None, 1, False)
    assert TrainConfig(n_d=4, batching=BatchOptions(grad_accum_steps=3)).batch == 24     # 2 sequences per rank per micro-batch


@pytest.mark.parametrize("bad", [1.5, "1", True])
def test_the_jitter_seed_must_be_an_integer(bad):
    """VirtualCluster(jitter=...) takes an integer seed or None."""
    with pytest.raises(ValueError, match="jitter must be an integer seed or None"):
        VirtualCluster(2, jitter=bad)


def test_loading_for_zero_ranks_is_refused(tmp_path):
    """load(dir, n_ranks=0) raises ValueError naming the value."""
    st0 = checkpoint.TrainState([("u", [("w", (3,))])], {k: [torch.zeros(3)] for k in checkpoint.KINDS},
                                {"n_ranks": 1, "step": 1})
    checkpoint.save_state(st0, tmp_path / "c", 2)
    with pytest.raises(ValueError, match="n_ranks must be an integer >= 1, got 0"):
        checkpoint.load(tmp_path / "c", n_ranks=0)


FP16 = st.floats(width=16, allow_nan=False, allow_infinity=False)


def _sums_in_any_order(xs, seed):
    """The accumulation design's premise: fp64 sums of fp16 numbers do not depend on the order."""
    t = torch.tensor(xs, dtype=torch.float16).double()
    perm = torch.randperm(len(xs), generator=torch.Generator().manual_seed(seed))
    forward = backward = shuffled = torch.zeros((), dtype=torch.float64)
    for i in range(len(xs)):
        forward = forward + t[i]
        backward = backward + t[-1 - i]
        shuffled = shuffled + t[perm[i]]
    assert forward == backward == shuffled


test_fp16_values_sum_exactly_in_fp64_in_any_order, \
    test_fp16_values_sum_exactly_in_fp64_in_any_order_more_examples = \
    examples(25, 100, xs=st.lists(FP16, min_size=1, max_size=64),
             seed=st.integers(0, 2 ** 16))(_sums_in_any_order)


def test_fp32_sums_of_fp16_numbers_depend_on_the_order():
    """Why not fp32: 2^15 + 2^-24 − 2^15 is 0 in fp32 one way and 2^-24 the other."""
    a, b, c = (torch.tensor(v, dtype=torch.float32) for v in (2.0 ** 15, 2.0 ** -24, -(2.0 ** 15)))
    assert (a + b) + c == 0 and (a + c) + b == 2.0 ** -24
