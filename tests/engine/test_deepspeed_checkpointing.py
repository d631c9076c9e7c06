"""DeepSpeed's activation checkpointing read as zerospec reads it (zerospec/plan/deepspeed.py,
zerospec/zero_r/partition.py), against DeepSpeed 0.19.8's own module
(deepspeed/runtime/activation_checkpointing/checkpointing.py). Marked ``deepspeed``, skipped
without it; no process group is needed: both checks run before DeepSpeed asks for one.
"""
from __future__ import annotations

import pytest
import torch

from tests.engine.test_deepspeed import MISSING
from zerospec.plan import ds_config
from zerospec.plan.deepspeed import config_kwargs

pytestmark = [pytest.mark.deepspeed, pytest.mark.skipif(MISSING is not None, reason=MISSING or "")]


@pytest.fixture
def ds_checkpointing():
    from deepspeed.runtime.activation_checkpointing import checkpointing
    yield checkpointing
    checkpointing._configure_defaults()       # configure() set its module's switches


def test_deepspeed_refuses_contiguous_checkpoints_without_partitioning_and_so_does_the_reader(
        ds_checkpointing):
    """configure() asserts contiguous_memory_optimization needs partition_activations; zerospec's
    reader raises for the same config, naming the key."""
    with pytest.raises(AssertionError, match="only available with partitioned activations"):
        ds_checkpointing.configure(None, partition_activations=False,
                                   contiguous_checkpointing=True, num_checkpoints=2)
    ds = ds_config.parse({"train_micro_batch_size_per_gpu": 1, "activation_checkpointing": {
        "contiguous_memory_optimization": True}})
    with pytest.raises(ValueError, match="contiguous_memory_optimization"):
        config_kwargs(ds, 1, checkpoint_activations=1)


def test_without_an_mpu_deepspeed_partitions_over_one_rank_the_whole_checkpoint_on_the_host(
        ds_checkpointing):
    """Without model parallelism mp_size is 1: partition_activations() keeps the whole
    checkpoint, a copy of its own, on the host with cpu_checkpointing — what zerospec's P_a+cpu
    keeps at N_m = 1 (zero_r/partition.py)."""
    assert ds_checkpointing.mp_size == 1
    x = torch.randn(2, 3, 4)
    ds_checkpointing.CPU_CHECKPOINT = True
    part, = ds_checkpointing.partition_activations([x], True, False)
    assert part.device.type == "cpu" and part.numel() == x.numel()
    assert torch.equal(part, x.reshape(-1)) and part.data_ptr() != x.data_ptr()
