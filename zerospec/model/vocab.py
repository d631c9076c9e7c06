"""Megatron-LM's vocabulary-parallel embedding and cross-entropy (Shoeybi et al. 2019, §3).

Rank j of N_m holds rows j·V_p/N_m … (j+1)·V_p/N_m of wte (and of an untied head), V_p the padded
vocabulary (:meth:`zerospec.model.family.GPTConfig.padded_vocab`); ``mp`` is its
:class:`zerospec.model.megatron.TensorParallel`, whose collectives go through the comm layer and
are booked on the MP group like the blocks' all-reduces.

* **Embedding**: each rank looks up the ids it holds, zero for the others, and the MP group sums
  (Megatron's *g*: all-reduce forward, identity backward). One term of the sum is the row, the
  rest exact zeros, so every rank gets the bits of the whole table's lookup.
* **LM head**: column-parallel over the vocabulary: *f* on its input (identity forward, all-reduce
  of the gradient backward), each rank's logits for its rows only.
* **Cross-entropy**: this rank's logits upcast to fp32 (at least) as Megatron-LM does, the padded
  columns masked to −∞ (exp gives 0: they never enter the loss, so a padded model trains the
  unpadded one; masked rather than cut off, every MP rank's step has the same shapes, which the
  meta runs' one rank per class relies on); the row max all-reduced with ``max``, Σ exp(z − max)
  with ``sum``, and the target's shifted logit from the one rank that holds it (the others add
  0). Three all-reduces of B·T per micro-batch; backward is local: softmax − one-hot of the
  target where this rank holds it (0 on the padded columns).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def rows(v_p: int, n_m: int, j: int) -> tuple[int, int]:
    """Rank j's rows [start, stop) of a V_p-row table split N_m ways."""
    per = v_p // n_m
    return j * per, (j + 1) * per


def embedding(idx: torch.Tensor, wte: torch.Tensor, mp) -> torch.Tensor:
    """The whole table's lookup from this rank's rows ``wte``: masked local lookup, summed over
    the MP group."""
    start, stop = mp.index * wte.shape[0], (mp.index + 1) * wte.shape[0]
    other = (idx < start) | (idx >= stop)
    x = F.embedding((idx - start).masked_fill(other, 0), wte)
    return mp.exit(x.masked_fill(other.unsqueeze(-1), 0.0))


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, mp, vocab_size: int) -> torch.Tensor:
    """Mean cross-entropy from this rank's (N, V_p/N_m) logits; ``vocab_size`` V: columns at and
    beyond V are padding, masked out."""
    start = mp.index * logits.shape[-1]
    real = max(0, min(logits.shape[-1], vocab_size - start))
    return _CrossEntropy.apply(logits, targets, mp.comm, start, real).mean()


class _CrossEntropy(torch.autograd.Function):
    """Per-token losses log Σ_all exp(z − m) − (z_t − m), m the max over every rank's columns."""

    @staticmethod
    def forward(ctx, logits, target, comm, start, real):
        dt = torch.promote_types(logits.dtype, torch.float32)   # fp16/bf16 up to fp32, as Megatron
        z = logits.to(dt, copy=True)                            # (N, V_p/N_m): this rank's columns
        z[:, real:] = float("-inf")                             # padding: exp(−∞) = 0
        m = z.amax(dim=-1)
        comm.all_reduce(m, "max")                             # the global row max
        z.sub_(m.unsqueeze(-1))
        mine = (target >= start) & (target < start + real)    # the rank that holds the target
        local = (target - start).masked_fill(~mine, 0)
        zt = z.gather(1, local.unsqueeze(-1)).squeeze(-1).masked_fill(~mine, 0.0)
        comm.all_reduce(zt, "sum")                            # z_t − m, from its owner
        e = z.exp_()
        s = e.sum(dim=-1)
        comm.all_reduce(s, "sum")                             # Σ exp(z − m) over the vocabulary
        e.div_(s.unsqueeze(-1))                               # this rank's softmax columns
        ctx.save_for_backward(e, local, mine)
        ctx.dtype = logits.dtype
        return s.log_() - zt

    @staticmethod
    def backward(ctx, grad):
        softmax, local, mine = ctx.saved_tensors
        g = softmax.clone()
        g.scatter_add_(1, local.unsqueeze(-1), -mine.to(g.dtype).unsqueeze(-1))
        g.mul_(grad.unsqueeze(-1))
        return g.to(ctx.dtype), None, None, None, None
