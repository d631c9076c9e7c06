"""Megatron-LM slicing (model/megatron.py) and its operators (parallel/megatron.py), exactly.

The oracle: one process computing, for N_m = 2, each rank's slice of a block with the same kernels
and adding the two row-parallel partial outputs in rank order. Two numbers add the same either way
round, so autograd's sums of the replicated tensors' gradients match the all-reduce's bit for bit:
the two-rank run must equal it exactly, forward and backward.
"""
from __future__ import annotations

import pytest
import torch

from zerospec.cluster.threads import VirtualCluster, torch_threads
from zerospec.model import gpt, megatron
from zerospec.model.gpt import GPTConfig
from zerospec.model.units import psi
from zerospec.model.megatron import TensorParallel
from zerospec.testing.reference import megatron_block

CFG = GPTConfig(vocab_size=37, block_size=12, n_layer=1, n_head=4, n_embd=20)


def _params(seed=1):
    g = torch.Generator().manual_seed(seed)
    full = {n: torch.randn(s, generator=g) * 0.3 for n, s in dict(CFG.unit_spec()[1][1]).items()}
    return full


def _leaves(p):
    return {k: v.clone().requires_grad_(True) for k, v in p.items()}


def _inputs():
    g = torch.Generator().manual_seed(2)
    return torch.randn(2, 12, 20, generator=g), torch.randn(2, 12, 20, generator=g)


def oracle(full, x, dy, n_m=2):
    """The block as rank j of n_m computes it, summed in rank order, in one process (one torch
    thread, as each virtual rank: LayerNorm's backward splits its row sums by thread count)."""
    with torch_threads(1):
        return _oracle(full, x, dy, n_m)


def _oracle(full, x, dy, n_m):
    parts = [_leaves(megatron.shard(CFG, {"h.0": full}, n_m, j)["h.0"]) for j in range(n_m)]
    x = x.clone().requires_grad_(True)
    out = megatron_block(CFG, x, parts)   # replicated parameters from rank 0's copy …
    out.backward(dy)
    return out.detach(), x.grad, parts


def two_ranks(full, x, dy, broken=None):
    def body(ctx):
        p = _leaves(megatron.shard(CFG, {"h.0": full}, 2, ctx.rank)["h.0"])
        xi = x.clone().requires_grad_(True)
        out = gpt.block(CFG, xi, p, TensorParallel(ctx.comm))
        out.backward(dy)
        return out.detach(), xi.grad, p
    return VirtualCluster(2).run(body)


def test_two_mp_ranks_compute_the_megatron_decomposition_bit_for_bit():
    """Outputs, the input's gradient and every parameter slice's gradient equal the one-process
    oracle's exactly, on both ranks (f: identity/all-reduce, g: all-reduce/identity)."""
    full, (x, dy) = _params(), _inputs()
    ref_out, ref_dx, ref_parts = oracle(full, x, dy)
    for j, (out, dx, p) in enumerate(two_ranks(full, x, dy)):
        assert torch.equal(out, ref_out) and torch.equal(dx, ref_dx)
        for name, t in p.items():
            split = name in megatron.SPLIT
            want = ref_parts[j][name].grad if split else ref_parts[0][name].grad
            assert torch.equal(t.grad, want), (j, name)


@pytest.mark.parametrize("n_m", [1, 2, 4])
def test_slices_put_back_together_give_the_model_and_psi_per_rank_is_exact(n_m):
    """unshard(shard) is the identity, and Ψ per MP rank is (V+T)·d + 2d + L·(12d²/N_m + 7d/N_m + 6d)."""
    full = gpt.init_params(CFG, 0)
    parts = [megatron.shard(CFG, full, n_m, j) for j in range(n_m)]
    flat = [{f"{u}/{n}": t for u, ps in q.items() for n, t in ps.items()} for q in parts]
    back = megatron.unshard(CFG, flat)
    assert all(torch.equal(back[f"{u}/{n}"], t) for u, ps in full.items() for n, t in ps.items())
    assert psi(CFG.units(1, n_m=n_m)) == megatron.psi_per_rank(CFG, n_m)
    d, L = CFG.n_embd, CFG.n_layer
    assert megatron.psi_per_rank(CFG, 1) == CFG.psi
    assert megatron.psi_per_rank(CFG, n_m) == (37 + 12) * d + 2 * d + L * (12 * d * d // n_m
                                                                           + 7 * d // n_m + 6 * d)


def test_rank_j_holds_its_heads_rows_of_q_k_and_v():
    """c_attn is [q; k; v]: rank j's slice is its heads' rows of each, in that order."""
    full = {"h.0": _params()}
    w = full["h.0"]["attn.c_attn.weight"]                  # (60, 20): q 0..19, k 20..39, v 40..59
    mine = megatron.shard(CFG, full, 2, 1)["h.0"]["attn.c_attn.weight"]
    assert torch.equal(mine, torch.cat([w[10:20], w[30:40], w[50:60]]))
    assert torch.equal(megatron.shard(CFG, full, 2, 1)["h.0"]["mlp.c_proj.weight"],
                       full["h.0"]["mlp.c_proj.weight"][:, 40:80])


@pytest.mark.parametrize("n_m,match", [(3, "n_m=3 must divide n_head=4"), (0, "integer >= 1"),
                                       (True, "integer >= 1")])
def test_a_model_parallel_degree_that_cannot_split_the_heads_is_refused(n_m, match):
    with pytest.raises(ValueError, match=match):
        CFG.unit_spec(n_m)
