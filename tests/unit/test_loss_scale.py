"""The loss scaler follows torch's GradScaler rule; its hyper-parameters are range-checked."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zerospec.optim.loss_scale import LossScale, LossScaler, poison


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


def test_the_fault_hook_poisons_only_its_unit_last_element():
    """poison(0) sets unit 0's last element to inf and leaves other units alone."""
    fault, a, b = poison(0), torch.zeros(5), torch.zeros(5)
    fault(0, a)
    fault(1, b)
    assert a.isinf().tolist() == [False] * 4 + [True] and not b.isinf().any()
