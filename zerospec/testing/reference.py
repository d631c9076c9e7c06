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
