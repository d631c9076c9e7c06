"""The run's mesh (comm/mesh.py): every group of a run from one object, made once, in one order."""
from __future__ import annotations

import pytest

from zerospec.comm.groups import Group
from zerospec.comm.mesh import Mesh
from zerospec.model.gpt import ODD, GPTConfig
from zerospec.training.config import TrainConfig


class _Recording:
    """A backend that, like torch.distributed, is told every group to make."""

    def __init__(self):
        self.made = []

    def new_groups(self, groups):
        self.made.append(list(groups))


class _Comm:
    def __init__(self, backend):
        self.backend = backend


def test_each_named_group_is_the_ranks_its_feature_uses():
    """8 ranks on nodes of 4: hpZ pairs, MiCS's blocks and strides, qgZ's node and its stride
    inside the partition group the stage sees (one node: the rank alone)."""
    m = Mesh(8, gpus_per_node=4, hpz=2, shard_group=4, qgz=True)
    got = {name: m.group(name, 5).ranks for name in
           ("world", "dp", "host", "hpz", "shard", "replica", "local", "global")}
    assert got == {"world": tuple(range(8)), "dp": tuple(range(8)), "host": (5,), "hpz": (4, 5),
                   "shard": (4, 5, 6, 7), "replica": (1, 5), "local": (4, 5, 6, 7),
                   "global": (5,)}
    g = Mesh(3, 2)
    assert (g.group("dp", 3), g.group("mp", 3)) == (Group("dp", (1, 3, 5)), Group("mp", (2, 3)))


def test_make_creates_every_group_of_the_run_once_in_one_order():
    """Grid (N_m > 1), then hpZ, MiCS, qgZ; nothing beyond the world for a plain run."""
    rec = _Recording()
    Mesh(4, gpus_per_node=2, hpz=2, qgz=True).make(_Comm(rec))
    Mesh(4).make(_Comm(rec))
    Mesh(2, 2).make(_Comm(rec))
    hpz_qgz, plain, grid = rec.made
    assert [(g.name, g.ranks) for g in hpz_qgz] == [
        ("hpz", (0, 1)), ("hpz", (2, 3)), ("local", (0, 1)), ("local", (2, 3)),
        ("global", (0, 2)), ("global", (1, 3))]
    assert plain == []
    assert [(g.name, g.ranks) for g in grid] == [("dp", (0, 2)), ("dp", (1, 3)), ("mp", (0, 1)),
                                                  ("mp", (2, 3))]
    Mesh(4).make(_Comm(object()))          # a backend without new_groups needs nothing


def test_the_mesh_of_a_config_is_its_mesh_section_and_qgz():
    cfg = TrainConfig.of(stage=3, n_d=8, model=ODD, gpus_per_node=4, hpz=2, qgz=True)
    assert Mesh.of(cfg) == Mesh(8, 1, 4, 2, None, True)


def test_a_group_the_mesh_does_not_have_is_refused_naming_it():
    with pytest.raises(ValueError, match="group 'shard' is MiCS's: it needs shard_group"):
        Mesh(4).group("shard", 0)
    with pytest.raises(ValueError, match="unknown group 'rows'"):
        Mesh(4).group("rows", 0)


def test_a_run_makes_its_mesh_once_per_rank_before_the_stage(monkeypatch):
    """train() on 4 ranks with hpZ: each rank makes the config's mesh once (not per feature)."""
    from zerospec.training.run import train
    calls = []
    real = Mesh.make
    monkeypatch.setattr(Mesh, "make", lambda self, comm: (calls.append(self), real(self, comm)))
    cfg = TrainConfig.of(stage=3, n_d=4, model=ODD, steps=1, gpus_per_node=2, hpz=2)
    train(cfg)
    assert calls == [Mesh.of(cfg)] * 4


TINY = dict(stage=3, steps=1, model=GPTConfig(vocab_size=37, block_size=12, n_layer=2, n_head=4,
                                              n_embd=16))


@pytest.mark.parametrize("kw", [
    dict(n_d=4, n_m=2, gpus_per_node=4, hpz=2),
    dict(n_d=4, n_m=2, shard_group=2, gpus_per_node=4, qgz=True),
    pytest.param(dict(n_d=4, n_m=2, gpus_per_node=4, qgz=True), marks=pytest.mark.slow),
    pytest.param(dict(n_d=4, shard_group=2, gpus_per_node=2, qgz=True), marks=pytest.mark.slow),
    pytest.param(dict(n_d=4, gpus_per_node=2, hpz=2, qgz=True), marks=pytest.mark.slow)],
    ids=["hpz-mp", "mics-qgz-mp", "qgz-mp", "mics-qgz", "hpz-qgz"])
def test_the_groups_a_run_uses_are_the_groups_its_mesh_makes(monkeypatch, kw):
    """With MP, MiCS, hpZ and qgZ: every group a rank asks its interconnect for (its DP and MP
    groups, the features' groups inside them) is one the mesh made, by name and ranks, and the
    mesh made none that no rank used (torch.distributed would create it for nothing)."""
    from zerospec.comm.interconnect import Interconnect
    from zerospec.training.run import train
    used, real = set(), Interconnect.subgroup
    monkeypatch.setattr(Interconnect, "subgroup",
                        lambda self, g: used.add((g.name, g.ranks)) or real(self, g))
    cfg = TrainConfig.of(**TINY, **kw)
    train(cfg)
    assert used == {(g.name, g.ranks) for g in Mesh.of(cfg).groups()}
