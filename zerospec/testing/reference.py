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


def megatron_block(cfg, x: torch.Tensor, parts: list[dict[str, torch.Tensor]]) -> torch.Tensor:
    """One transformer block as ``len(parts)`` model-parallel ranks compute it, in one process:
    each rank's slice (``parts[j]``, model.megatron.shard's layout) with the same kernels, the
    row-parallel partial outputs added in rank order, then the bias; the replicated parameters
    are read from rank 0's slice. The oracle the MP runs are held to, bit for bit."""
    import torch.nn.functional as F

    n_m, p0, C = len(parts), parts[0], x.shape[-1]

    def rank_sum(outs):
        acc = outs[0]
        for o in outs[1:]:
            acc = acc + o
        return acc
    h = F.layer_norm(x, (C,), p0["ln_1.weight"], p0["ln_1.bias"])
    ys = [gpt.attention(F.linear(h, q["attn.c_attn.weight"], q["attn.c_attn.bias"]),
                        cfg.n_head // n_m) for q in parts]
    x = x + (rank_sum([F.linear(y, q["attn.c_proj.weight"]) for y, q in zip(ys, parts)])
             + p0["attn.c_proj.bias"])
    h = F.layer_norm(x, (C,), p0["ln_2.weight"], p0["ln_2.bias"])
    ms = [F.gelu(F.linear(h, q["mlp.c_fc.weight"], q["mlp.c_fc.bias"])) for q in parts]
    return x + (rank_sum([F.linear(m, q["mlp.c_proj.weight"]) for m, q in zip(ms, parts)])
                + p0["mlp.c_proj.bias"])
