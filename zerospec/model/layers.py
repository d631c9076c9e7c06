"""The decoder family's layers as plain functions of tensors: the norms, the MLPs, RoPE and
causal (grouped-query) attention. fp32 compute, as the model. Attention is one of two kernels
(GPTConfig.attention, zerospec/model/flash.py's ``attend``): "eager", written out, so autograd keeps each layer's B·H·T²
scores and probabilities and torch's FLOP formulas count it (on CPU SDPA's default kernel has no
FLOP formula); or "sdpa", the same math run as a memory-efficient kernel that keeps only what
FlashAttention-2 keeps for backward (zerospec/model/flash.py)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm (Zhang & Sennrich 2019, Llama): x / sqrt(mean(x²) + eps) · weight, over the last dim."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def norm(kind: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
         eps: float) -> torch.Tensor:
    """``kind`` = "layernorm" (GPT-2; ``bias`` may be None) or "rmsnorm" (no bias)."""
    if kind == "rmsnorm":
        return rms_norm(x, weight, eps)
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def swiglu(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, gate_bias=None,
           up_bias=None) -> torch.Tensor:
    """SwiGLU's inner part (Shazeer 2020, Llama): silu(gate(x)) * up(x); the down projection follows."""
    return F.silu(F.linear(x, gate, gate_bias)) * F.linear(x, up, up_bias)


def rope_tables(T: int, head_dim: int, theta: float, device=None,
                dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, (T, head_dim), of position t · θ^(−2i/head_dim) for the rotate-half layout:
    frequency i sits at columns i and i + head_dim/2 (Hugging Face's Llama). Computed in fp32,
    returned in ``dtype`` (the compute dtype: fp16 on meta)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    freqs = torch.outer(torch.arange(T, device=device, dtype=torch.float32), inv_freq)  # (T, hd/2)
    emb = torch.cat((freqs, freqs), dim=-1)                                             # (T, hd)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding (Su et al. 2021) on (B, heads, T, hd), per head: the pair
    (x_i, x_{i+hd/2}) rotated by angle t·θ_i."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def attention(qkv: torch.Tensor, n_head: int, n_kv_head: int | None = None,
              rope_theta: float | None = None) -> torch.Tensor:
    """Causal self-attention from the fused [q; k; v] projection: (B, T, (H + 2·H_kv)·hd) →
    (B, T, H·hd). Grouped-query: kv head j serves query heads j·g … (j+1)·g − 1, g = H/H_kv
    (repeat_interleave, as Llama's repeat_kv). ``rope_theta``: rotate q and k (RoPE) first.
    The eager kernel: autograd through every op (zerospec/model/flash.py's ``attend`` picks it
    or the memory-efficient one)."""
    return core(*heads(qkv, n_head, n_kv_head, rope_theta))


def heads(qkv: torch.Tensor, n_head: int, n_kv_head: int | None = None,
          rope_theta: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q (B, H, T, hd), k and v (B, H_kv, T, hd) from the fused projection, q and k rotated."""
    n_kv = n_head if n_kv_head is None else n_kv_head
    B, T = qkv.shape[0], qkv.shape[1]
    hd = qkv.shape[2] // (n_head + 2 * n_kv)
    C = n_head * hd
    # GPT-2 (H_kv = H) keeps its equal split: the same op, so the same kernels and op counts
    q, k, v = qkv.split(C, dim=2) if n_kv == n_head else qkv.split([C, n_kv * hd, n_kv * hd], dim=2)
    q = q.view(B, T, n_head, hd).transpose(1, 2)             # (B, nh, T, hd)
    k = k.view(B, T, n_kv, hd).transpose(1, 2)               # (B, n_kv, T, hd)
    v = v.view(B, T, n_kv, hd).transpose(1, 2)
    if rope_theta is not None:
        cos, sin = rope_tables(T, hd, rope_theta, qkv.device, qkv.dtype)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
    return q, k, v


def core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(mask(q·kᵀ/√hd))·v for q (B, H, T, hd), k and v (B, H_kv, T, hd) → (B, T, H·hd)."""
    B, n_head, T, hd = q.shape
    n_kv = k.shape[1]
    if n_kv != n_head:                                       # (B, nh, T, hd)
        k = k.repeat_interleave(n_head // n_kv, dim=1)
        v = v.repeat_interleave(n_head // n_kv, dim=1)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))  # (B, nh, T, T)
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    att = F.softmax(att.masked_fill(mask, float("-inf")), dim=-1)
    return (att @ v).transpose(1, 2).contiguous().view(B, T, n_head * hd)  # (B, T, C)
