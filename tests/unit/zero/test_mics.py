"""MiCS / HSDP (zerospec/zero/mics.py): its groups, its two-hop mean against the derived bound,
the stage-3 paths it keeps bit-identical, and the inputs it refuses."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.support.runs import SCALER, assert_same_training
from zerospec.cluster.threads import VirtualCluster
from zerospec.comm.groups import Nodes, mics_groups, replica_group, shard_group
from zerospec.model.gpt import ODD
from zerospec.training.config import TrainConfig
from zerospec.training.sections import MeshOptions
from zerospec.training.run import train

U16, U32 = 2.0 ** -11, 2.0 ** -24   # unit roundoff of fp16 and fp32
FP16_SUBNORMAL_HALF_ULP = 2.0 ** -25
BASE = TrainConfig(stage=3, n_d=4, model=ODD, steps=2, mesh=MeshOptions(gpus_per_node=2))


def gamma(k: int, u: float) -> float:
    return k * u / (1 - k * u)


def test_partition_groups_are_nodes_and_replication_groups_cross_them():
    """p = G: each partition group is one node's GPUs; each replication group takes one GPU of
    every node; together they tile the ranks twice, in the order torch.distributed makes them."""
    nodes = Nodes(8, 4)
    assert [shard_group(r, 4).ranks for r in (0, 5)] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert all({nodes.node(k) for k in shard_group(r, 4).ranks} == {nodes.node(r)} for r in range(8))
    assert [replica_group(r, 4, 8).ranks for r in (0, 6)] == [(0, 4), (2, 6)]
    assert [g.name for g in mics_groups(8, 4)] == ["shard"] * 2 + ["replica"] * 4


@pytest.mark.parametrize("n,p", [(4, 2), (8, 2), (8, 4)])
def test_the_two_hop_fp16_mean_stays_within_its_derived_bound(n, p):
    """Hop 1 (reduce-scatter over p: an fp32 sum, /p, one fp16 rounding) and hop 2 (all-reduce over
    R = n/p of the rounded means: the same again) err from the exact mean by at most
    E1 + γ_R(B + E1) + u16(|mean| + E1 + γ_R(B + E1)) + h, E1 = (1+u16)γ_p·A/n + u16·B + h,
    A = Σ_r|x_r|, B = Σ_j|S_j| / n over the groups' exact sums S_j (spec/mics.md); the flat mean
    within (1+u16)γ_n·A/n + u16|mean| + h (tests/unit/comm/test_ring.py). Two roundings against
    one: the results differ."""
    g = torch.Generator().manual_seed(n + p)
    xs = [torch.randn(1000, generator=g).to(torch.float16) for _ in range(n)]
    exact = torch.stack([x.double() for x in xs]).sum(0) / n
    a = torch.stack([x.double().abs() for x in xs]).sum(0) / n
    b = sum((torch.stack([x.double() for x in xs[j:j + p]]).sum(0)).abs()
            for j in range(0, n, p)) / n
    r, h = n // p, FP16_SUBNORMAL_HALF_ULP

    def two_hops(ctx):
        c = 1000 // p
        out = torch.empty(c, dtype=torch.float16)
        ctx.comm.subgroup(shard_group(ctx.rank, p)).reduce_scatter(out, xs[ctx.rank].clone(), "mean")
        ctx.comm.subgroup(replica_group(ctx.rank, p, n)).all_reduce(out, "mean")
        return out
    outs = VirtualCluster(n).run(two_hops)
    mics = torch.cat(outs[:p]).double()
    assert all(torch.equal(outs[k], outs[k % p]) for k in range(n))   # replicas agree
    flat = VirtualCluster(n).run(lambda ctx: ctx.comm.all_reduce(xs[ctx.rank].clone(), "mean"))[0]
    e1 = (1 + U16) * gamma(p, U32) * a + U16 * b + h
    hop2 = gamma(r, U32) * (b + e1)
    assert ((mics - exact).abs() <= e1 + hop2 + U16 * (exact.abs() + e1 + hop2) + h).all()
    assert ((flat.double() - exact).abs()
            <= (1 + U16) * gamma(n, U32) * a + U16 * exact.abs() + h).all()
    assert not torch.equal(mics, flat.double())


def test_a_partition_group_of_every_rank_is_the_flat_stage_bit_for_bit():
    """p = N: one group, replicas of one rank, no second hop: the same sums in the same order as
    stage 3, rounded means included."""
    assert_same_training(train(BASE), train(BASE.replace(shard_group=4)))


PATHS = {"checkpointing": {"checkpoint_activations": 1},
         "clipping+loss-scale": {"clip_grad_norm": 0.5, "loss_scale": SCALER},
         "contiguous-checkpoints": {"checkpoint_activations": 1, "contiguous_checkpoints": True}}


@pytest.mark.parametrize("path", list(PATHS))
def test_with_exact_sums_mics_equals_stage3_on_every_path(path):
    """Checkpointing, clipping with loss scaling (the norm and the overflow vote over the
    partition group see the replicated mean), M_D: MiCS (p = 2) = stage 3 at N = 4, bit for bit."""
    cfg = BASE.replace(exact_grads=True, **PATHS[path])
    assert_same_training(train(cfg), train(cfg.replace(shard_group=2)))


@pytest.mark.parametrize("p", [3, 0, 8, "2"])
def test_a_partition_group_that_does_not_divide_n_d_is_refused_naming_the_accepted(p):
    """p must divide N_d: the error names the value and the accepted sizes."""
    with pytest.raises(ValueError, match=rf"shard_group \(MiCS's partition group size p\)={p!r} "
                                         r"must be an integer that divides the 4 data-parallel "
                                         r"ranks; accepted: 1, 2, 4"):
        BASE.replace(shard_group=p)


def test_mics_without_a_sharded_stage_is_refused():
    """Stage 0 shards nothing (hpZ beside MiCS: the combination table's refusal,
    tests/claims/test_combine.py)."""
    with pytest.raises(ValueError, match="shard_group=2 shards the model states of stage 1, 2 or 3"):
        BASE.replace(shard_group=2, stage=0)


def test_qgz_over_a_partition_group_that_is_not_whole_nodes_is_refused():
    """qgZ's hops are inside and across the partition group's nodes: p = 2 on nodes of 4 GPUs
    has no such nodes; the error names p, the GPUs per node and what is accepted."""
    cfg = TrainConfig.of(stage=3, n_d=8, model=ODD, gpus_per_node=4, qgz=True)
    with pytest.raises(ValueError, match="shard_group=2 with qgz: .* gpus_per_node=4; accepted: a "
                                         "multiple of 4 dividing 8"):
        cfg.replace(shard_group=2)


@pytest.mark.parametrize("stage", [1, 3])
def test_a_mics_run_saved_and_resumed_continues_bit_for_bit(stage, tmp_path):
    """The first partition group writes the shards (the replicas hold the same ones): a run saved
    after step 1 and resumed to step 2 has the uninterrupted run's loss and masters, bit for bit;
    the run's final state assembles from the pieces, each element once, to the run's masters."""
    from zerospec.training import checkpoint
    cfg = BASE.replace(stage=stage, shard_group=2)
    whole = train(cfg, keep_state=True)
    train(dataclasses.replace(cfg, steps=1), save={1: tmp_path / "ck"})
    rest = train(cfg, resume=checkpoint.load(tmp_path / "ck", n_ranks=4))
    assert rest.losses == whole.losses[1:]
    assert all(torch.equal(rest.master[k], whole.master[k]) for k in whole.master)
    for t, u in zip(whole.state().tensors["master"], whole.units):
        assert torch.equal(t, torch.cat([whole.master[f"{u.name}/{p}"].reshape(-1)
                                         for p in u.names]))
