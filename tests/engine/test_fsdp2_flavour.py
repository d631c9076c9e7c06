"""Stage 3's FSDP2 flavour against ``fully_shard`` as torchtitan applies it, on gloo
(zerospec/testing/fsdp2_peer.py, spec/fsdp2.md).

Tolerance, derived as for the torch peers (tests/engine/test_peers.py): **N = 2, bf16 compute,
fp32 reduce, zerospec's Adam arithmetic → equal bits.** Both sides compute in bf16 with the same
kernels on the same bf16 parameters (each the round-to-nearest cast of the same fp32 shard);
each gradient is cast exactly to fp32, and a two-term fp32 sum has one order; dividing by 2
before or after it is exact; Adam is elementwise on the same fp32 shards. Nothing may differ.
Marked ``slow``: two gloo processes cost ~10 s.
"""
from __future__ import annotations

import functools

import pytest

from tests.engine.test_peers import assert_equal_every_step
from zerospec.model.gpt import ODD
from zerospec.testing.fsdp2_peer import compare
from zerospec.training.config import TrainConfig

pytestmark = pytest.mark.slow

CFG = TrainConfig.of(stage=3, n_d=2, model=ODD, steps=3, timeout=120, precision="bf16",
                     flavour="fsdp2")


@functools.lru_cache(maxsize=None)
def _row() -> dict:
    return compare(CFG)


def test_the_flavour_trains_as_fully_shard_with_bf16_params_and_fp32_reduce_bit_for_bit():
    """Losses and every fp32 weight after every step equal FSDP2's (module docstring)."""
    row = _row()
    assert_equal_every_step(row["zerospec"], row["peer"])


def test_the_comparison_is_not_vacuous():
    """The weights move every step and the bf16 losses differ from step to step."""
    row = _row()
    w = row["zerospec"]["weights"]
    assert len(w) == CFG.steps and all(any((a[k] != b[k]).any() for k in a)
                                       for a, b in zip(w, w[1:]))
    assert len(set(row["zerospec"]["losses"])) == CFG.steps
