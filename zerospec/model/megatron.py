"""Megatron-LM's tensor slicing of the decoder's weights (Shoeybi et al. 2019, §3), as data.

Rank j of N_m model-parallel ranks holds, per block:

* ``attn.c_attn`` (QKV, column-parallel): its heads' rows of q, k and v — query heads
  j·H/N_m … (j+1)·H/N_m and, with grouped-query attention, kv heads j·KV/N_m … (j+1)·KV/N_m
  (the fused weight is [q; k; v] of H·hd, KV·hd and KV·hd rows: each part is cut on its own),
  so its attention runs on whole heads without communication (RoPE rotates each head alone, so
  it is exact on a slice); the q/k/v biases (Qwen2) go with their rows;
* ``attn.c_proj`` (attention out, row-parallel): the matching columns; the partial outputs are
  summed across the MP group (one all-reduce) before the bias, which every rank holds whole (a
  no-bias model adds none);
* ``mlp.c_fc`` (MLP up) and, with SwiGLU, ``mlp.c_gate`` (gate), column-parallel: rows
  j·f/N_m … (j+1)·f/N_m of f = d_ff (4d for GPT-2); their biases likewise;
* ``mlp.c_proj`` (MLP down, row-parallel): the matching columns; bias whole;

and outside the blocks, vocabulary-parallel (zerospec/model/vocab.py): rows j·V_p/N_m …
(j+1)·V_p/N_m of ``embed.wte`` and of an untied ``lm_head.weight``, V_p the vocabulary padded to a
multiple of 128·N_m (:meth:`GPTConfig.padded_vocab`; zero rows, never looked up, their logits
left out of the loss). Whole on every rank (:func:`replicated`): the norms (LayerNorm or RMSNorm),
the row-parallel biases, the position table and the final norm.

N_m must divide H, KV and f (:func:`zerospec.model.family.check_mp`). For GPT-2, Ψ per MP rank
is V_p·d/N_m + T·d + 2d + L·(12d²/N_m + 7d/N_m + 6d) exactly, the padded rows included (memory,
not parameters: :func:`psi_padding` counts them); :func:`psi_per_rank` gives the family's
(N_m = 1 gives the model's Ψ). :func:`shard` cuts a full parameter dict for rank j;
:func:`unshard` puts the N_m slices back together (padding dropped), so runs at different N_m
compare as the same model.

The same module holds Megatron-LM's two conjugate operators over the MP group (§3), which the
slices need at run time: :class:`TensorParallel` (see its docstring).
"""
from __future__ import annotations

import torch

from .gpt import GPTConfig, check_mp

# block parameter -> (dim it is split on, number of row groups fused in it): c_attn is [q; k; v]
# (with grouped-query attention the three parts differ in size: see _groups)
SPLIT = {"attn.c_attn.weight": (0, 3), "attn.c_attn.bias": (0, 3),
         "attn.c_proj.weight": (1, 1),
         "mlp.c_gate.weight": (0, 1), "mlp.c_gate.bias": (0, 1),
         "mlp.c_fc.weight": (0, 1), "mlp.c_fc.bias": (0, 1),
         "mlp.c_proj.weight": (1, 1)}
# (unit, parameter) split by rows of the padded vocabulary
VOCAB = {("embed", "wte"), ("lm_head", "weight")}


def sliced(unit: str, name: str) -> bool:
    """Whether parameter ``name`` of ``unit`` is cut N_m ways (each MP rank holds its own part)."""
    return (unit, name) in VOCAB or (unit.startswith("h.") and name in SPLIT)


def replicated(unit: str, param: str) -> bool:
    """Whether parameter ``param`` of unit ``unit`` is whole on every rank of an MP group (so
    the group holds N_m identical copies of it and of its gradient), rather than sliced (the
    blocks' SPLIT parameters, and wte and an untied head by vocabulary rows): the one answer every
    consumer asks — the global gradient norm counts such a parameter once, not N_m times
    (zerospec/optim/clip.py), as Megatron-LM's clipping skips tensor-parallel duplicates."""
    return not sliced(unit, param)


def psi_per_rank(cfg: GPTConfig, n_m: int) -> int:
    """Elements one MP rank holds, exact, the same on every rank: per block, the sliced weights
    and biases over N_m plus the replicated norms and row-parallel biases; V_p/N_m rows of wte
    (and of an untied head), padding included; the position table and final norm (the shapes of
    :meth:`GPTConfig.unit_spec`, as in :attr:`GPTConfig.psi`)."""
    check_mp(cfg, n_m)
    d, L, T = cfg.n_embd, cfg.n_layer, cfg.position_rows
    q, kv, f = cfg.n_head * cfg.head_dim, cfg.kv_heads * cfg.head_dim, cfg.ff
    m = 3 if cfg.mlp == "swiglu" else 2
    nu, beta_qkv = len(cfg.norm_params), int(cfg.has_qkv_bias)
    beta_o, beta_mlp = int(cfg.has_o_bias), int(cfg.has_mlp_bias)
    sliced = d * (q + 2 * kv) + q * d + m * d * f + beta_qkv * (q + 2 * kv) + beta_mlp * (m - 1) * f
    replicated = (beta_o + beta_mlp) * d + 2 * nu * d
    vocab = cfg.padded_vocab(n_m) // n_m * d * (2 - cfg.tie_embeddings)
    outside = vocab + (cfg.positions == "learned") * T * d + nu * d
    return L * (sliced // n_m + replicated) + outside


def psi_padding(cfg: GPTConfig, n_m: int, j: int | None = None) -> int:
    """Elements of the padded vocabulary rows (V_p − V of wte, and of an untied head) that MP rank
    ``j`` holds — they sit on the last ranks; None: over the whole MP group. Memory, not Ψ."""
    v_p = cfg.padded_vocab(n_m)
    lo, hi = (0, v_p) if j is None else (j * v_p // n_m, (j + 1) * v_p // n_m)
    return (hi - max(lo, cfg.vocab_size) if hi > cfg.vocab_size else 0) * cfg.n_embd * (
        2 - cfg.tie_embeddings)


def _groups(cfg: GPTConfig, name: str) -> list[int] | None:
    """The sizes, along the split dim, of the row groups fused in parameter ``name`` (None: one
    group). c_attn is [q; k; v] of H·hd, KV·hd and KV·hd rows (equal thirds for GPT-2)."""
    if SPLIT[name][1] == 1:
        return None
    q, kv = cfg.n_head * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    return [q, kv, kv]


def _pieces(cfg: GPTConfig, t: torch.Tensor, name: str, n_m: int) -> list[torch.Tensor]:
    """``t`` cut into N_m slices along its split dim (each fused group cut separately)."""
    dim, sizes = SPLIT[name][0], _groups(cfg, name)
    groups = t.split(sizes, dim) if sizes else (t,)
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
        out[unit] = {name: (_vocab_rows(cfg, t, n_m, j) if (unit, name) in VOCAB
                            else _pieces(cfg, t, name, n_m)[j].contiguous() if sliced(unit, name)
                            else t) for name, t in ps.items()}
    return out


def _vocab_rows(cfg: GPTConfig, t: torch.Tensor, n_m: int, j: int) -> torch.Tensor:
    """Rank j's rows of a V×d table padded with zero rows to V_p."""
    v_p = cfg.padded_vocab(n_m)
    lo, hi = j * v_p // n_m, (j + 1) * v_p // n_m
    part = t[lo:min(hi, t.shape[0])]
    pad = part.new_zeros((hi - lo - part.shape[0], *t.shape[1:]))
    return torch.cat([part, pad]) if pad.shape[0] else part.clone()


def unshard(cfg: GPTConfig, parts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The full model's {"unit/param": tensor} from each MP rank's slices (same keys); a
    replicated parameter is taken from rank 0."""
    n_m = len(parts)
    out = {}
    for key, t in parts[0].items():
        unit, name = key.split("/", 1)
        if n_m == 1 or replicated(unit, name):
            out[key] = t
            continue
        if (unit, name) in VOCAB:                   # the rows in rank order, padding dropped
            out[key] = torch.cat([p[key] for p in parts])[:cfg.vocab_size]
            continue
        dim, fused = SPLIT[name]
        sizes = [s // n_m for s in _groups(cfg, name)] if fused > 1 else None  # one rank's
        groups = [p[key].split(sizes, dim) if sizes else (p[key],) for p in parts]  # [rank][group]
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
    B·T·d in forward and two in backward (C33), all over the MP group and booked there; the
    vocabulary split adds g after the embedding, f before the LM head, and the cross-entropy's
    three all-reduces of B·T (zerospec/model/vocab.py) — through ``comm`` too.

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
