"""hpZ on real processes (gloo): the same bits as stage 3, the same books as the simulator."""
from __future__ import annotations

import dataclasses

import pytest

from tests.support.runs import assert_same_training
from zerospec.model.gpt import ODD
from zerospec.training.config import TrainConfig
from zerospec.training.sections import MeshOptions
from zerospec.training.run import train, train_processes

BASE = TrainConfig(stage=3, n_d=4, model=ODD, steps=2, timeout=60,
                   mesh=MeshOptions(gpus_per_node=2))


@pytest.mark.slow
def test_hpz_on_gloo_equals_stage3_and_books_the_simulators_links():
    """On 4 gloo processes (2 nodes × 2): hpZ (h = 2) trains bit-identically to stage 3, and each
    rank's collectives are booked as on threads — op, group, link class, elements."""
    plain, hpz = train_processes([BASE, BASE.replace(hpz=2)])
    assert_same_training(plain, hpz)
    sim = train(BASE.replace(hpz=2))
    books = [[(c.op, c.group, c.link, c.elements_sent, c.phase) for c in led.records(r)]
             for led in (hpz.comm, sim.comm) for r in range(4)]
    assert books[:4] == books[4:]
    assert hpz.comm.elements(0, phase="backward", op="all_gather", link="inter") == 0
    assert hpz.comm.elements(1, phase="backward", op="all_gather", group="hpz") > 0
