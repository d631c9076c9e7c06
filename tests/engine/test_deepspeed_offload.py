"""DeepSpeed's ZeRO-Offload as a peer: zerospec's offloaded stages 2 and 3 against DeepSpeed
ZeRO-2/3 with ``offload_optimizer: {device: cpu}``, equal bits.

As in tests/engine/test_deepspeed.py (marked ``deepspeed``, skipped without DeepSpeed): fp32, N = 2,
DeepSpeed driving zerospec's Adam arithmetic as its client optimizer (``zero_force_ds_cpu_optimizer:
false``: DeepSpeedCPUAdam's fused arithmetic would round differently), so only the engines differ:
a two-term sum has one order, and an elementwise Adam on a partition — on the host or not —
equals the whole-vector one. zerospec runs in DeepSpeed's mode (fp32 gradients down; in fp32 the
host keeps the fp32 master copy, as DeepSpeed's offload does).
"""
from __future__ import annotations

import pytest

from tests.engine.test_deepspeed import MISSING
from tests.engine.test_peers import assert_equal_every_step
from zerospec.model.gpt import ODD
from zerospec.training.config import TrainConfig

pytestmark = [pytest.mark.deepspeed, pytest.mark.skipif(MISSING is not None, reason=MISSING or "")]

RUN = ("zerospec", "offload")


@pytest.fixture(scope="module")
def offloaded():
    from zerospec.testing.deepspeed_peer import compare
    cfg = TrainConfig(stage=2, n_d=2, model=ODD, steps=3, precision="fp32", timeout=300,
                      offload_optimizer="cpu", offload_mode="deepspeed")
    return compare(cfg, stages=(2, 3), runs=(RUN,))


@pytest.mark.parametrize("k", [0, 1], ids=["P_os+g-vs-ZeRO-2-Offload", "P_os+g+p-vs-ZeRO-3-Offload"])
def test_deepspeeds_offload_equals_ours_bit_for_bit(offloaded, k):
    """Every step's loss and every weight after every step: DeepSpeed's ZeRO-Offload and
    zerospec's, stage 2 and stage 3, equal bit for bit."""
    row = offloaded[k]
    assert len(row["losses"]) == 3
    assert_equal_every_step(row, row["deepspeed"][RUN])
