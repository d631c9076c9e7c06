"""Process groups on the 2-D grid of ZeRO-R's model parallelism (§6, §8): N = N_d × N_m.

Ranks are numbered ``rank = dp_index · N_m + mp_index``: the N_m ranks of one model-parallel group
are neighbours, so they sit inside one node as the paper places MP (C11, C26: MP's all-reduces run
on the node's fast links, DP's traffic crosses nodes). A rank belongs to exactly two groups: its MP
group (the ranks holding the other slices of the same model replica) and its DP group (the ranks
holding the same slice in the other replicas). ZeRO's stages shard over the DP group only.

A :class:`Group` is a name and its global ranks in ring order; a collective over it is a ring of
``len(ranks)`` ranks, booked in the ledger under the group's name (``"world"``, ``"dp"``, ``"mp"``,
``"hpz"`` for hpZ's secondary partition inside a node, ``"shard"`` and ``"replica"`` for MiCS's
partition and replication groups (FSDP2's HSDP mesh), ``"local"`` (a node's GPUs) and
``"global"`` (the GPUs of one local index, one per node) for qgZ's two all-to-alls, and ``"host"``
for a rank's own device↔host
copies, which are no collective at all).

:class:`Nodes` places the ranks on nodes of G GPUs, contiguously (rank r on node r // G, as
torchrun numbers them): it says which link class each ring hop takes (spec/nodes.md).
"""
from __future__ import annotations

import dataclasses

from ..paper.hardware import LINKS

GROUP_NAMES = ("world", "dp", "mp", "host", "hpz", "shard", "replica", "local", "global",
               "nvme")


@dataclasses.dataclass(frozen=True)
class Group:
    """A named set of global ranks, in ring order."""

    name: str
    ranks: tuple[int, ...]

    def __post_init__(self):
        if self.name not in GROUP_NAMES:
            raise ValueError(f"unknown group {self.name!r}; accepted: {', '.join(GROUP_NAMES)}")
        if not self.ranks or len(set(self.ranks)) != len(self.ranks):
            raise ValueError(f"group {self.name!r} needs distinct ranks, got {self.ranks}")

    @property
    def size(self) -> int:
        return len(self.ranks)

    def index(self, rank: int) -> int:
        """``rank``'s position in the group's ring."""
        try:
            return self.ranks.index(rank)
        except ValueError:
            raise ValueError(f"rank {rank} is not in group {self.name!r} {self.ranks}") from None


@dataclasses.dataclass(frozen=True)
class Grid:
    """N_d × N_m ranks; ``rank = dp_index · n_m + mp_index`` (MP inside a node)."""

    n_d: int
    n_m: int = 1

    def __post_init__(self):
        for name in ("n_d", "n_m"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")

    @property
    def n_ranks(self) -> int:
        return self.n_d * self.n_m

    def dp_index(self, rank: int) -> int:
        self._check(rank)
        return rank // self.n_m

    def mp_index(self, rank: int) -> int:
        self._check(rank)
        return rank % self.n_m

    def dp_group(self, rank: int) -> Group:
        """The ranks holding the same model slice as ``rank``: ZeRO's data-parallel group."""
        m = self.mp_index(rank)
        return Group("dp", tuple(d * self.n_m + m for d in range(self.n_d)))

    def mp_group(self, rank: int) -> Group:
        """The ranks holding the other slices of ``rank``'s model replica."""
        d = self.dp_index(rank)
        return Group("mp", tuple(d * self.n_m + m for m in range(self.n_m)))

    def groups(self) -> list[Group]:
        """Every DP group, then every MP group, in a fixed order (torch.distributed creates them
        in the same order on every process)."""
        return ([self.dp_group(m) for m in range(self.n_m)]
                + [self.mp_group(d * self.n_m) for d in range(self.n_d)])

    def _check(self, rank: int) -> None:
        if not isinstance(rank, int) or not 0 <= rank < self.n_ranks:
            raise ValueError(f"rank must be in 0..{self.n_ranks - 1} (N_d={self.n_d} × "
                             f"N_m={self.n_m}), got {rank!r}")


@dataclasses.dataclass(frozen=True)
class Nodes:
    """``n_ranks`` GPUs on nodes of ``gpus_per_node`` each, filled in rank order: rank r sits on
    node r // G. ``gpus_per_node`` None: one node holds every rank (every hop is ``"intra"``)."""

    n_ranks: int
    gpus_per_node: int | None = None

    def __post_init__(self):
        g = self.gpus_per_node
        if g is None:
            return
        if not divides(g, self.n_ranks):
            raise ValueError(f"gpus_per_node must be an integer >= 1 that divides the {self.n_ranks} "
                             f"ranks (whole nodes), got {g!r}; accepted: "
                             f"{', '.join(map(str, divisors(self.n_ranks)))}")

    @property
    def per_node(self) -> int:
        """G: GPUs per node (all ranks when one node holds them)."""
        return self.n_ranks if self.gpus_per_node is None else self.gpus_per_node

    @property
    def n_nodes(self) -> int:
        return self.n_ranks // self.per_node

    def node(self, rank: int) -> int:
        return rank // self.per_node

    def link(self, src: int, dst: int) -> str:
        """The link class of a hop ``src`` → ``dst`` between GPUs (hardware.LINKS)."""
        return LINKS[0] if self.node(src) == self.node(dst) else LINKS[1]

    def ranks_of(self, node: int) -> range:
        g = self.per_node
        return range(node * g, (node + 1) * g)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def divides(value, n: int) -> bool:
    """Whether ``value`` is an int (not a bool) >= 1 that divides ``n``: the check every group
    size (GPUs per node, hpZ's h, MiCS's p) passes; refusals list :func:`divisors` as accepted."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1 and n % value == 0


def within(parent: Group | None, group: Group) -> Group:
    """``group``, whose ranks are positions in ``parent`` (a DP group, a MiCS partition group;
    None: the world), in global ranks: a feature's groups inside the ranks its stage sees."""
    if parent is None:
        return group
    return Group(group.name, tuple(parent.ranks[r] for r in group.ranks))


def hpz_group(rank: int, h: int) -> Group:
    """hpZ's secondary partition of ``rank``: the h consecutive ranks around it, ``rank // h``'s
    block. With h dividing the GPUs per node, the block lies inside ``rank``'s node."""
    first = rank // h * h
    return Group("hpz", tuple(range(first, first + h)))


def hpz_groups(n_ranks: int, h: int) -> list[Group]:
    """Every secondary partition, in rank order (the order torch.distributed makes them in)."""
    return [hpz_group(r, h) for r in range(0, n_ranks, h)]


def shard_group(rank: int, p: int) -> Group:
    """MiCS's partition group of ``rank`` (FSDP2 HSDP's shard dimension): the p consecutive ranks
    of ``rank // p``'s block, which hold one replica of the model states between them. With p the
    GPUs per node, it is ``rank``'s node."""
    first = rank // p * p
    return Group("shard", tuple(range(first, first + p)))


def replica_group(rank: int, p: int, n_ranks: int) -> Group:
    """MiCS's replication group of ``rank`` (HSDP's replicate dimension): the N/p ranks at
    ``rank``'s position in every partition group, which hold the same shard."""
    return Group("replica", tuple(range(rank % p, n_ranks, p)))


def mics_groups(n_ranks: int, p: int) -> list[Group]:
    """Every partition group, then every replication group, in rank order (the order
    torch.distributed makes them in)."""
    return ([shard_group(r, p) for r in range(0, n_ranks, p)]
            + [replica_group(r, p, n_ranks) for r in range(p)])
def local_group(rank: int, g: int) -> Group:
    """qgZ's first all-to-all (DeepSpeed's ``local_{node}`` group): the G GPUs of ``rank``'s node."""
    first = rank // g * g
    return Group("local", tuple(range(first, first + g)))


def global_group(rank: int, g: int, n_ranks: int) -> Group:
    """qgZ's second all-to-all (DeepSpeed's ``global_{local index}``): one GPU per node, those of
    ``rank``'s local index."""
    return Group("global", tuple(range(rank % g, n_ranks, g)))


def qgz_groups(n_ranks: int, g: int) -> list[Group]:
    """Every local group, then every global group (the order torch.distributed makes them in)."""
    return ([local_group(r, g) for r in range(0, n_ranks, g)]
            + [global_group(j, g, n_ranks) for j in range(g)])
