"""The single-process fp32 reference: plain parameters, the whole global batch, torch.optim.Adam.

This is what data parallelism promises to equal. It shares only the model function and the data
with zerospec's stages — no fetcher, no interconnect, no ledger, torch's own Adam — so agreement
with it is evidence, not a tautology. It cannot agree bit for bit: it takes one mean over the whole
global batch where the ranks take a mean per micro-batch and then a mean over ranks, and torch's
Adam orders its floating-point operations differently (see tests/claims/test_equivalence.py for
the tolerance and its derivation).
"""
from __future__ import annotations

import contextlib

import torch

from ..model import gpt
from ..model.data import BigramData


def reference_train(cfg) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Train ``cfg.model`` for ``cfg.steps`` steps on one process in fp32 → (losses, weights)."""
    from ..optim.adam import reference_optimizer

    init = gpt.init_params(cfg.model, cfg.seed)
    params = {u: {n: torch.nn.Parameter(t.clone()) for n, t in ps.items()} for u, ps in init.items()}
    order = [u for u, _ in cfg.model.unit_spec()]

    @contextlib.contextmanager
    def fetch(i, last=False):
        yield params[order[i]]

    opt = reference_optimizer([p for ps in params.values() for p in ps.values()], cfg.adam)
    data = BigramData(cfg.model.vocab_size, cfg.model.block_size, cfg.seed)
    losses = []
    for step in range(cfg.steps):
        idx, tgt = data.batch(step, cfg.batch)
        opt.zero_grad(set_to_none=True)
        loss = gpt.forward(cfg.model, idx, tgt, fetch)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    weights = {f"{u}/{n}": p.detach().clone() for u, ps in params.items() for n, p in ps.items()}
    return losses, weights


class _FanOut(torch.autograd.Function):
    """Megatron's f for ``n`` ranks in one process: ``n`` views of x forward; backward, each
    rank's whole gradient (its own uses summed by autograd, as on the rank) added in rank order,
    as the MP all-reduce adds them (with SwiGLU a rank uses its input twice, so autograd's one
    flat sum over every use would round differently)."""

    @staticmethod
    def forward(ctx, x, n):
        return tuple(x.view_as(x) for _ in range(n))

    @staticmethod
    def backward(ctx, *grads):
        acc = grads[0]
        for g in grads[1:]:
            acc = acc + g
        return acc, None


def megatron_block(cfg, x: torch.Tensor, parts: list[dict[str, torch.Tensor]]) -> torch.Tensor:
    """One transformer block as ``len(parts)`` model-parallel ranks compute it, in one process:
    each rank's slice (``parts[j]``, model.megatron.shard's layout) with the same kernels, the
    row-parallel partial outputs added in rank order, then the bias; the replicated parameters
    are read from rank 0's slice. Any member of the family (norm, MLP, kv heads, RoPE, biases as
    ``cfg`` sets them). The oracle the MP runs are held to, bit for bit."""
    import torch.nn.functional as F

    n_m, p0 = len(parts), parts[0]

    def rank_sum(outs):
        acc = outs[0]
        for o in outs[1:]:
            acc = acc + o
        return acc

    def ln(x, prefix):
        return gpt.norm(cfg.norm, x, p0[prefix + "weight"], p0.get(prefix + "bias"), cfg.norm_eps)

    def row(outs, bias):
        acc = rank_sum(outs)
        return acc if bias is None else acc + bias
    rope = cfg.rope_theta if cfg.positions == "rope" else None
    hs = _FanOut.apply(ln(x, "ln_1."), n_m)
    ys = [gpt.attention(F.linear(h, q["attn.c_attn.weight"], q.get("attn.c_attn.bias")),
                        cfg.n_head // n_m, cfg.kv_heads // n_m, rope) for h, q in zip(hs, parts)]
    x = x + row([F.linear(y, q["attn.c_proj.weight"]) for y, q in zip(ys, parts)],
                p0.get("attn.c_proj.bias"))
    hs = _FanOut.apply(ln(x, "ln_2."), n_m)
    if cfg.mlp == "swiglu":
        ms = [gpt.swiglu(h, q["mlp.c_gate.weight"], q["mlp.c_fc.weight"], q.get("mlp.c_gate.bias"),
                         q.get("mlp.c_fc.bias")) for h, q in zip(hs, parts)]
    else:
        ms = [F.gelu(F.linear(h, q["mlp.c_fc.weight"], q.get("mlp.c_fc.bias"))) for h, q in zip(hs, parts)]
    return x + row([F.linear(m, q["mlp.c_proj.weight"]) for m, q in zip(ms, parts)],
                   p0.get("mlp.c_proj.bias"))


def vocab_parallel_loss(logits: list[torch.Tensor], targets: torch.Tensor,
                        vocab_size: int) -> torch.Tensor:
    """Megatron-LM's vocabulary-parallel cross-entropy as ``len(logits)`` ranks compute it, in one
    process: ``logits[j]`` rank j's (N, V_p/N_m) columns, in fp32 with the padded ones (global
    column ≥ V) at −∞; the row max over the ranks, each rank's Σ exp(z − max) and its shifted
    target logit (0 where it does not hold the target) added in rank order, as the MP all-reduces
    add them. The oracle the MP runs' first loss is held to, bit for bit (model/vocab.py computes
    it on the ranks)."""
    per = logits[0].shape[-1]
    zs = []
    for j, l in enumerate(logits):
        z = l.to(torch.promote_types(l.dtype, torch.float32), copy=True)
        z[:, max(0, min(per, vocab_size - j * per)):] = float("-inf")
        zs.append(z)
    m = zs[0].amax(-1)
    for z in zs[1:]:
        m = torch.maximum(m, z.amax(-1))
    zt, s = 0, 0
    for j, z in enumerate(zs):
        mine = (targets >= j * per) & (targets < min(vocab_size, (j + 1) * per))
        shifted = z - m.unsqueeze(-1)
        local = (targets - j * per).masked_fill(~mine, 0).unsqueeze(-1)
        zt = zt + shifted.gather(1, local).squeeze(-1).masked_fill(~mine, 0.0)
        s = s + shifted.exp().sum(-1)
    return (s.log() - zt).mean()
