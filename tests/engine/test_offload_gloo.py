"""ZeRO-Offload on real processes (gloo): the same bits as stages 2 and 3, the same books
(collectives and PCIe copies) as the simulator."""
from __future__ import annotations

import dataclasses

import pytest

from tests.support.runs import assert_same_training
from zerospec.model.gpt import ODD
from zerospec.training.config import TrainConfig
from zerospec.training.run import train, train_processes

BASE = TrainConfig(stage=2, n_d=4, model=ODD, steps=2, timeout=60)


@pytest.mark.slow
def test_offload_on_gloo_equals_its_stage_and_books_the_simulators_copies():
    """On 4 gloo processes: stage 2 and 3 with the optimizer offloaded (DeepSpeed's mode in
    stage 2, the paper's in stage 3) train bit-identically to the plain stages, and every rank's
    books — collectives and host-link copies: op, group, link, elements, phase — are the
    simulator's."""
    s3 = dataclasses.replace(BASE, stage=3)
    off2 = BASE.replace(offload_optimizer="cpu", offload_mode="deepspeed")
    off3 = s3.replace(offload_optimizer="cpu")
    plain2, plain3, o2, o3 = train_processes([BASE, s3, off2, off3])
    assert_same_training(plain2, o2)
    assert_same_training(plain3, o3)
    for proc, cfg in ((o2, off2), (o3, off3)):
        sim = train(cfg)
        books = [[(c.op, c.group, c.link, c.elements_sent, c.elements_recv, c.phase)
                  for c in led.records(r)] for led in (proc.comm, sim.comm) for r in range(4)]
        assert books[:4] == books[4:]
