"""The run's mesh: the rank grid and every process group a run uses, from one object.

A :class:`Mesh` knows the N = N_d × N_m ranks (comm/groups.py's :class:`Grid`, MP inside a node),
their nodes (:class:`Nodes`), and which features add groups: hpZ's secondary partitions, MiCS's
partition and replication groups, qgZ's local and global all-to-all groups. ``group(name, rank)``
answers any rank's group by its ledger name, on every backend alike (the simulator, the ring
transport, meta and torch.distributed), and ``make`` creates every group in the backend once per
run: torch.distributed's ``new_group`` is collective, so every process makes every group, in the
one order :meth:`groups` lists; the other backends need nothing made.
"""
from __future__ import annotations

import dataclasses

from .groups import (Grid, Group, Nodes, global_group, hpz_group, hpz_groups, local_group,
                     mics_groups, qgz_groups, replica_group, shard_group)


@dataclasses.dataclass(frozen=True)
class Mesh:
    """``n_d`` × ``n_m`` ranks on nodes of ``gpus_per_node``; ``hpz`` > 1, ``shard_group`` and
    ``qgz`` add their groups (their features run over the data-parallel world, n_m = 1)."""

    n_d: int
    n_m: int = 1
    gpus_per_node: int | None = None
    hpz: int = 1
    shard_group: int | None = None
    qgz: bool = False

    @classmethod
    def of(cls, cfg) -> "Mesh":
        """The mesh of a TrainConfig (its ``mesh`` section, N_d and qgZ)."""
        return cls(cfg.n_d, cfg.n_m, cfg.gpus_per_node, cfg.hpz, cfg.shard_group, cfg.qgz)

    @property
    def grid(self) -> Grid:
        return Grid(self.n_d, self.n_m)

    @property
    def n_ranks(self) -> int:
        return self.n_d * self.n_m

    @property
    def nodes(self) -> Nodes:
        return Nodes(self.n_ranks, self.gpus_per_node)

    def group(self, name: str, rank: int) -> Group:
        """``rank``'s group named ``name`` (a ledger group name, comm/groups.py's GROUP_NAMES)."""
        n, g, p = self.n_ranks, self.nodes.per_node, self.shard_group
        if name in ("shard", "replica") and p is None:
            raise ValueError(f"group {name!r} is MiCS's: it needs shard_group, got None")
        make = {"world": lambda: Group("world", tuple(range(n))),
                "host": lambda: Group("host", (rank,)), "nvme": lambda: Group("nvme", (rank,)),
                "dp": lambda: self.grid.dp_group(rank), "mp": lambda: self.grid.mp_group(rank),
                "hpz": lambda: hpz_group(rank, self.hpz), "local": lambda: local_group(rank, g),
                "global": lambda: global_group(rank, g, n),
                "shard": lambda: shard_group(rank, p), "replica": lambda: replica_group(rank, p, n)}
        if name not in make:
            raise ValueError(f"unknown group {name!r}; accepted: {', '.join(make)}")
        return make[name]()

    def groups(self) -> list[Group]:
        """Every process group the run uses beyond the world, in one fixed order: the grid's DP
        and MP groups (N_m > 1), hpZ's partitions, MiCS's groups, qgZ's groups."""
        n = self.n_ranks
        return ((self.grid.groups() if self.n_m > 1 else [])
                + (hpz_groups(n, self.hpz) if self.hpz > 1 else [])
                + (mics_groups(n, self.shard_group) if self.shard_group is not None else [])
                + (qgz_groups(n, self.nodes.per_node) if self.qgz else []))

    def make(self, comm) -> None:
        """Create every group in ``comm``'s backend: every process calls this once, before its
        first collective (torch.distributed); a backend without ``new_groups`` needs none."""
        make = getattr(comm.backend, "new_groups", None)
        if make is not None:
            make(self.groups())
