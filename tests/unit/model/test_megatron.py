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
# the family (as tests/unit/model/test_family.py's, one block): d = 24, hd = 6 (RoPE: even)
LLAMA = GPTConfig(vocab_size=37, block_size=12, n_layer=1, n_head=4, n_embd=24, n_kv_head=2,
                  norm="rmsnorm", mlp="swiglu", d_ff=36, positions="rope", tie_embeddings=False,
                  bias=False)
QWEN2 = GPTConfig(vocab_size=37, block_size=12, n_layer=1, n_head=4, n_embd=24, n_kv_head=2,
                  norm="rmsnorm", norm_eps=1e-6, mlp="swiglu", d_ff=36, positions="rope",
                  rope_theta=1e6, tie_embeddings=False, bias=False, qkv_bias=True)
# Mistral-Nemo's head_dim (4 × 8 = 32 != 24) with Llama's attention_bias and mlp_bias
NEMO_BIASED = GPTConfig(vocab_size=37, block_size=12, n_layer=1, n_head=4, n_embd=24, n_kv_head=2,
                        d_head=8, norm="rmsnorm", mlp="swiglu", d_ff=36, positions="rope",
                        tie_embeddings=False, bias=False, qkv_bias=True, o_bias=True, mlp_bias=True)
FAMILY = {"gpt2": CFG, "llama": LLAMA, "qwen2": QWEN2, "head-dim-biases": NEMO_BIASED}


def _params(seed=1, cfg=CFG):
    g = torch.Generator().manual_seed(seed)
    full = {n: torch.randn(s, generator=g) * 0.3 for n, s in dict(cfg.unit_spec()[1][1]).items()}
    return full


def _leaves(p):
    return {k: v.clone().requires_grad_(True) for k, v in p.items()}


def _inputs(d=20):
    g = torch.Generator().manual_seed(2)
    return torch.randn(2, 12, d, generator=g), torch.randn(2, 12, d, generator=g)


def oracle(full, x, dy, n_m=2, cfg=CFG):
    """The block as rank j of n_m computes it, summed in rank order, in one process (one torch
    thread, as each virtual rank: LayerNorm's backward splits its row sums by thread count)."""
    with torch_threads(1):
        return _oracle(full, x, dy, n_m, cfg)


def _oracle(full, x, dy, n_m, cfg):
    parts = [_leaves(megatron.shard(cfg, {"h.0": full}, n_m, j)["h.0"]) for j in range(n_m)]
    x = x.clone().requires_grad_(True)
    out = megatron_block(cfg, x, parts)   # replicated parameters from rank 0's copy …
    out.backward(dy)
    return out.detach(), x.grad, parts


def two_ranks(full, x, dy, broken=None, cfg=CFG):
    def body(ctx):
        p = _leaves(megatron.shard(cfg, {"h.0": full}, 2, ctx.rank)["h.0"])
        xi = x.clone().requires_grad_(True)
        out = gpt.block(cfg, xi, p, TensorParallel(ctx.comm))
        out.backward(dy)
        return out.detach(), xi.grad, p
    return VirtualCluster(2).run(body)


@pytest.mark.parametrize("family", list(FAMILY))
def test_two_mp_ranks_compute_the_megatron_decomposition_bit_for_bit(family):
    """Outputs, the input's gradient and every parameter slice's gradient equal the one-process
    oracle's exactly, on both ranks (f: identity/all-reduce, g: all-reduce/identity) — GPT-2's
    block and the family's (RMSNorm, SwiGLU, GQA, RoPE, no bias; Qwen2's q/k/v biases)."""
    cfg = FAMILY[family]
    full, (x, dy) = _params(cfg=cfg), _inputs(cfg.n_embd)
    ref_out, ref_dx, ref_parts = oracle(full, x, dy, cfg=cfg)
    for j, (out, dx, p) in enumerate(two_ranks(full, x, dy, cfg=cfg)):
        assert torch.equal(out, ref_out) and torch.equal(dx, ref_dx)
        for name, t in p.items():
            split = name in megatron.SPLIT
            want = ref_parts[j][name].grad if split else ref_parts[0][name].grad
            assert torch.equal(t.grad, want), (j, name)


@pytest.mark.parametrize("n_m", [1, 2, 4])
def test_slices_put_back_together_give_the_model_and_psi_per_rank_is_exact(n_m):
    """unshard(shard) is the identity, and Ψ per MP rank is
    V_p·d/N_m + T·d + 2d + L·(12d²/N_m + 7d/N_m + 6d), V_p = 37 padded to 128·N_m (V at N_m = 1)."""
    full = gpt.init_params(CFG, 0)
    parts = [megatron.shard(CFG, full, n_m, j) for j in range(n_m)]
    flat = [{f"{u}/{n}": t for u, ps in q.items() for n, t in ps.items()} for q in parts]
    back = megatron.unshard(CFG, flat)
    assert all(torch.equal(back[f"{u}/{n}"], t) for u, ps in full.items() for n, t in ps.items())
    assert psi(CFG.units(1, n_m=n_m)) == megatron.psi_per_rank(CFG, n_m)
    d, L = CFG.n_embd, CFG.n_layer
    assert megatron.psi_per_rank(CFG, 1) == CFG.psi
    v_p = {1: 37, 2: 256, 4: 512}[n_m]
    assert CFG.padded_vocab(n_m) == v_p
    assert megatron.psi_per_rank(CFG, n_m) == (v_p // n_m + 12) * d + 2 * d + L * (
        12 * d * d // n_m + 7 * d // n_m + 6 * d)


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


# -- the family: SwiGLU, GQA, RMSNorm, RoPE, untied head, q/k/v biases -----------------------------
@pytest.mark.parametrize("family,n_m", [("llama", 1), ("llama", 2), ("qwen2", 2)])
def test_the_familys_slices_put_back_together_give_the_model(family, n_m):
    """unshard(shard) is the identity for every parameter of a Llama / Qwen2 block and the
    untied head, and each rank's shapes are unit_spec(n_m)'s."""
    cfg = FAMILY[family]
    full = gpt.init_params(cfg, 0)
    full = {u: {n: torch.randn_like(t) for n, t in ps.items()} for u, ps in full.items()}
    parts = [megatron.shard(cfg, full, n_m, j) for j in range(n_m)]
    for q in parts:
        assert [(u, [(n, tuple(t.shape)) for n, t in ps.items()]) for u, ps in q.items()] == \
            [(u, list(ps)) for u, ps in cfg.unit_spec(n_m)]
    flat = [{f"{u}/{n}": t for u, ps in q.items() for n, t in ps.items()} for q in parts]
    back = megatron.unshard(cfg, flat)
    assert back.keys() == {f"{u}/{n}" for u, ps in full.items() for n in ps}
    assert all(torch.equal(back[f"{u}/{n}"], t) for u, ps in full.items() for n, t in ps.items())


def test_rank_j_holds_its_query_heads_and_its_kv_heads_and_its_part_of_gate_and_up():
    """GQA (H = 4, KV = 2, hd = 6): c_attn is [q (24 rows); k (12); v (12)]; rank 1 of 2 holds
    query heads 2–3 (q rows 12..23), kv head 1 (k rows 30..35, v rows 42..47) — and the q/k/v
    biases (Qwen2) the same rows; gate and up rows 18..35 of d_ff = 36, down columns 18..35."""
    full = {"h.0": _params(cfg=QWEN2)}
    p, mine = full["h.0"], megatron.shard(QWEN2, full, 2, 1)["h.0"]
    for name in ("attn.c_attn.weight", "attn.c_attn.bias"):
        w = p[name]
        assert w.shape[0] == 48
        assert torch.equal(mine[name], torch.cat([w[12:24], w[30:36], w[42:48]])), name
    for name in ("mlp.c_gate.weight", "mlp.c_fc.weight"):
        assert torch.equal(mine[name], p[name][18:36]), name
    assert torch.equal(mine["mlp.c_proj.weight"], p["mlp.c_proj.weight"][:, 18:36])
    assert torch.equal(mine["attn.c_proj.weight"], p["attn.c_proj.weight"][:, 12:24])
    for name in ("ln_1.weight", "ln_2.weight"):
        assert torch.equal(mine[name], p[name])


@pytest.mark.parametrize("family,n_m", [("gpt2", 2), ("gpt2", 4), ("llama", 2), ("qwen2", 2),
                                      ("head-dim-biases", 2)])
def test_psi_summed_over_mp_ranks_counts_the_replicated_parts_n_m_times(family, n_m):
    """Σ_j Ψ_j = Ψ + (N_m − 1)·Ψ_replicated + the padding rows, Ψ_replicated written from the
    shapes: the position table (GPT-2), the final norm, and per block the two norms and the two
    row-parallel biases (GPT-2: LayerNorm weight + bias; Llama / Qwen2: RMSNorm weight, no bias;
    with Llama's attention_bias and mlp_bias: o_proj's and down_proj's);
    the padding: V_p − V rows of wte (and of an untied head), V_p = 128·N_m here."""
    cfg = FAMILY[family]
    V, T, d = 37, 12, cfg.n_embd
    replicated = {"gpt2": T * d + 2 * d + 1 * (2 * 2 * d + 2 * d),
                  "llama": d + 1 * (2 * d),
                  "qwen2": d + 1 * (2 * d),
                  "head-dim-biases": d + 1 * (2 * d + 2 * d)}[family]   # + o_proj, down biases
    padding = (128 * n_m - V) * d * (1 if family == "gpt2" else 2)
    assert megatron.psi_per_rank(cfg, 1) == cfg.psi and megatron.psi_padding(cfg, 1) == 0
    assert megatron.psi_padding(cfg, n_m) == padding
    assert sum(megatron.psi_padding(cfg, n_m, j) for j in range(n_m)) == padding
    assert n_m * megatron.psi_per_rank(cfg, n_m) == cfg.psi + (n_m - 1) * replicated + padding
    assert psi(cfg.units(1, n_m=n_m)) == megatron.psi_per_rank(cfg, n_m)


@pytest.mark.parametrize("cfg,n_m,match", [
    (LLAMA, 4, r"n_m=4 must divide n_kv_head=2 \(.*Megatron-core refuses the same\)"),
    (GPTConfig(vocab_size=37, block_size=12, n_layer=1, n_head=4, n_embd=20, d_ff=30), 4,
     r"n_m=4 must divide d_ff=30"),
    (GPTConfig(vocab_size=37, block_size=12, n_layer=1, n_head=4, n_embd=20, mlp="swiglu", d_ff=30),
     4, r"n_m=4 must divide d_ff=30")], ids=["kv-heads", "d_ff", "swiglu-d_ff"])
def test_a_degree_that_cannot_split_the_kv_heads_or_d_ff_is_refused_naming_both(cfg, n_m, match):
    for call in (lambda: cfg.unit_spec(n_m), lambda: megatron.psi_per_rank(cfg, n_m),
                 lambda: megatron.shard(cfg, gpt.init_params(cfg, 0), n_m, 0)):
        with pytest.raises(ValueError, match=match):
            call()


@pytest.mark.parametrize("family", list(FAMILY))
def test_replicated_names_exactly_the_parameters_every_mp_rank_holds_whole(family):
    """megatron.replicated(unit, param) is True exactly where shard() hands every MP rank the
    whole tensor (the norm counts those once): asked of shard's own output, not of SPLIT."""
    cfg = FAMILY[family]
    full = {u: {n: torch.randn_like(t) for n, t in ps.items()}
            for u, ps in gpt.init_params(cfg, 0).items()}
    parts = [megatron.shard(cfg, full, 2, j) for j in range(2)]
    for u, ps in full.items():
        for n, t in ps.items():
            whole = all(torch.equal(q[u][n], t) for q in parts)
            assert megatron.replicated(u, n) == whole, (u, n)
