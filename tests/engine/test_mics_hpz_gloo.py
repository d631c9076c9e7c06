"""MiCS with hpZ on real processes (gloo): MiCS's bits, the simulator's books."""
from __future__ import annotations

import pytest

from tests.support.runs import assert_same_training
from zerospec.model.gpt import ODD
from zerospec.training.config import TrainConfig
from zerospec.training.run import train, train_processes

# one partition group of p = 4 over 2 nodes × 2: forward's gathers cross, hpZ's h = 2 do not
MICS = TrainConfig.of(stage=3, n_d=4, model=ODD, steps=2, timeout=60, gpus_per_node=2,
                      shard_group=4)


@pytest.mark.slow
def test_mics_with_hpz_on_gloo_equals_mics_and_books_the_simulators_links():
    """On 4 gloo processes, MiCS's group spanning both nodes: hpZ (h = 2) trains MiCS's bits,
    and each rank's collectives are booked as on threads — op, group, link class, elements —
    with backward's all-gathers inside the node."""
    plain, ours = train_processes([MICS, MICS.replace(hpz=2)])
    assert_same_training(plain, ours)
    sim = train(MICS.replace(hpz=2))
    books = [[(c.op, c.group, c.link, c.elements_sent, c.phase) for c in led.records(r)]
             for led in (ours.comm, sim.comm) for r in range(4)]
    assert books[:4] == books[4:]
    assert {(c.group, c.link) for c in ours.comm.records(phase="backward", op="all_gather")} \
        == {("hpz", "intra")}
    assert plain.comm.elements(1, phase="backward", op="all_gather", link="inter") > 0
