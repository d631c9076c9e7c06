"""Megatron-LM's tensor slicing of the GPT's weights (Shoeybi et al. 2019, §3), as data.

Rank j of N_m model-parallel ranks holds, per block:

* ``attn.c_attn`` (QKV, column-parallel): its heads' rows of q, k and v — heads
  j·H/N_m … (j+1)·H/N_m — so its attention runs on whole heads without communication;
* ``attn.c_proj`` (attention out, row-parallel): the matching columns; the partial outputs are
  summed across the MP group (one all-reduce) before the bias, which every rank holds whole;
* ``mlp.c_fc`` (MLP up, column-parallel): rows j·4d/N_m …; its bias likewise;
* ``mlp.c_proj`` (MLP down, row-parallel): the matching columns; bias whole;
* LayerNorms, the embedding (and the tied LM head) and the final LayerNorm: whole (replicated).

So Ψ per MP rank is (V + T)·d + 2d + L·(12d²/N_m + 7d/N_m + 6d) exactly
(:func:`psi_per_rank`; N_m = 1 gives the model's Ψ). :func:`shard` cuts a full parameter dict
for rank j; :func:`unshard` puts the N_m slices back together, so runs at different N_m compare
as the same model.

The same module holds Megatron-LM's two conjugate operators over the MP group (§3), which the
slices need at run time: :class:`TensorParallel` (see its docstring).
"""
from __future__ import annotations

import torch

from .gpt import GPTConfig, check_mp

# parameter -> (dim it is split on, number of row groups fused in it): c_attn is [q; k; v]
SPLIT = {"attn.c_attn.weight": (0, 3), "attn.c_attn.bias": (0, 3),
         "attn.c_proj.weight": (1, 1),
         "mlp.c_fc.weight": (0, 1), "mlp.c_fc.bias": (0, 1),
         "mlp.c_proj.weight": (1, 1)}


def psi_per_rank(cfg: GPTConfig, n_m: int) -> int:
    """Parameters one MP rank holds (the closed form of the module docstring)."""
    check_mp(cfg, n_m)
    d, L = cfg.n_embd, cfg.n_layer
    return (cfg.vocab_size + cfg.block_size) * d + 2 * d + L * (12 * d * d // n_m + 7 * d // n_m + 6 * d)


def _pieces(t: torch.Tensor, name: str, n_m: int) -> list[torch.Tensor]:
    """``t`` cut into N_m slices along its split dim (each fused group cut separately)."""
    dim, fused = SPLIT[name]
    groups = t.chunk(fused, dim)
    per_group = [g.chunk(n_m, dim) for g in groups]
    return [torch.cat([pg[j] for pg in per_group], dim) for j in range(n_m)]


def shard(cfg: GPTConfig, params: dict[str, dict[str, torch.Tensor]], n_m: int,
          j: int) -> dict[str, dict[str, torch.Tensor]]:
    """Rank j's slice of a full {unit: {param: tensor}} dict."""
    check_mp(cfg, n_m)
    if not 0 <= j < n_m:
        raise ValueError(f"mp_index must be in 0..{n_m - 1}, got {j}")
    out = {}
    for unit, ps in params.items():
        out[unit] = {name: (_pieces(t, name, n_m)[j].contiguous() if unit.startswith("h.")
                            and name in SPLIT else t) for name, t in ps.items()}
    return out


def unshard(cfg: GPTConfig, parts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The full model's {"unit/param": tensor} from each MP rank's slices (same keys); a
    replicated parameter is taken from rank 0."""
    n_m = len(parts)
    out = {}
    for key, t in parts[0].items():
        unit, name = key.split("/", 1)
        if n_m == 1 or not unit.startswith("h.") or name not in SPLIT:
            out[key] = t
            continue
        dim, fused = SPLIT[name]
        groups = [p[key].chunk(fused, dim) for p in parts]     # [rank][group]
        out[key] = torch.cat([torch.cat([groups[j][g] for j in range(n_m)], dim)
                              for g in range(fused)], dim)
    return out

class TensorParallel:
    """One rank's handle on its MP group: ``n_m`` ranks, collectives through ``comm``.

    Megatron-LM's two conjugate operators over one model-parallel group (Shoeybi et al. 2019, §3).

    ``enter`` (Megatron's *f*) stands before a column-parallel layer: identity in forward (every MP
    rank already holds the whole input), all-reduce of the input's gradient in backward (each rank's
    slice contributed part of it). ``exit`` (Megatron's *g*) follows a row-parallel layer: all-reduce
    of the partial outputs in forward, identity in backward. Per block that is two all-reduces of
    B·T·d in forward and two in backward (C33), all over the MP group and booked there.

    The all-reduces sum in rank order in fp32 (comm/sim.py), so every MP rank gets the same bits:
    whatever follows (LayerNorms, the residual stream, the replicated parameters' gradients) is
    identical on every rank of the group without further communication.
    """

    def __init__(self, comm):
        self.comm = comm
        self.n_m = comm.n_ranks
        self.index = comm.rank

    def enter(self, x: torch.Tensor) -> torch.Tensor:
        return _Enter.apply(x, self.comm)

    def exit(self, x: torch.Tensor) -> torch.Tensor:
        return _Exit.apply(x, self.comm)


class _Enter(torch.autograd.Function):
    """f: identity forward, all-reduce (sum) of the gradient backward."""

    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()     # autograd may still hold the incoming buffer
        ctx.comm.all_reduce(grad, "sum")
        return grad, None


class _Exit(torch.autograd.Function):
    """g: all-reduce (sum) of the partial outputs forward, identity backward."""

    @staticmethod
    def forward(ctx, x, comm):
        out = x.contiguous().clone()
        comm.all_reduce(out, "sum")
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None
