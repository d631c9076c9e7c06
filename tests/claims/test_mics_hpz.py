"""MiCS with hpZ (spec/mics.md, spec/zeropp.md): when MiCS's partition group of p ranks spans
nodes, its backward all-gathers cross them; hpZ keeps a secondary 1/h shard of each gathered unit
over the h ranks of a node inside the group, and backward gathers from those instead. hpZ moves
bytes, never values: the pair trains MiCS's bits, backward sends nothing across nodes, and each
GPU holds 2Ψ_p/h more from forward to the end of backward (D2, D6 over p instead of N).

Runs: the ODD model (no unit divides by any N) on N = 8 as 4 nodes × 2 GPUs, p = 4 (two nodes per
partition group, two replicas), h = 2 (a node).
"""
from __future__ import annotations

import functools
from collections import Counter
from fractions import Fraction

import pytest

from tests.support.runs import assert_same_training
from zerospec.cluster.threads import VirtualCluster
from zerospec.model.gpt import ODD, GPTConfig
from zerospec.training.config import TrainConfig
from zerospec.training.run import train
from zerospec.training.scale import measure

N, G, P, H = 8, 2, 4, 2
BASE = TrainConfig.of(stage=3, n_d=N, model=ODD, steps=2, gpus_per_node=G, shard_group=P)
PATHS = {"plain": {}, "accumulation": {"grad_accum_steps": 2},
         "checkpointing": {"checkpoint_activations": 1}}


@functools.lru_cache(maxsize=None)
def wired(hpz: int, steps: int = 1, transport: str = "ring", observe: bool = False, **kw):
    """(cluster, Result): MiCS (p = 4) on 4 nodes × 2, with hpZ of ``hpz`` (1: off)."""
    cluster = VirtualCluster(N, transport=transport, gpus_per_node=G, observe=observe)
    cfg = BASE.replace(hpz=hpz, steps=steps, **kw)
    return cluster, train(cfg, cluster=cluster)


def psi_padded_for(p: int) -> int:
    """Ψ_p: every unit of ODD padded to a multiple of p by hand (the stage pads for its group)."""
    return sum(-(-u.numel // p) * p for u in ODD.units(1))


@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.slow) if p != "plain" else p
                                  for p in PATHS])
def test_mics_with_hpz_trains_bit_identically_to_mics_alone(path):
    """A secondary shard holds the bits forward gathered, so backward's gather over h returns
    what MiCS's over p would: losses and master weights equal MiCS's bit for bit (rounded means;
    with accumulation the exact fp64 sums; with checkpointing the recompute gathers too)."""
    kw = tuple(PATHS[path].items())
    got = wired(H, steps=2, transport="direct", observe=True, **dict(kw))[1]
    assert_same_training(got, wired(1, steps=2, transport="direct", observe=True, **dict(kw))[1])
    assert got.comm.elements(0, phase="backward", op="all_gather", group="hpz") > 0


def test_backward_gathers_every_unit_mics_gathers_inside_the_node_and_nothing_across():
    """Each of MiCS's backward all-gathers (over its p = 4 ranks, two nodes) is, with hpZ, the
    same unit gathered over the node's h = 2 ranks: a ring over h sends numel·(h−1)/h per rank,
    every hop intra; forward and the gradient hops are MiCS's. On the ring's wire, classed by each
    hop's two ends, what leaves every node is MiCS's less exactly its backward all-gathers."""
    cluster, r = wired(H)
    base_cluster, base = wired(1)
    led, base_led = cluster.comm_ledger, base_cluster.comm_ledger
    for k in range(N):
        theirs = base_led.records(k, phase="backward", op="all_gather")
        ours = led.records(k, phase="backward", op="all_gather")
        assert {(c.group, c.group_size) for c in theirs} == {("shard", P)}
        assert [(c.group, c.group_size, c.link) for c in ours] == [("hpz", H, "intra")] * len(theirs)
        assert [c.numel for c in ours] == [c.numel for c in theirs]
        assert [c.elements_sent for c in ours] == [c.numel * (H - 1) // H for c in theirs]
        assert [(c.op, c.group, c.numel, c.elements_sent) for c in led.records(k)
                if c.phase != "backward" or c.op != "all_gather"] == [
            (c.op, c.group, c.numel, c.elements_sent) for c in base_led.records(k)
            if c.phase != "backward" or c.op != "all_gather"]
    wire = Counter()
    for rec in cluster.wire.records:
        for (src, dst), e in rec.elements.items():
            wire[src, rec.op, "intra" if src // G == dst // G else "inter"] += e
    booked = Counter()
    for c in led.records():
        if c.elements_sent:
            booked[c.rank, c.op, c.link] += c.elements_sent
    assert booked == wire
    for node in range(N // G):
        crossed = base_led.crossing(node, phase="backward", op="all_gather")
        assert crossed > 0                    # the case is not trivial: MiCS's group spans nodes
        assert cluster.wire.leaving(node) == base_cluster.wire.leaving(node) - crossed
        assert led.crossing(node, phase="backward", op="all_gather") == 0


def test_each_gpu_holds_2psi_p_over_h_more_from_forward_to_the_end_of_backward():
    """The secondary shards: 1/h of every unit padded for p, fp16 — 2Ψ_p/h bytes per GPU (D6's
    2Ψ/h, with MiCS's padding for p) — at every phase's start the observer sees exactly that
    more than MiCS alone when backward begins, and nothing more after it."""
    cluster, r = wired(H, steps=2, transport="direct", observe=True)   # the bit test's runs
    base = wired(1, steps=2, transport="direct", observe=True)[0].observed
    extra = Fraction(2 * psi_padded_for(P), H)
    assert extra.denominator == 1 and psi_padded_for(P) != psi_padded_for(H)   # p's padding counts
    for k in range(N):
        ours = cluster.observed[k].entries
        diff = {label: ours[label].bytes - base[k].entries[label].bytes for label in ours}
        assert {label: d for label, d in diff.items() if d} == {"backward@1": extra,
                                                                "backward@2": extra}
        assert r.memory[k].peak["secondary16"] == extra
        assert r.memory[k].current["secondary16"] == 0


@pytest.mark.slow
def test_on_meta_the_representatives_hold_and_send_what_the_threads_do():
    """measure(): MiCS's first partition group stands for every replica; with hpZ its ranks'
    secondary shards (2Ψ_p/h) and in-node backward gathers are those of the thread run, and no
    rank's backward all-gather crosses a node."""
    cfg = BASE.replace(hpz=H)
    meta, threads = measure(cfg), wired(H)[1]
    extra = 2 * psi_padded_for(P) // H
    led = meta.comm_ledger()
    for k in range(N):
        assert meta.memory(k).peak["secondary16"] == extra
        assert led.elements(k, phase="backward", op="all_gather", link="inter") == 0
        assert [(c.op, c.group, c.numel, c.elements_sent, c.link) for c in led.records(k)] == [
            (c.op, c.group, c.numel, c.elements_sent, c.link) for c in threads.comm.records(k)]


@pytest.mark.parametrize("kw, named", [
    ({"n_d": 8, "gpus_per_node": 4, "shard_group": 2, "hpz": 4},
     r"hpz \(zero_hpz_partition_size\)=4 with shard_group \(mics_shard_size\)=2: .* "
     r"h must divide p; accepted hpz: 1, 2$"),
    ({"n_d": 12, "gpus_per_node": 4, "shard_group": 6, "hpz": 4},
     r"hpz \(zero_hpz_partition_size\)=4 with shard_group \(mics_shard_size\)=6: .* "
     r"h must divide p; accepted hpz: 1, 2$")])
def test_an_h_that_does_not_divide_p_is_refused_naming_both(kw, named):
    """hpZ's secondary partition is a split of MiCS's partition group: an h that does not divide
    p has no layout; ValueError naming h, p and the h that would do."""
    with pytest.raises(ValueError, match=named):
        TrainConfig.of(stage=3, model=ODD, **kw)


@pytest.mark.slow
def test_the_fsdp2_flavours_hsdp_with_an_integer_reshard_after_forward_trains_as_hsdp():
    """FSDP2's own form of the pair: HSDP's shard dimension of p = 4 with reshard_after_forward
    = h = 2 (a factor of it, _fsdp_init.py: _get_post_forward_mesh_info): backward gathers over
    the node's h ranks from the post-forward shards, bit for bit HSDP alone."""
    cfg = BASE.replace(flavour="fsdp2", precision="bf16")
    got = train(cfg.replace(hpz=H))
    assert_same_training(got, train(cfg))
    assert {(c.group, c.group_size, c.link) for c in got.comm.records(
        phase="backward", op="all_gather")} == {("hpz", H, "intra")}


@pytest.mark.slow
def test_with_model_parallelism_the_groups_lie_in_each_mp_indexs_dp_group():
    """N_m = 2 on 2 nodes × 4 GPUs (2 DP ranks per node), p = 4 DP ranks over both nodes, h = 2:
    every backward all-gather is hpZ's inside the node, and the run is MiCS's bit for bit."""
    m = GPTConfig(vocab_size=37, block_size=12, n_layer=2, n_head=4, n_embd=16)   # 2 | heads
    cfg = TrainConfig.of(stage=3, n_d=4, n_m=2, model=m, steps=2, gpus_per_node=4, shard_group=4)
    got = train(cfg.replace(hpz=2))
    assert_same_training(got, train(cfg))
    assert {(c.group, c.group_size, c.link) for c in got.comm.records(
        phase="backward", op="all_gather")} == {("hpz", 2, "intra")}
