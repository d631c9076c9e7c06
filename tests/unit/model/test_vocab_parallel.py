"""Megatron-LM's vocabulary-parallel embedding and cross-entropy (model/vocab.py) on N_m threads.

The oracle is torch's own on the whole vocabulary: ``F.embedding`` of the whole table (bit for
bit: one row plus exact zeros) and ``F.cross_entropy`` in float64 (a tolerance: the two sum
Σ exp in different orders). The bound, per token: the loss is log Σ_V exp(z − m) − (z_t − m);
summing V terms each within a rounding u = 2⁻⁵³ of exact errs by at most (V + 1)·u relatively,
the log adds u·|log s| and the shift u·|z − m| ≤ u·2·max|z|, for each of the two computations:
tol = 2·(V + 2 + log V + 2·max|z|)·u; the gradient's softmax − one-hot errs by (V + 3)·u at most.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from zerospec.cluster.threads import VirtualCluster
from zerospec.model import vocab
from zerospec.model.gpt import GPTConfig
from zerospec.model.megatron import TensorParallel, psi_padding, shard, unshard

U = 2.0 ** -53


def _logits(n: int, v: int, n_m: int, scale: float, seed: int = 0) -> torch.Tensor:
    """(n, v) float64 logits whose row max sits on a different rank from row to row, each rank's
    block shifted by its own offset: a rank's own max is the global one for a few rows only."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, v, generator=g, dtype=torch.float64) * scale
    per = -(-v // n_m)
    for i in range(n):
        j = i % n_m
        z[i, j * per:(j + 1) * per] += 3 * scale      # row i's max on rank i mod N_m
    return z


def _parallel(z: torch.Tensor, tgt: torch.Tensor, n_m: int, v_p: int, garbage: float):
    """Each rank's loss and its slice's gradient, the padded columns [V, V_p) set to ``garbage``."""
    n, v = z.shape
    full = torch.cat([z, z.new_full((n, v_p - v), garbage)], 1)
    per = v_p // n_m

    def body(ctx):
        mine = full[:, ctx.rank * per:(ctx.rank + 1) * per].clone().requires_grad_(True)
        loss = vocab.cross_entropy(mine, tgt, TensorParallel(ctx.comm), v)
        loss.backward()
        return loss.detach(), mine.grad, ctx.comm
    return VirtualCluster(n_m).run(body)


@pytest.mark.parametrize("n_m,v,v_p,scale", [(2, 37, 40, 1.0), (3, 37, 39, 1.0), (4, 37, 48, 1.0),
                                             (2, 37, 40, 400.0), (4, 37, 512, 1.0)],
                         ids=["2", "3", "4-padded-11", "2-large-logits", "4-ranks-of-padding"])
def test_parallel_cross_entropy_is_the_whole_vocabularys_loss_and_gradient(n_m, v, v_p, scale):
    """Every rank's loss equals F.cross_entropy over the whole unpadded vocabulary (within the
    module's derived float64 bound), and its slice's gradient is that gradient's columns, zero on
    the padded ones — with padded logits far above every real one (masked to −∞, not by luck),
    rows whose max sits on another rank (the max must be all-reduced), and logits of ±1,200
    (exp would overflow without the max subtracted)."""
    n = 24
    z = _logits(n, v, n_m, scale)
    tgt = torch.arange(n) * 7 % v                        # every rank owns some targets
    tgt[0], tgt[1] = 0, v - 1                            # the first and last real rows
    zr = z.clone().requires_grad_(True)
    want = F.cross_entropy(zr, tgt)
    want.backward()
    big = float(z.abs().max())
    tol = 2 * (v + 2 + math.log(v) + 2 * big) * U
    per = v_p // n_m
    for j, (loss, grad, _) in enumerate(_parallel(z, tgt, n_m, v_p, garbage=big * 5 + 10)):
        assert abs(float(loss) - float(want.detach())) <= tol, (j, float(loss))
        lo, hi = j * per, min((j + 1) * per, v)
        assert torch.all(grad[:, max(0, hi - lo):] == 0)               # padded columns
        if hi > lo:
            err = (grad[:, :hi - lo] - zr.grad[:, lo:hi]).abs().max()
            assert float(err) <= (v + 3) * U / n * 2, (j, float(err))


def test_the_cross_entropy_all_reduces_the_max_the_sum_and_the_target_logit_over_the_mp_group():
    """Three all-reduces of one fp32 value per token, booked on the ledger in forward, and none in
    backward (softmax − one-hot is local to each rank's columns)."""
    n, n_m = 24, 2
    z = _logits(n, 37, n_m, 1.0).float()
    cluster = VirtualCluster(n_m)

    def body(ctx):
        mine = z[:, ctx.rank * 19:(ctx.rank + 1) * 19].clone().requires_grad_(True)
        with ctx.phase("forward"):
            loss = vocab.cross_entropy(mine, torch.arange(n) % 37, TensorParallel(ctx.comm), 37)
        with ctx.phase("backward"):
            loss.backward()
    cluster.run(body)
    for r in range(n_m):
        fwd = cluster.comm_ledger.records(r, phase="forward")
        assert [(c.op, c.numel, c.dtype) for c in fwd] == [("all_reduce", n, torch.float32)] * 3
        assert cluster.comm_ledger.records(r, phase="backward") == []


@pytest.mark.parametrize("n_m", [2, 3, 4])
def test_the_vocab_parallel_embedding_is_the_whole_tables_lookup_bit_for_bit(n_m):
    """Each rank looks up the ids in its rows (zero elsewhere) and the MP group sums: every rank
    gets F.embedding of the whole table exactly, for ids at every rank boundary; the input's
    gradient reaches only the rows this rank holds, each with the whole lookup's gradient."""
    cfg = GPTConfig(vocab_size=37, block_size=12, n_layer=1, n_head=12, n_embd=24, vocab_divisor=1)
    g = torch.Generator().manual_seed(3)
    wte = torch.randn(37, 24, generator=g)
    idx = torch.arange(37).repeat(2).reshape(2, 37)      # every id, every boundary, twice
    dy = torch.randn(2, 37, 24, generator=g)
    leaf = wte.clone().requires_grad_(True)
    F.embedding(idx, leaf).backward(dy)

    def body(ctx):
        mine = shard(cfg, {"embed": {"wte": wte}}, n_m, ctx.rank)["embed"]["wte"]
        mine = mine.clone().requires_grad_(True)
        x = vocab.embedding(idx, mine, TensorParallel(ctx.comm))
        x.backward(dy)
        return x.detach(), mine.grad
    outs = VirtualCluster(n_m).run(body)
    assert all(torch.equal(x, F.embedding(idx, wte)) for x, _ in outs)
    grads = unshard(cfg, [{"embed/wte": gr} for _, gr in outs])["embed/wte"]
    assert torch.equal(grads, leaf.grad)
    v_p = cfg.padded_vocab(n_m)
    assert all(torch.all(gr[37 - j * (v_p // n_m):] == 0) for j, (_, gr) in enumerate(outs)
               if 37 - j * (v_p // n_m) < v_p // n_m)


@pytest.mark.parametrize("n_m,v_p", [(1, 50257), (2, 50432), (4, 50688), (8, 51200), (16, 51200)])
def test_gpt2s_vocabulary_pads_to_a_multiple_of_128_n_m_as_megatron_does(n_m, v_p):
    """50,257 is never refused: V_p = ⌈V / (128·N_m)⌉·128·N_m with N_m > 1 (Megatron-LM's
    make-vocab-size-divisible-by × tensor-parallel size), V itself at N_m = 1; the padding is
    (V_p − V)·d elements over the MP group, on its last ranks, and no part of Ψ."""
    cfg = GPTConfig(vocab_size=50257, block_size=1024, n_layer=1, n_head=16, n_embd=64)
    assert cfg.padded_vocab(n_m) == v_p
    assert psi_padding(cfg, n_m) == (v_p - 50257) * 64
    per = v_p // n_m
    for j in range(n_m):
        assert psi_padding(cfg, n_m, j) == max(0, min(per, (j + 1) * per - 50257)) * 64
    assert cfg.units(1, n_m=n_m)[0].params[0].shape == (per, 64)


def test_a_vocab_divisor_that_is_not_a_positive_integer_is_refused():
    with pytest.raises(ValueError, match="vocab_divisor must be an integer >= 1, got 0"):
        GPTConfig(vocab_divisor=0)
