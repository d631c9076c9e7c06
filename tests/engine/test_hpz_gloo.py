"""hpZ on real processes (gloo): the same bits as without it (stage 3, or MiCS with one partition
group spanning both nodes), the same books as the simulator, backward's gathers inside the node."""
from __future__ import annotations

import pytest

from tests.support.runs import assert_same_training
from zerospec.model.gpt import ODD
from zerospec.training.config import TrainConfig
from zerospec.training.run import train, train_processes

BASE = TrainConfig.of(stage=3, n_d=4, model=ODD, steps=2, timeout=60, gpus_per_node=2)
# MiCS: one partition group of p = 4 over 2 nodes × 2: forward's gathers cross, hpZ's h = 2 do not
MICS = BASE.replace(shard_group=4)


@pytest.mark.slow
@pytest.mark.parametrize("base", [BASE, MICS], ids=["stage3", "mics"])
def test_hpz_on_gloo_equals_the_run_without_and_books_the_simulators_links(base):
    """On 4 gloo processes (2 nodes × 2): hpZ (h = 2) trains bit-identically to the run without
    it, and each rank's collectives are booked as on threads — op, group, link class, elements,
    phase — with backward's all-gathers in hpZ's group, inside the node."""
    plain, hpz = train_processes([base, base.replace(hpz=2)])
    assert_same_training(plain, hpz)
    sim = train(base.replace(hpz=2))
    books = [[(c.op, c.group, c.link, c.elements_sent, c.phase) for c in led.records(r)]
             for led in (hpz.comm, sim.comm) for r in range(4)]
    assert books[:4] == books[4:]
    assert {(c.group, c.link) for c in hpz.comm.records(phase="backward", op="all_gather")} \
        == {("hpz", "intra")}
    assert plain.comm.elements(1, phase="backward", op="all_gather", link="inter") > 0
