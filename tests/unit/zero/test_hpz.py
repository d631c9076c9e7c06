"""hpZ (zerospec/zero/hpz.py) on every stage-3 path, and the inputs it refuses."""
from __future__ import annotations

import dataclasses

import pytest

from tests.support.runs import SCALER, assert_same_training
from zerospec.comm.groups import Nodes, hpz_group
from zerospec.model.gpt import ODD
from zerospec.training import checkpoint
from zerospec.training.config import TrainConfig
from zerospec.training.sections import MeshOptions
from zerospec.training.run import train

BASE = TrainConfig(stage=3, n_d=4, model=ODD, steps=2, mesh=MeshOptions(gpus_per_node=2))
PATHS = {"checkpointing": {"checkpoint_activations": 1},
         "accumulation": {"grad_accum_steps": 2},
         "clipping+loss-scale": {"clip_grad_norm": 0.5, "loss_scale": SCALER},
         "contiguous-gradients": {"contiguous_gradients": True},
         "reuse-distance": {"stage3_max_reuse_distance": 3000},
         "persistence": {"stage3_persistence_threshold": 100}}   # ln_f stays whole


@pytest.mark.parametrize("path", list(PATHS))
def test_hpz_is_bit_identical_to_stage3_on_every_path(path):
    """Checkpointing (its recompute gathers from the secondary shards), accumulation (exact fp64
    sums), clipping with loss scaling, M_D, DeepSpeed's reuse distance and persistence threshold:
    hpZ = stage 3, bit for bit."""
    cfg = BASE.replace(**PATHS[path])
    a, b = train(cfg), train(cfg.replace(hpz=2))
    assert_same_training(a, b)
    assert b.comm.elements(0, group="hpz") > 0      # hpZ really gathered in its partition


def test_a_checkpoint_resharded_from_4_to_8_ranks_continues_bit_identically(tmp_path):
    """Saved by a 2 × 2 hpZ run after step 1, continued on 2 × 4 with h = 4: the same bits as
    stage 3 continuing from the same files (exact sums make the continuation N-independent)."""
    cfg = BASE.replace(hpz=2, exact_grads=True)
    train(cfg, save={1: tmp_path / "ck"})
    m = BASE.replace(n_d=8, gpus_per_node=4, exact_grads=True, steps=3, global_batch=8)
    runs = [train(m.replace(hpz=h), resume=checkpoint.load(tmp_path / "ck", n_ranks=8))
            for h in (1, 4)]
    assert_same_training(*runs)


def test_secondary_partitions_are_consecutive_ranks_inside_a_node():
    """h = 2 on 2 nodes × 4: {0,1} {2,3} | {4,5} {6,7}; each inside one node."""
    nodes = Nodes(8, 4)
    groups = {hpz_group(r, 2).ranks for r in range(8)}
    assert groups == {(0, 1), (2, 3), (4, 5), (6, 7)}
    assert all(len({nodes.node(r) for r in g}) == 1 for g in groups)


@pytest.mark.parametrize("kw, named", [
    ({"hpz": 3, "gpus_per_node": 4, "n_d": 8}, r"hpz \(zero_hpz_partition_size\)=3 must divide the "
                                               r"GPUs per node \(4\).*accepted: 1, 2, 4"),
    ({"hpz": 3}, r"hpz \(zero_hpz_partition_size\)=3 must divide the GPUs per node \(2\)"),
    ({"hpz": 0}, r"hpz \(zero_hpz_partition_size\) must be an integer >= 1 \(1: off\), got 0"),
    ({"gpus_per_node": 3}, r"gpus_per_node must be an integer >= 1 that divides the 4 ranks.*"
                           r"got 3; accepted: 1, 2, 4"),
    ({"hpz": 2, "stage": 2}, r"hpz=2 is a ZeRO-3 setting.*got stage=2"),
])
def test_bad_nodes_or_hpz_are_refused_naming_the_value(kw, named):
    """An h that does not divide the GPUs per node, a node size that does not divide N, hpZ
    outside stage 3: ValueError naming the value and what is accepted."""
    with pytest.raises(ValueError, match=named):
        BASE.replace(**kw)
