"""FSDP2's HSDP as the peer of MiCS (spec/mics.md), and FSDP2's integer ``reshard_after_forward``
as the peer of hpZ: torch's own engine on a 2-D (replicate, shard) device mesh, on gloo processes.

``init_device_mesh("cpu", (N/p, p))`` numbers ranks row by row, so a row — the shard dimension —
is p consecutive ranks (zerospec's partition group, comm/groups.py ``shard_group``) and a column —
the replicate dimension — the ranks at one position in every row (``replica_group``). Each
zerospec unit is one ``fully_shard`` module, as in :mod:`zerospec.testing.oracles`.

Gradient accumulation over G micro-steps: FSDP2 reduce-scatters inside the shard dimension at every
micro-step and, unless told otherwise, all-reduces across the replicate dimension at every one too;
``set_requires_all_reduce(False)`` on all but the last micro-step leaves the all-reduce to the
accumulation boundary, as MiCS does. Each rank's micro-step k reads zerospec's rows (global
micro-batch k·N + r, training/step.py), and its loss is divided by G so the accumulated gradient is
the mean over the N·G micro-batches.

``reshard_after_forward=h`` (an integer) keeps a 1/h shard of each unit after forward, over h
consecutive ranks, and gathers backward's parameters from those: ZeRO++'s hpZ
(zerospec/zero/hpz.py) at ``zero_hpz_partition_size`` = h.
"""
from __future__ import annotations

import contextlib
import dataclasses
import warnings

import torch
import torch.distributed as dist

from ..cluster import processes
from ..model.data import BigramData
from .oracles import GPT, ZerospecAdam, _counts, full_weights, mean_losses, zerospec_rank, zerospec_row

PHASES = ("forward", "backward", "step")


def build(cfg, *, shard_group: int | None = None, reshard_after_forward: bool | int = True):
    """(model, zerospec's Adam arithmetic) of FSDP2 on this process group: HSDP over an
    (N/p, p) mesh with ``shard_group`` = p, else a 1-D mesh of every rank."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    n = dist.get_world_size()
    if shard_group is None:
        mesh = init_device_mesh("cpu", (n,))
    else:
        mesh = init_device_mesh("cpu", (n // shard_group, shard_group),
                                mesh_dim_names=("replicate", "shard"))
    model = GPT.from_init(cfg.model, cfg.seed)
    for mod in [*model.h, model.ln_f]:
        fully_shard(mod, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    return model, ZerospecAdam(model.parameters(), cfg.adam)


def peer_run(cfg, *, shard_group: int | None = None, reshard_after_forward: bool | int = True,
             accum: int = 1, all_reduce_at_boundary: bool = True) -> dict:
    """Train ``cfg.steps`` steps of G = ``accum`` micro-steps; this rank's losses (mean of its
    micro-steps), full weights after every step and the last step's collective counts per phase
    (``CommDebugMode``). ``all_reduce_at_boundary`` False: FSDP2's default, an all-reduce every
    micro-step."""
    from torch.distributed.tensor.debug import CommDebugMode
    rank, n = dist.get_rank(), dist.get_world_size()
    model, opt = build(cfg, shard_group=shard_group, reshard_after_forward=reshard_after_forward)
    data = BigramData(cfg.model.vocab_size, cfg.model.block_size, cfg.seed)
    out = {"losses": [], "weights": [], "counts": None}
    for step in range(cfg.steps):
        counted = step == cfg.steps - 1
        counts: dict[str, dict[str, int]] = {p: {} for p in PHASES}

        @contextlib.contextmanager
        def phase(name):   # a fresh mode per use (entering one resets it), its counts added up
            if not counted:
                yield
                return
            with CommDebugMode() as mode:
                yield
            for op, c in _counts(mode).items():
                counts[name][op] = counts[name].get(op, 0) + c
        idx, tgt = data.batch(step, cfg.batch)
        mb = idx.shape[0] // (n * accum)
        micro = []
        for k in range(accum):
            if shard_group is not None and all_reduce_at_boundary:
                model.set_requires_all_reduce(k == accum - 1)
            rows = slice((k * n + rank) * mb, (k * n + rank + 1) * mb)
            with phase("forward"):
                loss = model(idx[rows], tgt[rows])
            with phase("backward"), warnings.catch_warnings():
                warnings.filterwarnings("ignore", "Full backward hook is firing")
                (loss / accum).backward()      # / G: a power of two here, exact
            micro.append(loss.detach())
        with phase("step"):
            opt.step()
            opt.zero_grad(set_to_none=True)
        if counted:
            out["counts"] = counts
        out["losses"].append(micro[0] if accum == 1 else torch.stack(micro).mean())
        out["weights"].append(full_weights(model))
    return out


def _compare_rank(ctx, cfg, peers: dict) -> dict:
    """zerospec's run of ``cfg``, then each named peer run (kwargs of :func:`peer_run`)."""
    zs = zerospec_rank(ctx, cfg, count=False, weights=True)
    return {"zerospec": zs, "peers": {name: peer_run(cfg, **kw) for name, kw in peers.items()}}


def compare(cfg, peers: dict) -> dict:
    """Launch ``cfg.n_d`` gloo processes; zerospec's row (losses, ledger records, weights after
    every step, as in oracles.compare) and, per peer, its losses, rank 0's weights and counts."""
    per_rank = processes.launch(_compare_rank, cfg.n_d, cfg, peers, timeout=cfg.timeout)
    row = zerospec_row(cfg, cfg.stage, [x["zerospec"] for x in per_rank], True)
    row["peers"] = {}
    for name in peers:
        ps = [x["peers"][name] for x in per_rank]
        row["peers"][name] = {"losses": mean_losses(ps, dataclasses.replace(cfg)),
                              "weights": ps[0]["weights"], "counts": ps[0]["counts"]}
    return row
