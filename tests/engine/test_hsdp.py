"""FSDP2's HSDP as MiCS's peer, and FSDP2's integer reshard_after_forward as hpZ's, on gloo
(zerospec/testing/hsdp_peer.py, spec/mics.md).

Tolerances, derived as for the torch peers (tests/engine/test_peers.py, spec/engine.md):

* **HSDP at N = 4 as 2 × 2, G = 1, given zerospec's Adam arithmetic → equal bits.** Every gradient
  sum has two terms (two ranks in a shard group, then two replicas), and a two-term sum has one
  order; FSDP2 divides before or between the sums, zerospec after each, by 2 each time — dividing
  by a power of two is exact. Nothing may differ.
* **HSDP with G = 2 micro-steps against zerospec's G = 1 on the same global batch** (zerospec
  accumulates exactly only in fp16), **and hpZ against reshard_after_forward=2** (four-term sums,
  zerospec in rank order, gloo in its own): losses to 1e-6 relative, weights to lr/10 after every
  step, the bounds of test_peers.py.
"""
from __future__ import annotations

import dataclasses
import functools
from collections import Counter

import pytest

from tests.engine.test_peers import assert_close_every_step, assert_equal_every_step
from tests.support.runs import assert_same_training
from zerospec.model.gpt import ODD
from zerospec.testing.hsdp_peer import compare
from zerospec.training.config import TrainConfig
from zerospec.training.sections import BatchOptions, MeshOptions, OptimOptions
from zerospec.training.run import train, train_processes

CFG = TrainConfig(stage=3, n_d=4, model=ODD, steps=3, timeout=120,
                  optim=OptimOptions(precision="fp32"),
                  mesh=MeshOptions(gpus_per_node=2, shard_group=2))
PEERS = {"hsdp": {"shard_group": 2},
         "hsdp-G2": {"shard_group": 2, "accum": 2},
         "hsdp-G2-all-reduce-every-micro-step": {"shard_group": 2, "accum": 2,
                                                  "all_reduce_at_boundary": False}}


@functools.lru_cache(maxsize=None)
def hsdp():
    return compare(CFG, PEERS)


def totals(counts: dict) -> Counter:
    """Collectives per op over a step's phases."""
    return sum((Counter(c) for c in counts.values()), Counter())


@pytest.mark.slow
def test_hsdp_with_our_adam_arithmetic_equals_mics_bit_for_bit():
    """2 × 2, G = 1: FSDP2 fully_shard on a (replicate, shard) mesh trains MiCS's bits, every
    step (module docstring)."""
    row = hsdp()
    assert_equal_every_step(row, row["peers"]["hsdp"])


@pytest.mark.slow
def test_hsdp_issues_mics_collectives_per_step():
    """Per step, the same collectives by kind as zerospec's ledger: 2U all-gathers and U
    reduce-scatters inside the shard group, U all-reduces across replicas (U = 4 units); the
    all-gathers split 5/3 vs 4/4 between forward and backward (spec/engine.md: the tied
    embedding)."""
    row, units = hsdp(), len(CFG.units())
    ours = Counter(r.op for r in row["records"][0] if r.step == CFG.steps)
    assert ours == totals(row["peers"]["hsdp"]["counts"]) == {
        "all_gather": 2 * units, "reduce_scatter": units, "all_reduce": units}
    groups = {(r.op, r.group) for r in row["records"][0]}
    assert groups == {("all_gather", "shard"), ("reduce_scatter", "shard"), ("all_reduce", "replica")}


@pytest.mark.slow
def test_with_accumulation_hsdp_all_reduces_at_the_boundary_only_when_told():
    """G = 2: FSDP2 reduce-scatters every micro-step; with set_requires_all_reduce(False) on the
    first it all-reduces once per unit per step, as MiCS (zerospec's ledger, threads, G = 2);
    without, at every micro-step. Both train MiCS's weights at G = 1 on the same global batch
    within the derived tolerance."""
    row, units = hsdp(), len(CFG.units())
    boundary = row["peers"]["hsdp-G2"]
    every = row["peers"]["hsdp-G2-all-reduce-every-micro-step"]
    mics = train(CFG.replace(precision="fp16", grad_accum_steps=2, steps=1))
    ours = Counter(r.op for r in mics.comm.records(0))
    assert ours == totals(boundary["counts"]) == {
        "all_gather": 2 * 2 * units, "reduce_scatter": 2 * units, "all_reduce": units}
    assert totals(every["counts"])["all_reduce"] == 2 * units
    for peer in (boundary, every):
        assert_close_every_step(row, peer, CFG.adam.lr)


@pytest.mark.slow
def test_reshard_after_forward_2_is_hpz_with_h_2():
    """FSDP2's integer reshard_after_forward=2 on 4 ranks keeps a 1/2 shard after forward, as
    hpZ (h = 2) does: the same collectives by kind, weights within the derived tolerance."""
    cfg = CFG.replace(shard_group=None, hpz=2)
    row = compare(cfg, {"reshard-2": {"reshard_after_forward": 2}})
    peer = row["peers"]["reshard-2"]
    assert_close_every_step(row, peer, cfg.adam.lr)
    ours = Counter(r.op for r in row["records"][0] if r.step == cfg.steps)
    assert ours == totals(peer["counts"])
    assert {r.group for r in row["records"][0] if r.phase == "backward" and r.op == "all_gather"} \
        == {"hpz"}


@pytest.mark.slow
def test_mics_on_gloo_equals_stage3_with_exact_sums_and_books_the_simulators_links():
    """On 4 gloo processes (2 nodes × 2), exact sums, G = 2: MiCS (p = 2) trains stage 3's bits,
    and each rank's collectives are booked as on threads — op, group, link class, elements."""
    base = TrainConfig(stage=3, n_d=4, model=ODD, steps=2, timeout=60,
                       batching=BatchOptions(grad_accum_steps=2), mesh=MeshOptions(gpus_per_node=2))
    mics = base.replace(shard_group=2)
    plain, ours = train_processes([base, mics])
    assert_same_training(plain, ours)
    sim = train(mics)
    books = [[(c.op, c.group, c.link, c.elements_sent, c.phase) for c in led.records(r)]
             for led in (ours.comm, sim.comm) for r in range(4)]
    assert books[:4] == books[4:]
    assert {(c.op, c.link) for c in ours.comm.records() if c.group == "replica"} == {
        ("all_reduce", "inter")}
