"""Bad configurations are refused up front, naming the value and what is accepted."""
from __future__ import annotations

import pytest

from zerospec.model.gpt import GPTConfig
from zerospec.optim.adam import AdamConfig
from zerospec.training.config import TrainConfig


@pytest.mark.parametrize("kwargs,match", [
    ({"stage": 4}, r"stage must be one of \[0, 1, 2, 3\], got 4"),
    ({"stage": "2"}, r"stage must be one of \[0, 1, 2, 3\], got '2'"),
    ({"n_d": 0}, r"n_d \(number of ranks\) must be an integer >= 1, got 0"),
    ({"n_d": 4, "global_batch": 6}, r"global_batch=6 must be a positive multiple of n_d=4"),
    ({"steps": 0}, r"steps must be an integer >= 1, got 0"),
    ({"zero1_comm": "broadcast"}, r"unknown ZeRO-1 variant 'broadcast'; accepted: reduce_scatter, all_reduce"),
    ({"device": "cuda"}, r"device must be one of \('cpu', 'meta'\), got 'cuda'"),
    ({"precision": "fp8"}, r"unknown precision 'fp8'; accepted: fp16, bf16, fp32"),
])
def test_bad_train_config_is_refused_with_the_accepted_values(kwargs, match):
    """Each invalid field raises ValueError naming the value and the accepted range."""
    with pytest.raises(ValueError, match=match):
        TrainConfig.of(**kwargs)


@pytest.mark.parametrize("kwargs,match", [
    ({"n_embd": 10, "n_head": 3}, r"n_embd=10 must be divisible by n_head=3"),
    ({"n_layer": 0}, r"GPTConfig.n_layer must be an integer >= 1, got 0"),
])
def test_bad_model_shape_is_refused(kwargs, match):
    """A model shape that cannot be built names the offending field."""
    with pytest.raises(ValueError, match=match):
        GPTConfig(**kwargs)


@pytest.mark.parametrize("kwargs,match", [({"lr": 0}, "lr must be > 0"), ({"beta1": 1.0}, r"beta1 must be in \[0, 1\)"),
                                          ({"eps": -1}, "eps must be > 0")])
def test_bad_adam_hyperparameters_are_refused(kwargs, match):
    """Adam's hyper-parameters are range-checked."""
    with pytest.raises(ValueError, match=match):
        AdamConfig(**kwargs)


def test_default_batch_is_two_sequences_per_rank():
    """Without global_batch, each rank takes 2 sequences."""
    assert TrainConfig(n_d=8).batch == 16
