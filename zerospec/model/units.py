"""Flat partitioning (ZeRO §5, DeepSpeed's flat parameter groups).

A *sharding unit* is one layer's parameters (weights, biases, LayerNorm affines) flattened into one
vector of ``numel`` elements, padded with zeros to ``padded`` = a multiple of N_d, so that rank r
owns the contiguous chunk ``[r·chunk, (r+1)·chunk)``. Padding is < N_d per unit and sits on the
last ranks; a unit smaller than N_d leaves some ranks owning padding only.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import torch


@dataclasses.dataclass(frozen=True)
class ParamSlot:
    name: str
    shape: tuple[int, ...]
    offset: int

    @functools.cached_property   # read on every use of a unit (hot in the fetch path)
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclasses.dataclass(frozen=True)
class Unit:
    """One sharding unit laid out for ``n_d`` ranks."""

    name: str
    params: tuple[ParamSlot, ...]
    n_d: int
    pad: bool = True

    @functools.cached_property   # frozen: computed once, read on every use and collective
    def numel(self) -> int:
        return sum(p.numel for p in self.params)

    @functools.cached_property
    def padded(self) -> int:
        """Flat length held per unit: ``numel`` rounded up to a multiple of N_d (if padding)."""
        return -(-self.numel // self.n_d) * self.n_d if self.pad else self.numel

    @property
    def chunk(self) -> int:
        return self.padded // self.n_d

    def shard(self, rank: int) -> slice:
        """Rank ``rank``'s contiguous chunk of the padded flat unit."""
        if not 0 <= rank < self.n_d:
            raise ValueError(f"rank must be in 0..{self.n_d - 1}, got {rank}")
        return slice(rank * self.chunk, (rank + 1) * self.chunk)

    def real_in_shard(self, rank: int) -> int:
        """How many real (non-padding) elements rank ``rank`` owns."""
        s = self.shard(rank)
        return max(0, min(s.stop, self.numel) - s.start)

    @functools.cached_property
    def sizes(self) -> tuple[int, ...]:
        """Each parameter's element count, in order: they tile [0, numel)."""
        return tuple(p.numel for p in self.params)

    @functools.cached_property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    @functools.cached_property
    def _reshapes(self) -> tuple[tuple[int, ...] | None, ...]:
        # None where split's 1-D piece already has the parameter's shape (biases, LayerNorms:
        # most of a block's parameters); a view costs ~2 µs of dispatch even when it changes nothing
        return tuple(None if len(p.shape) == 1 else p.shape for p in self.params)

    def view_tuple(self, flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Parameter-shaped views of a flat (possibly padded) unit tensor, in ``names`` order."""
        # no slice when there is no padding: in autograd a slice's backward zero-fills and copies
        # the whole unit, two passes over it per use for nothing (the fetcher's leaf is unpadded)
        real = flat if flat.numel() == self.numel else flat[: self.numel]
        parts = real.split_with_sizes(self.sizes)
        return tuple(t if shape is None else t.view(shape) for t, shape in zip(parts, self._reshapes))

    def views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Parameter-shaped views of a flat (possibly padded) unit tensor, by parameter name."""
        return dict(zip(self.names, self.view_tuple(flat)))

    def flatten(self, tensors: dict[str, torch.Tensor], dtype=torch.float32) -> torch.Tensor:
        """The padded flat vector of ``tensors`` (one per parameter of the unit)."""
        flat = torch.zeros(self.padded, dtype=dtype)
        for p in self.params:
            flat[p.offset:p.offset + p.numel] = tensors[p.name].reshape(-1)
        return flat


def make_units(spec: list[tuple[str, list[tuple[str, tuple[int, ...]]]]], n_d: int,
               pad: bool = True) -> tuple[Unit, ...]:
    """Units from ``[(unit_name, [(param_name, shape), ...]), ...]`` for ``n_d`` ranks."""
    if n_d < 1:
        raise ValueError(f"n_d must be >= 1, got {n_d}")
    units = []
    for name, params in spec:
        offset, slots = 0, []
        for pname, shape in params:
            slots.append(ParamSlot(pname, tuple(shape), offset))
            offset += math.prod(shape)
        units.append(Unit(name, tuple(slots), n_d, pad))
    return tuple(units)


def psi(units) -> int:
    """Ψ: the number of real parameters."""
    return sum(u.numel for u in units)


def psi_padded(units) -> int:
    """Ψ_p: the elements held once every unit is padded to a multiple of N_d."""
    return sum(u.padded for u in units)


class Sized:
    """Ψ and Ψ_p of a run's ``units`` (a mixin for the results of every engine)."""
    units: tuple[Unit, ...]

    @property
    def psi(self) -> int:
        return psi(self.units)

    @property
    def psi_padded(self) -> int:
        return psi_padded(self.units)
