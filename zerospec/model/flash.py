"""The memory-efficient attention kernel (``GPTConfig.attention = "sdpa"``): what it keeps for
backward is FlashAttention-2's, its arithmetic is the written-out kernel's.

What the kernel keeps comes from its sources: FlashAttention-2's autograd function saves q, k, v,
the output and the log-sum-exp of each query row (Dao-AILab/flash-attention,
flash_attn/flash_attn_interface.py, ``FlashAttnFunc.forward``: ``save_for_backward(q, k, v,
out_padded, softmax_lse, rng_state)``; k and v at their own kv heads, grouped-query attention
needing no repeat); PyTorch's ``_scaled_dot_product_flash_attention`` backward takes the same
five (tools/autograd/derivatives.yaml) and its meta kernel allocates the log-sum-exp as
(B, H, T) fp32 beside an output shaped like the query (torch/_meta_registrations.py,
``meta__scaled_dot_product_flash_attention``). Neither keeps the B·H·T² scores or probabilities.

No such kernel runs here, so its memory is *modelled*: :class:`Flash` saves those five tensors
and nothing else. On real tensors its forward runs the written-out ops
(:func:`zerospec.model.layers.core`) without autograd and its backward runs them again with
autograd and differentiates that recompute at once, so its outputs and gradients are the eager
kernel's bit for bit (same ops, same order, same inputs: the argument of activation
checkpointing, zerospec/zero_r/checkpointing.py). The recompute's own tensors are the kernel's
workspace, transient inside one backward call, and never reach the step's saved-tensor ledger.
On meta nothing is computed: forward allocates the output and the log-sum-exp, backward the
three gradients; FlashAttention's tiles and workspace are not modelled, and torch's FLOP counter
sees no attention matmuls.
"""
from __future__ import annotations

import math
import threading

import torch

from .layers import attention, core, heads


def _same(t: torch.Tensor) -> torch.Tensor:
    return t


class Flash(torch.autograd.Function):
    """Causal attention saving q, k, v, the output and the per-row log-sum-exp (fp32, B·H·T)."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        hooks = kernel_hooks()
        out, lse = hooks[-1](_kernel, q, k, v) if hooks else _kernel(q, k, v)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, dout: torch.Tensor):
        q, k, v, _out, _lse = ctx.saved_tensors
        if q.device.type == "meta":
            return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        # the recompute's saved tensors are this call's workspace: identity hooks keep them out
        # of the step's saved-tensor ledger (the innermost hooks are the ones autograd uses)
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(_same, _same):
            inputs = tuple(t.detach().requires_grad_(True) for t in (q, k, v))
            out = core(*inputs)
            return torch.autograd.grad(out, inputs, dout)


def _kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's outputs: the attention output (B, T, H·hd) and the log-sum-exp (B, H, T)."""
    B, H, T, hd = q.shape
    if q.device.type == "meta":
        return (q.new_empty((B, T, H * hd)),
                torch.empty((B, H, T), dtype=torch.float32, device=q.device))
    return core(q, k, v), _logsumexp(q, k)


_LOCAL = threading.local()


def kernel_hooks() -> list:
    """Who runs the kernel in this thread (a rank: zerospec/cluster/threads.py), innermost last:
    ``hook(kernel, q, k, v)`` returns its outputs. Activation checkpointing's per-op policy
    (zerospec/zero_r/selective.py) keeps them in forward and hands them back in its recompute,
    as torch's selective checkpointing does for the flash SDPA op; like torch's dispatch modes,
    the stack is the thread's own."""
    if not hasattr(_LOCAL, "hooks"):
        _LOCAL.hooks = []
    return _LOCAL.hooks


def _logsumexp(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """log Σ_j exp(s_ij) over each query row's unmasked scores s = q·kᵀ/√hd, in fp32 (B, H, T)."""
    H, T, hd = q.shape[1], q.shape[2], q.shape[3]
    if k.shape[1] != H:
        k = k.repeat_interleave(H // k.shape[1], dim=1)
    s = (q.float() @ k.float().transpose(-2, -1)) * (1.0 / math.sqrt(hd))
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    return torch.logsumexp(s.masked_fill(mask, float("-inf")), dim=-1)


def attend(qkv: torch.Tensor, n_head: int, n_kv_head: int | None = None,
           rope_theta: float | None = None, kernel: str = "eager") -> torch.Tensor:
    """Causal self-attention from the fused projection (zerospec/model/layers.py's
    ``attention``) by ``kernel``: "eager" (autograd through every op) or "sdpa" (:class:`Flash`:
    the same ops, saving q, k, v, the output and the per-row log-sum-exp only)."""
    if kernel == "eager":
        return attention(qkv, n_head, n_kv_head, rope_theta)
    q, k, v = heads(qkv, n_head, n_kv_head, rope_theta)
    if rope_theta is not None:
        # q and k are RoPE's own tensors, so v alone would keep the fused projection's whole
        # storage alive as a view of it; Llama's family projects v on its own (v_proj), which is
        # what the kernel keeps: v as a tensor of its own
        v = v.contiguous()
    return Flash.apply(q, k, v)


KEPT = ("q", "k", "v", "out", "lse")   # what the kernel saves per layer, in its sources' order


def saved_bytes(B: int, T: int, n_head: int, n_kv: int, hd: int, itemsize: int) -> dict[str, int]:
    """The bytes the kernel keeps per layer by tensor (the log-sum-exp fp32, the rest in the
    compute dtype of ``itemsize`` bytes)."""
    return {"q": B * n_head * T * hd * itemsize, "k": B * n_kv * T * hd * itemsize,
            "v": B * n_kv * T * hd * itemsize, "out": B * T * n_head * hd * itemsize,
            "lse": B * n_head * T * 4}
