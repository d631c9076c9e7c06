"""A tiny GPT, nanoGPT-shaped, written as a function of its parameters.

The model never owns parameters: each layer asks ``fetch(unit_index)`` for its unit's parameters
(a context manager yielding name → tensor views). Where those come from — a resident replica, or an
all-gather just in time — is the ZeRO stage's business; the math here is the same in every stage,
which is what makes the stages bit-identical (design property 3).

Attention is written out (no SDPA), so torch's FLOP formulas count it: on CPU, SDPA's default
kernel has no FLOP formula and would count attention as 0.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .config import ODD, SMALL, GPTConfig, check_mp

__all__ = ["GPTConfig", "SMALL", "ODD", "check_mp", "init_params", "attention", "block", "blocks",
           "fetch_order", "forward"]


def init_params(cfg: GPTConfig, seed: int) -> dict[str, dict[str, torch.Tensor]]:
    """nanoGPT's initialisation in fp32: N(0, 0.02) weights, residual projections scaled by
    1/sqrt(2L), zero biases, unit LayerNorm gains. Returns unit name → param name → tensor."""
    g = torch.Generator().manual_seed(seed)
    out: dict[str, dict[str, torch.Tensor]] = {}
    for uname, params in cfg.unit_spec():
        out[uname] = {}
        for pname, shape in params:
            if pname.endswith("bias"):
                t = torch.zeros(shape)
            elif "ln" in pname or uname == "ln_f":
                t = torch.ones(shape)
            else:
                std = 0.02 / math.sqrt(2 * cfg.n_layer) if pname.endswith("c_proj.weight") else 0.02
                t = torch.randn(shape, generator=g) * std
            out[uname][pname] = t
    return out


def attention(qkv: torch.Tensor, n_head: int) -> torch.Tensor:
    """Causal self-attention from the fused q, k, v projection: (B, T, 3C) → (B, T, C)."""
    B, T, C = qkv.shape[0], qkv.shape[1], qkv.shape[2] // 3
    hd = C // n_head
    q, k, v = qkv.split(C, dim=2)
    q = q.view(B, T, n_head, hd).transpose(1, 2)             # (B, nh, T, hd)
    k = k.view(B, T, n_head, hd).transpose(1, 2)
    v = v.view(B, T, n_head, hd).transpose(1, 2)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))  # (B, nh, T, T)
    mask = torch.ones(T, T, dtype=torch.bool, device=qkv.device).triu(1)
    att = F.softmax(att.masked_fill(mask, float("-inf")), dim=-1)
    return (att @ v).transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)


def block(cfg: GPTConfig, x: torch.Tensor, p: dict[str, torch.Tensor], mp=None) -> torch.Tensor:
    """One transformer block. ``mp``: this rank's model-parallel group (zerospec/model/megatron.py),
    whose ``enter`` (identity forward, all-reduce backward) feeds a column-parallel layer and whose
    ``exit`` (all-reduce forward, identity backward) sums a row-parallel layer's partial outputs
    before its bias is added, as Megatron-LM does; None: the whole block on this rank."""
    if mp is not None:
        return _block_mp(cfg, x, p, mp)
    C = x.shape[-1]
    h = F.layer_norm(x, (C,), p["ln_1.weight"], p["ln_1.bias"])
    y = attention(F.linear(h, p["attn.c_attn.weight"], p["attn.c_attn.bias"]), cfg.n_head)
    x = x + F.linear(y, p["attn.c_proj.weight"], p["attn.c_proj.bias"])
    h = F.layer_norm(x, (C,), p["ln_2.weight"], p["ln_2.bias"])
    h = F.gelu(F.linear(h, p["mlp.c_fc.weight"], p["mlp.c_fc.bias"]))
    return x + F.linear(h, p["mlp.c_proj.weight"], p["mlp.c_proj.bias"])


def _block_mp(cfg: GPTConfig, x: torch.Tensor, p: dict[str, torch.Tensor], mp) -> torch.Tensor:
    C = x.shape[-1]
    h = F.layer_norm(x, (C,), p["ln_1.weight"], p["ln_1.bias"])
    y = attention(F.linear(mp.enter(h), p["attn.c_attn.weight"], p["attn.c_attn.bias"]),
                  cfg.n_head // mp.n_m)                         # this rank's heads
    x = x + (mp.exit(F.linear(y, p["attn.c_proj.weight"])) + p["attn.c_proj.bias"])
    h = F.layer_norm(x, (C,), p["ln_2.weight"], p["ln_2.bias"])
    h = F.gelu(F.linear(mp.enter(h), p["mlp.c_fc.weight"], p["mlp.c_fc.bias"]))
    return x + (mp.exit(F.linear(h, p["mlp.c_proj.weight"])) + p["mlp.c_proj.bias"])


def blocks(cfg: GPTConfig, x: torch.Tensor, fetch, layers: range, mp=None) -> torch.Tensor:
    """Blocks ``layers`` in order, each with its unit's parameters (unit 1 + i for block i)."""
    for i in layers:
        with fetch(1 + i) as p:
            x = block(cfg, x, p, mp)                           # (B, T, C)
    return x


def fetch_order(cfg: GPTConfig) -> list[int]:
    """The units :func:`forward` fetches, in order: embeddings, the blocks, the final LayerNorm,
    and the embeddings again for the tied LM head (backward fetches in reverse)."""
    return [0, *range(1, cfg.n_layer + 1), cfg.n_layer + 1, 0]


def forward(cfg: GPTConfig, idx: torch.Tensor, targets: torch.Tensor, fetch,
            run_blocks=blocks) -> torch.Tensor:
    """Mean cross-entropy of next-token prediction; ``fetch(i)`` yields unit i's parameters.

    ``run_blocks(cfg, x, fetch, layers)`` runs the transformer blocks: :func:`blocks` by default,
    the seam activation checkpointing and model parallelism wrap (zerospec/zero_r/checkpointing.py).
    The embedding, final LayerNorm and tied LM head are whole on every model-parallel rank
    (replicated, not vocab-parallel: spec/model_parallel.md says why)."""
    B, T = idx.shape
    if T > cfg.block_size:
        raise ValueError(f"sequence length {T} exceeds block_size {cfg.block_size}")
    L = cfg.n_layer
    with fetch(0) as p:
        x = F.embedding(idx, p["wte"]) + F.embedding(torch.arange(T, device=idx.device), p["wpe"])
    x = run_blocks(cfg, x, fetch, range(L))                    # (B, T, C)
    with fetch(L + 1) as p:
        x = F.layer_norm(x, (cfg.n_embd,), p["weight"], p["bias"])
    with fetch(0, last=True) as p:                             # LM head tied to wte
        logits = F.linear(x, p["wte"])                         # (B, T, vocab)
    return F.cross_entropy(logits.view(B * T, -1), targets.reshape(-1))
