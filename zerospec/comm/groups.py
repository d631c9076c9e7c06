"""Process groups on the 2-D grid of ZeRO-R's model parallelism (§6, §8): N = N_d × N_m.

Ranks are numbered ``rank = dp_index · N_m + mp_index``: the N_m ranks of one model-parallel group
are neighbours, so they sit inside one node as the paper places MP (C11, C26: MP's all-reduces run
on the node's fast links, DP's traffic crosses nodes). A rank belongs to exactly two groups: its MP
group (the ranks holding the other slices of the same model replica) and its DP group (the ranks
holding the same slice in the other replicas). ZeRO's stages shard over the DP group only.

A :class:`Group` is a name and its global ranks in ring order; a collective over it is a ring of
``len(ranks)`` ranks, booked in the ledger under the group's name (``"world"``, ``"dp"``, ``"mp"``,
and ``"host"`` for a rank's own device↔host copies, which are no collective at all).
"""
from __future__ import annotations

import dataclasses

GROUP_NAMES = ("world", "dp", "mp", "host")


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
