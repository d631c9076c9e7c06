"""The run's mesh: the rank grid and every process group a run uses, from one object.

A :class:`Mesh` knows the N = N_d × N_m ranks (comm/groups.py's :class:`Grid`, MP inside a node),
their nodes (:class:`Nodes`), and which features add groups: hpZ's secondary partitions, MiCS's
partition and replication groups, qgZ's local and global all-to-all groups. ``group(name, rank)``
answers any rank's group by its ledger name, on every backend alike (the simulator, the ring
transport, meta and torch.distributed), and ``make`` creates every group in the backend once per
run: torch.distributed's ``new_group`` is collective, so every process makes every group, in the
one order :meth:`groups` lists; the other backends need nothing made. The features ask the mesh
for their groups (training/compose.py), so what is made is what is used.

A feature's groups lie inside the ranks its stage shards over: hpZ's and MiCS's inside the rank's
DP group (the world at N_m = 1), qgZ's inside the stage's group (the DP group, or MiCS's partition
group in it). Each is the feature's rule applied to positions in that parent (comm/groups.py's
``within``), in global ranks.
"""
from __future__ import annotations

import dataclasses

from .groups import (Grid, Group, Nodes, global_group, hpz_group, hpz_groups, local_group,
                     mics_groups, qgz_groups, replica_group, shard_group, within)


@dataclasses.dataclass(frozen=True)
class Mesh:
    """``n_d`` × ``n_m`` ranks on nodes of ``gpus_per_node``; ``hpz`` > 1, ``shard_group`` and
    ``qgz`` add their groups (inside each DP group, see the module doc)."""

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

    # -- the parents a feature's groups lie in ---------------------------------------------------
    def dp_parents(self) -> list[Group | None]:
        """Every DP group (None: the world, at N_m = 1), in MP index order."""
        return [self.grid.dp_group(m) for m in range(self.n_m)] if self.n_m > 1 else [None]

    def stage_parents(self) -> list[Group | None]:
        """Every group a stage shards over: the DP groups, or with MiCS the partition groups in
        each (in order)."""
        p = self.shard_group
        if p is None:
            return self.dp_parents()
        return [within(dp, shard_group(r, p)) for dp in self.dp_parents()
                for r in range(0, self.n_d, p)]

    def _in(self, parents, rank: int) -> tuple[Group | None, int, int]:
        """(the parent holding ``rank``, ``rank``'s position in it, the parent's size)."""
        for g in parents:
            if g is None:
                return None, rank, self.n_ranks
            if rank in g.ranks:
                return g, g.ranks.index(rank), g.size
        raise ValueError(f"rank {rank} is in none of {parents}")

    def _node_ranks(self, size: int) -> int:
        """qgZ's GPUs per node in its parent's ranks: the node's DP ranks, or the whole parent."""
        return size if self.gpus_per_node is None else self.gpus_per_node // self.n_m

    def group(self, name: str, rank: int) -> Group:
        """``rank``'s group named ``name`` (a ledger group name, comm/groups.py's GROUP_NAMES)."""
        n, p = self.n_ranks, self.shard_group
        if name in ("shard", "replica") and p is None:
            raise ValueError(f"group {name!r} is MiCS's: it needs shard_group, got None")
        dp, k, n_dp = self._in(self.dp_parents(), rank)
        st, j, n_st = self._in(self.stage_parents(), rank) if name in ("local", "global") else (
            None, 0, 0)
        g = self._node_ranks(n_st)
        make = {"world": lambda: Group("world", tuple(range(n))),
                "host": lambda: Group("host", (rank,)), "nvme": lambda: Group("nvme", (rank,)),
                "dp": lambda: self.grid.dp_group(rank), "mp": lambda: self.grid.mp_group(rank),
                "hpz": lambda: within(dp, hpz_group(k, self.hpz)),
                "local": lambda: within(st, local_group(j, g)),
                "global": lambda: within(st, global_group(j, g, n_st)),
                "shard": lambda: within(dp, shard_group(k, p)),
                "replica": lambda: within(dp, replica_group(k, p, n_dp))}
        if name not in make:
            raise ValueError(f"unknown group {name!r}; accepted: {', '.join(make)}")
        return make[name]()

    def one_copy(self, rank: int) -> Group | None:
        """MiCS: the p·N_m GPUs of ``rank``'s partition groups, which hold one copy of the model
        states between them (norms and overflow votes sum over them); None without MiCS."""
        if self.shard_group is None:
            return None
        k = self.shard_group * self.n_m
        first = rank // k * k
        return Group("shard", tuple(range(first, first + k)))

    def groups(self) -> list[Group]:
        """Every process group the run uses beyond the world, in one fixed order: the grid's DP
        and MP groups (N_m > 1), hpZ's partitions, MiCS's groups (and with N_m > 1 their
        one-copy groups), qgZ's groups; each feature's inside each of its parents in turn."""
        n_d, h, p = self.n_d, self.hpz, self.shard_group
        out = self.grid.groups() if self.n_m > 1 else []
        if h > 1:
            out += [within(dp, g) for dp in self.dp_parents() for g in hpz_groups(n_d, h)]
        if p is not None:
            out += [within(dp, g) for dp in self.dp_parents() for g in mics_groups(n_d, p)]
            if self.n_m > 1:
                out += [self.one_copy(r) for r in range(0, self.n_ranks, p * self.n_m)]
        if self.qgz:
            for st in self.stage_parents():
                size = self.n_ranks if st is None else st.size
                out += [within(st, g) for g in qgz_groups(size, self._node_ranks(size))]
        return out

    def make(self, comm) -> None:
        """Create every group in ``comm``'s backend: every process calls this once, before its
        first collective (torch.distributed); a backend without ``new_groups`` needs none."""
        make = getattr(comm.backend, "new_groups", None)
        if make is not None:
            make(self.groups())
