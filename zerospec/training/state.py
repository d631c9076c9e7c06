"""The training state, unsharded, and each rank's pieces of it: what a checkpoint holds
(zerospec/training/checkpoint.py writes and reads the directory).

A :class:`TrainState` is, per unit, the *real* elements of each kind (fp16 parameters, fp32
master, exp_avg, exp_avg_sq): padding is a property of N, re-added by whoever lays it out
(:meth:`TrainState.padded`). A rank's pieces are the real elements of its owned slice of each
unit (:func:`rank_pieces`), read from wherever the stage keeps them (host, NVMe, an owner: the
stage's checkpoint hooks, zero/hooks.py); :func:`assemble` puts every rank's pieces back
together, each element exactly once. With model parallelism a unit is an MP index's Megatron
slice, named ``mp{j}/<unit>`` (:func:`unit_spec`).
"""
from __future__ import annotations

import contextlib
import dataclasses

import torch

from ..model.units import make_units

KINDS = ("param16", "master", "exp_avg", "exp_avg_sq")


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded as asked; the message names the file and the problem."""


def unit_spec(model, n_m: int = 1, tiles: int = 1) -> list:
    """The units a checkpoint of an N_d × N_m run holds: the model's (N_m = 1), or each MP index
    j's slices of them, named ``mp{j}/<unit>`` (all N_m slices have the same shapes); a tiled
    run's (``tiles`` T > 1) are its own units, each block's MLP as T tiles ``h.<i>.mlp<k>``:
    a tile's c_proj columns are no contiguous range of the untiled unit, so a tiled checkpoint
    resumes a run of the same T."""
    one = [(n, [(p, tuple(s)) for p, s in ps]) for n, ps in model.unit_spec(n_m, tiles)]
    return one if n_m == 1 else [(mp_prefix(n_m, j) + n, ps) for j in range(n_m) for n, ps in one]


def mp_prefix(n_m: int, j: int) -> str:
    """How MP index j's unit names start in a checkpoint: ``mp{j}/``, nothing at N_m = 1."""
    return "" if n_m == 1 else f"mp{j}/"


@dataclasses.dataclass
class TrainState:
    """The whole training state, unsharded: per unit, the real elements of each kind."""

    spec: list                        # model.unit_spec(): [(unit, [(param, shape), …]), …]
    tensors: dict[str, list[torch.Tensor]]
    meta: dict                        # step, optim_step, scaler, precision, data, stage, n_ranks

    @property
    def step(self) -> int:
        return self.meta["step"]

    def units(self, n_ranks: int):
        return make_units(self.spec, n_ranks, pad=True)

    def padded(self, kind: str, i: int, unit) -> torch.Tensor:
        """Unit i's ``kind`` zero-padded to ``unit``'s layout (padding re-added for its N)."""
        t = self.tensors[kind][i]
        out = torch.zeros(unit.padded, dtype=t.dtype)
        out[:t.numel()] = t
        return out

    def restore(self, stage, mp_index: int = 0) -> None:
        """Copy this state into a freshly built stage: each rank takes its owned slices (with
        N_m > 1, of MP index ``mp_index``'s units)."""
        if self.meta["precision"] != stage.precision.name:
            raise CheckpointError(f"checkpoint holds {self.meta['precision']} training state; the "
                                  f"run asks for precision={stage.precision.name!r}")
        first = mp_index * len(stage.units)       # MP index j's units follow j − 1's
        prefix = mp_prefix(self.meta.get("n_m", 1), mp_index)
        names = [n for n, _ in self.spec[first:first + len(stage.units)]]
        if names != [prefix + u.name for u in stage.units]:
            raise CheckpointError(f"the state's units {names} are not MP index {mp_index}'s "
                                  f"{[prefix + u.name for u in stage.units]}")
        with _held(stage, write=True):   # NVMe-offloaded states: read, restored, written back
            for i, u in enumerate(stage.units):
                own = stage.owned_slice(u)
                for kind, dst in (("master", stage.master), ("exp_avg", stage.exp_avg),
                                  ("exp_avg_sq", stage.exp_avg_sq)):
                    dst[i].copy_(self.padded(kind, first + i, u)[own])
        for i, u in enumerate(stage.units):   # where the stage keeps them (host, NVMe, owner)
            stage.restore_param16(i, self.padded("param16", first + i, u))


# -- what a rank owns ------------------------------------------------------------------------------
def _held(stage, write: bool = False):
    """The stage's optimizer states in memory for a block: NVMe-offloaded ones are read from
    their files (and written back if ``write``; zerospec/offload/); others are there already."""
    hold = getattr(stage, "hold_states", None)
    return hold(write) if hold is not None else contextlib.nullcontext()


def rank_pieces(stage, prefix: str = "") -> dict[str, dict]:
    """unit name → {start, stop, kind: tensor} for the real elements this rank writes (copies);
    ``prefix``: the rank's MP index's (:func:`mp_prefix`)."""
    if stage.stage == 0 and stage.ctx.rank != 0:
        return {}                          # replicated: rank 0 writes it once
    replicas = getattr(stage, "replicas", None)
    if replicas is not None and replicas.rank != 0:
        return {}                          # MiCS: the first partition group writes the shards
    with _held(stage):
        return _rank_pieces(stage, prefix)


def _rank_pieces(stage, prefix: str) -> dict[str, dict]:
    out = {}
    for i, u in enumerate(stage.units):
        p16 = stage.saved_param16(i)       # every unit: the owner layout broadcasts it
        own = stage.owned_slice(u)
        start, stop = own.start, min(own.stop, u.numel)
        if stop <= start:
            continue                       # this rank owns only padding of this unit
        n = stop - start                   # owned tensors start at own.start: their [:n] is real
        out[prefix + u.name] = {"start": start, "stop": stop, "param16": p16[:n].detach().clone(),
                       **{k: t[i][:n].detach().clone() for k, t in
                          (("master", stage.master), ("exp_avg", stage.exp_avg),
                           ("exp_avg_sq", stage.exp_avg_sq))}}
    return out


def assemble(spec, meta: dict, pieces: dict[str, dict], where: str = "checkpoint") -> TrainState:
    """A TrainState from every rank's pieces; every element of every unit exactly once."""
    units = make_units(spec, 1, pad=False)
    tensors = {k: [] for k in KINDS}
    for u in units:
        got = sorted((p["start"], p["stop"], src, p) for src, per in pieces.items()
                     for name, p in per.items() if name == u.name)
        pos = 0
        for start, stop, src, p in got:
            if start != pos:
                what = "overlap" if start < pos else f"elements [{pos}, {start}) are in no shard"
                raise CheckpointError(f"{where}: unit {u.name!r}: {what} (at {src})")
            pos = stop
        if pos != u.numel:
            raise CheckpointError(f"{where}: unit {u.name!r}: elements [{pos}, {u.numel}) are in "
                                  f"no shard (a shard file is missing from the manifest?)")
        for k in KINDS:
            parts = [p[k] for *_, p in got]
            if any(t.dim() != 1 or t.numel() != stop - start for t, (start, stop, *_) in zip(parts, got)):
                raise CheckpointError(f"{where}: unit {u.name!r}: {k} piece has the wrong length")
            tensors[k].append(torch.cat(parts) if parts else torch.zeros(0))
    return TrainState([(n, [(p, tuple(s)) for p, s in ps]) for n, ps in spec], tensors, dict(meta))


def layout_pieces(stage, rank: int, n_m: int = 1) -> dict[str, dict]:
    """The ranges global rank ``rank`` wrote (same rule as :func:`rank_pieces`, without the
    tensors): its DP index's shard of its MP index's units."""
    dp, j = divmod(rank, n_m)
    prefix = mp_prefix(n_m, j)
    if stage.stage == 0:
        return {prefix + u.name: {"start": 0, "stop": u.numel} for u in stage.units} if dp == 0 else {}
    if dp >= stage.ctx.n_ranks:            # MiCS: a rank past the first partition group of p
        return {}
    out = {}
    for u in stage.units:
        s = u.shard(dp)
        if min(s.stop, u.numel) > s.start:
            out[prefix + u.name] = {"start": s.start, "stop": min(s.stop, u.numel)}
    return out
