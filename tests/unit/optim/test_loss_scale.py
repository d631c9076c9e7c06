"""The loss scaler follows torch's GradScaler rule; its hyper-parameters are range-checked."""
from __future__ import annotations

import types

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zerospec.optim.loss_scale import LossScale, LossScaler
from zerospec.testing.faults import inject_overflow
from zerospec.zero.fetch import ParamFetcher


@settings(max_examples=60, deadline=None)
@given(flags=st.lists(st.booleans(), min_size=1, max_size=40),
       init=st.floats(min_value=1.0, max_value=2.0 ** 24, allow_nan=False),
       growth=st.sampled_from([2.0, 4.0, 8.0]), backoff=st.sampled_from([0.5, 0.25, 0.125]),
       interval=st.integers(1, 5))
def test_the_scale_follows_torchs_amp_update_rule(flags, init, growth, backoff, interval):
    """Scale and growth tracker after any overflow sequence equal torch._amp_update_scale_'s."""
    ours = LossScaler(LossScale(init, growth, backoff, interval))
    scale = torch.tensor([init], dtype=torch.float32)
    tracker = torch.zeros(1, dtype=torch.int32)
    for f in flags:
        ours.update(f)
        torch._amp_update_scale_(scale, tracker, torch.tensor([float(f)]), growth, backoff, interval)
        assert (ours.scale, ours.growth_tracker) == (float(scale), int(tracker))


@pytest.mark.parametrize("kwargs,match", [
    ({"init_scale": 0.0}, r"init_scale must be a finite number > 0, got 0.0"),
    ({"init_scale": float("inf")}, r"init_scale must be a finite number > 0, got inf"),
    ({"growth_factor": 1.0}, r"growth_factor must be a finite number > 1, got 1.0"),
    ({"backoff_factor": 1.0}, r"backoff_factor must be in \(0, 1\), got 1.0"),
    ({"backoff_factor": 0}, r"backoff_factor must be in \(0, 1\), got 0"),
    ({"growth_interval": 0}, r"growth_interval must be an integer >= 1, got 0"),
    ({"growth_interval": 2.5}, r"growth_interval must be an integer >= 1, got 2.5"),
])
def test_bad_scaler_parameters_are_refused(kwargs, match):
    """Each invalid hyper-parameter raises ValueError naming the value and the accepted range."""
    with pytest.raises(ValueError, match=match):
        LossScale(**kwargs)


class _Fetcher:
    """What the seam's patch reads of a fetcher: its stage's rank context."""

    def __init__(self, step, rank):
        self.stage = types.SimpleNamespace(ctx=types.SimpleNamespace(step=step, rank=rank))


def test_the_overflow_hook_poisons_only_its_step_rank_and_units_last_element_once():
    """inject_overflow(2, 1): unit 0's last element is inf at step 2 on rank 1, once; else untouched."""
    grads = {key: torch.zeros(5) for key in ("hit", "again", "unit1", "step1", "rank0")}
    hit = _Fetcher(2, 1)
    with inject_overflow(step=2, rank=1):
        ParamFetcher.grad_written(hit, 0, grads["hit"])
        ParamFetcher.grad_written(hit, 0, grads["again"])         # micro-batch 2 of the step
        ParamFetcher.grad_written(hit, 1, grads["unit1"])
        ParamFetcher.grad_written(_Fetcher(1, 1), 0, grads["step1"])
        ParamFetcher.grad_written(_Fetcher(2, 0), 0, grads["rank0"])
    assert grads.pop("hit").isinf().tolist() == [False] * 4 + [True]
    assert not any(g.isinf().any() for g in grads.values())
    plain = torch.zeros(5)
    ParamFetcher.grad_written(hit, 0, plain)                      # outside the block: the product
    assert not plain.isinf().any()


@pytest.mark.parametrize("kwargs,match", [
    ({"step": 0, "rank": 0}, r"inject_overflow step must be an integer >= 1, got 0"),
    ({"step": 2, "rank": -1}, r"inject_overflow rank must be an integer >= 0, got -1"),
    ({"step": 2.0, "rank": 0}, r"inject_overflow step must be an integer >= 1, got 2.0"),
])
def test_bad_overflow_hook_arguments_are_refused(kwargs, match):
    """A step below 1 or a negative rank raises ValueError naming the value and the accepted range."""
    with pytest.raises(ValueError, match=match):
        with inject_overflow(**kwargs):
            pass


def test_an_overflow_hook_that_never_fires_says_what_the_runs_reached():
    """Step 9 in a run of steps 1..5 on ranks 0..3: ValueError naming both, not a silent no-op."""
    with pytest.raises(ValueError, match=r"inject_overflow\(step=9, rank=0, unit=0\) never fired: "
                                         r"the runs inside reached steps 1..5, ranks 0..3"):
        with inject_overflow(step=9, rank=0):
            for step in range(1, 6):
                for rank in range(4):
                    ParamFetcher.grad_written(_Fetcher(step, rank), 0, torch.zeros(5))
