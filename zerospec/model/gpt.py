"""A tiny GPT, nanoGPT-shaped, written as a function of its parameters.

The model never owns parameters: each layer asks ``fetch(unit_index)`` for its unit's parameters
(a context manager yielding name → tensor views). Where those come from — a resident replica, or an
all-gather just in time — is the ZeRO stage's business; the math here is the same in every stage,
which is what makes the stages bit-identical (design property 3).

Attention is ``cfg.attention``'s kernel: written out ("eager", so torch's FLOP formulas count it:
on CPU, SDPA's default kernel has no FLOP formula and would count attention as 0), or "sdpa", the
same ops keeping only what FlashAttention-2 keeps (zerospec/model/flash.py).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .family import ODD, SMALL, DecoderConfig, GPTConfig, check_mp, check_tiles
from .flash import attend
from .layers import attention, norm, rms_norm, rope, rope_tables, swiglu
from . import vocab

__all__ = ["GPTConfig", "DecoderConfig", "SMALL", "ODD", "check_mp", "check_tiles", "init_params", "tile_params", "tiled_mlp", "tiled_block", "attention",
           "rms_norm", "swiglu", "rope", "rope_tables", "block", "blocks", "fetch_order", "forward",
           "loss"]


def init_params(cfg: GPTConfig, seed: int, tiles: int = 1) -> dict[str, dict[str, torch.Tensor]]:
    """nanoGPT's initialisation in fp32: N(0, 0.02) weights, residual projections scaled by
    1/sqrt(2L), zero biases, unit norm gains (the same draws, in unit order, for every member of
    the family: SwiGLU's gate and an untied LM head draw N(0, 0.02) where they stand). Returns
    unit name → param name → tensor; with ``tiles`` T > 1 the same values in the tiled units
    (:func:`tile_params`)."""
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
    return out if tiles == 1 else tile_params(cfg, out, tiles)


def tile_params(cfg: GPTConfig, init: dict, tiles: int) -> dict[str, dict[str, torch.Tensor]]:
    """The untiled ``init`` laid out in ``cfg.unit_spec(tiles=tiles)``'s units: the same values
    (tiling moves parameters, it draws none), tile k taking rows [k·f/T, (k+1)·f/T) of c_gate and
    c_fc and those columns of c_proj's weight."""
    ft, out = cfg.ff // tiles, {}
    for uname, params in cfg.unit_spec(tiles=tiles):
        blk, _, k = uname.partition(".mlp")
        src = init[blk if k else uname]
        if not k:
            out[uname] = {n: src[n] for n, _ in params}
            continue
        rows = slice(int(k) * ft, (int(k) + 1) * ft)
        out[uname] = {n: (src[n][:, rows] if n == "mlp.c_proj.weight" else src[n][rows]).clone()
                      for n, _ in params}
    return out


def _attn(cfg: GPTConfig, h: torch.Tensor, p: dict[str, torch.Tensor], n_m: int = 1) -> torch.Tensor:
    """Attention of this rank's heads (all of them when n_m = 1), before the output projection."""
    return attend(F.linear(h, p["attn.c_attn.weight"], p.get("attn.c_attn.bias")),
                     cfg.n_head // n_m, cfg.kv_heads // n_m,
                     cfg.rope_theta if cfg.positions == "rope" else None, cfg.attention)


def _mlp_in(cfg: GPTConfig, h: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
    """The MLP up to its down projection: gelu(c_fc(h)), or SwiGLU's silu(c_gate(h)) * c_fc(h)."""
    if cfg.mlp == "swiglu":
        return swiglu(h, p["mlp.c_gate.weight"], p["mlp.c_fc.weight"], p.get("mlp.c_gate.bias"),
                      p.get("mlp.c_fc.bias"))
    return F.gelu(F.linear(h, p["mlp.c_fc.weight"], p.get("mlp.c_fc.bias")))


def _norm(cfg: GPTConfig, x: torch.Tensor, p: dict[str, torch.Tensor], prefix: str) -> torch.Tensor:
    return norm(cfg.norm, x, p[prefix + "weight"], p.get(prefix + "bias"), cfg.norm_eps)


def block(cfg: GPTConfig, x: torch.Tensor, p: dict[str, torch.Tensor], mp=None) -> torch.Tensor:
    """One pre-norm transformer block. ``mp``: this rank's model-parallel group
    (zerospec/model/megatron.py), whose ``enter`` (identity forward, all-reduce backward) feeds a
    column-parallel layer and whose ``exit`` (all-reduce forward, identity backward) sums a
    row-parallel layer's partial outputs before its bias is added, as Megatron-LM does; None: the
    whole block on this rank."""
    if mp is not None:
        return _block_mp(cfg, x, p, mp)
    # each tensor lives as long as before the family (h until the next norm's output exists):
    # the allocator model and the memory observer see the same lives (tests/claims/test_allocator.py)
    h = _norm(cfg, x, p, "ln_1.")
    y = _attn(cfg, h, p)
    x = x + F.linear(y, p["attn.c_proj.weight"], p.get("attn.c_proj.bias"))
    h = _norm(cfg, x, p, "ln_2.")
    h = _mlp_in(cfg, h, p)
    return x + F.linear(h, p["mlp.c_proj.weight"], p.get("mlp.c_proj.bias"))


def _row_out(mp, y: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """A row-parallel layer: partial outputs summed over the MP group, then the whole bias."""
    out = mp.exit(F.linear(y, w))
    return out if b is None else out + b


def _block_mp(cfg: GPTConfig, x: torch.Tensor, p: dict[str, torch.Tensor], mp) -> torch.Tensor:
    h = _norm(cfg, x, p, "ln_1.")
    y = _attn(cfg, mp.enter(h), p, mp.n_m)                            # this rank's heads
    x = x + _row_out(mp, y, p["attn.c_proj.weight"], p.get("attn.c_proj.bias"))
    h = _norm(cfg, x, p, "ln_2.")
    h = _mlp_in(cfg, mp.enter(h), p)
    return x + _row_out(mp, h, p["mlp.c_proj.weight"], p.get("mlp.c_proj.bias"))


def tiled_mlp(cfg: GPTConfig, h: torch.Tensor, fetch, first: int, tiles: int,
              bias: torch.Tensor | None, mp=None) -> torch.Tensor:
    """The MLP in ``tiles`` tiles along d_ff (C-I3): tile k's weights (unit ``first + k``) are
    fetched just before its slice of the MLP runs and let go right after; the down projection's
    partial outputs are summed in tile order, then its bias is added — a different summation
    order from one matmul, held to spec/infinity.md's derived bound."""
    acc = None
    for k in range(tiles):
        with fetch(first + k) as q:
            part = F.linear(_mlp_in(cfg, h, q), q["mlp.c_proj.weight"])
        acc = part if acc is None else acc + part
    if mp is not None:   # row-parallel: this rank's tiles are its slice of d_ff, summed over MP
        acc = mp.exit(acc)
    return acc if bias is None else acc + bias


def tiled_block(cfg: GPTConfig, x: torch.Tensor, p: dict[str, torch.Tensor], fetch, first: int,
                tiles: int, mp=None) -> torch.Tensor:
    """:func:`block` with its MLP tiled (:func:`tiled_mlp`, tiles in units ``first``, …); with
    ``mp``, Megatron's block whose MLP slice is tiled."""
    h = _norm(cfg, x, p, "ln_1.")
    if mp is None:
        y = _attn(cfg, h, p)
        x = x + F.linear(y, p["attn.c_proj.weight"], p.get("attn.c_proj.bias"))
    else:
        y = _attn(cfg, mp.enter(h), p, mp.n_m)                        # this rank's heads
        x = x + _row_out(mp, y, p["attn.c_proj.weight"], p.get("attn.c_proj.bias"))
    h = _norm(cfg, x, p, "ln_2.")
    return x + tiled_mlp(cfg, h if mp is None else mp.enter(h), fetch, first, tiles,
                         p.get("mlp.c_proj.bias"), mp)


def blocks(cfg: GPTConfig, x: torch.Tensor, fetch, layers: range, mp=None,
           tiles: int = 1) -> torch.Tensor:
    """Blocks ``layers`` in order, each with its unit's parameters (unit 1 + i for block i; with
    ``tiles`` T > 1, 1 + i·(1 + T), its MLP's tiles the T units after it)."""
    for i in layers:
        u = 1 + i * (1 + tiles) if tiles > 1 else 1 + i
        with fetch(u) as p:
            x = (block(cfg, x, p, mp) if tiles == 1                          # (B, T, C)
                 else tiled_block(cfg, x, p, fetch, u + 1, tiles, mp))
    return x


def fetch_order(cfg: GPTConfig, tiles: int = 1) -> list[int]:
    """The units :func:`forward` fetches, in order: embeddings, the blocks (each followed by its
    MLP's tiles), the final norm, and the LM head: the embeddings again when tied, else its own
    unit (backward fetches in reverse)."""
    n = cfg.n_layer * (1 + tiles if tiles > 1 else 1)
    return [0, *range(1, n + 1), n + 1, 0 if cfg.tie_embeddings else n + 2]


def _lookup(idx: torch.Tensor, wte: torch.Tensor, mp) -> torch.Tensor:
    """The token embedding: the whole table's, or (``mp``) this rank's rows summed over MP."""
    return F.embedding(idx, wte) if mp is None else vocab.embedding(idx, wte, mp)


def forward(cfg: GPTConfig, idx: torch.Tensor, targets: torch.Tensor, fetch,
            run_blocks=blocks, mp=None, tiles: int = 1) -> torch.Tensor:
    """Mean cross-entropy of next-token prediction; ``fetch(i)`` yields unit i's parameters.

    ``run_blocks(cfg, x, fetch, layers, tiles=…)`` runs the transformer blocks: :func:`blocks` by default,
    the seam activation checkpointing and model parallelism wrap (zerospec/zero_r/checkpointing.py).
    ``mp``: this rank's model-parallel group, whose rows of the vocabulary the embedding, the LM
    head and the cross-entropy use as Megatron-LM does (zerospec/model/vocab.py); None: the whole
    vocabulary here. ``tiles``: the MLP tiles of :func:`tiled_block` (1: none)."""
    B, T = idx.shape
    if T > cfg.block_size:
        raise ValueError(f"sequence length {T} exceeds block_size {cfg.block_size}")
    L = cfg.n_layer
    n = L * (1 + tiles) if tiles > 1 else L        # the block units (and tiles) after unit 0
    with fetch(0) as p:                                        # one expression: the lookup is a
        if cfg.positions == "learned":                         # temporary, freed as before
            x = _lookup(idx, p["wte"], mp) + F.embedding(torch.arange(T, device=idx.device), p["wpe"])
        else:
            x = _lookup(idx, p["wte"], mp)                     # (B, T, C)
    x = run_blocks(cfg, x, fetch, range(L), tiles=tiles)       # (B, T, C)
    with fetch(n + 1) as p:
        x = _norm(cfg, x, p, "")
    head, name = (0, "wte") if cfg.tie_embeddings else (n + 2, "weight")
    with fetch(head, last=True) as p:                          # LM head (tied: wte)
        logits = F.linear(x if mp is None else mp.enter(x), p[name])   # (B, T, vocab / N_m)
    if mp is None:   # fp32 logits into the loss, as its owners compute it (:func:`loss`)
        return loss(logits.view(B * T, -1), targets.reshape(-1))
    return vocab.cross_entropy(logits.view(B * T, -1), targets.reshape(-1), mp, cfg.vocab_size)


def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of (N, V) logits, upcast to fp32 first, as the frameworks that train
    these models compute it: torchtitan's ``loss_fn`` (``cross_entropy(pred.flatten(0, 1)
    .float(), …)``, torchtitan/train.py @9dec370), Hugging Face's ``ForCausalLMLoss``
    (``logits.float()``, src/transformers/loss/loss_utils.py) and Megatron-LM (``output.float()``
    unless ``--fp16-lm-cross-entropy``, megatron/model/gpt_model.py
    ``post_language_model_processing``). In fp16/bf16 compute the fp32 copy is a transient,
    log_softmax saves its fp32 result and backward's ``_log_softmax_backward_data`` makes fp32
    gradients of the logits' size; fp32 logits (a CPU run) pass through unchanged: ``.float()``
    returns the same tensor, so no bit moves."""
    return F.cross_entropy(logits.float(), targets)
