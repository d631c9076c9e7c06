"""qwZ and qgZ on real processes (gloo): int8 all-gathers and gloo's all_to_all_single give the
simulator's bits and books."""
from __future__ import annotations

import pytest

from tests.support.runs import assert_same_training
from zerospec.model.gpt import ODD
from zerospec.training.config import TrainConfig
from zerospec.training.sections import MeshOptions, QuantOptions
from zerospec.training.run import train, train_processes

CFG = TrainConfig(stage=3, n_d=4, model=ODD, steps=2, timeout=60,
                  mesh=MeshOptions(gpus_per_node=2, hpz=2), quant=QuantOptions(qwz=True, qgz=True))


@pytest.mark.slow
def test_qwz_qgz_on_gloo_equal_the_simulator_bit_for_bit_and_in_its_books():
    """On 4 gloo processes (2 nodes × 2) with hpZ, qwZ and qgZ: the same losses and master weights
    as on threads, and each rank's collectives booked alike — op, group, dtype, link, bytes."""
    gloo, sim = train_processes(CFG), train(CFG)
    assert_same_training(gloo, sim)
    books = [[(c.op, c.group, c.dtype, c.link, c.bytes_sent, c.phase) for c in led.records(r)]
             for led in (gloo.comm, sim.comm) for r in range(4)]
    assert books[:4] == books[4:]
    assert {c.group for c in gloo.comm.records(op="all_to_all")} == {"local", "global"}
