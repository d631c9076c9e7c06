"""Model parallelism (Megatron-LM slicing on the N_d × N_m grid) and ZeRO-R's P_a, P_a+cpu on the
tiny GPTs, on threads: exactness, memory per GPU from the ledger, MP traffic from the ledger.

spec/model_parallel.md shows the measured tables and derives the bound used for N_m > 1 vs 1.
"""
from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from tests.support.runs import assert_same_training, cached, stage_id
from zerospec.model import megatron
from zerospec.model.gpt import GPTConfig
from zerospec.optim.adam import update_bound
from zerospec.paper import theory
from zerospec.training.config import TrainConfig
from zerospec.training.run import train

# 4 heads of width 5: every unit pads unevenly at N_d = 2 and 3; N_m in (2, 4)
MP_ODD = GPTConfig(vocab_size=37, block_size=12, n_layer=2, n_head=4, n_embd=20, vocab_divisor=1)
# the same at Megatron's default padding: V_p = 256 at N_m = 2, rank 1's rows all padding
MP_PAD = GPTConfig(vocab_size=37, block_size=12, n_layer=2, n_head=4, n_embd=20)
STEPS = 3
PAGE = "spec/model_parallel.md"


# the family's block: RMSNorm, SwiGLU (d_ff = 36), GQA (4 query, 2 kv heads), RoPE, untied, no bias
MP_LLAMA = GPTConfig(vocab_size=37, block_size=12, n_layer=2, n_head=4, n_embd=24, n_kv_head=2,
                     norm="rmsnorm", mlp="swiglu", d_ff=36, positions="rope",
                     tie_embeddings=False, bias=False)


def mp_run(stage: int, n_d: int, n_m: int, model=MP_ODD, **kw):
    cfg = TrainConfig.of(stage=stage, n_d=n_d, n_m=n_m, model=model, steps=STEPS, **kw)
    return cached(("threads", cfg, None), lambda: train(cfg))


GRIDS = [(2, 2), (3, 2), (2, 4)]


def grid_cases(stages) -> list:
    """stage × grid: every stage at (2, 2); stages 0 and 3 (the baseline and the most sharded) at
    every grid; stages 1 and 2 at the wider grids with the slow cases."""
    return [pytest.param(stage, n_d, n_m, id=f"{stage_id(stage)}-{(n_d, n_m)}",
                         marks=[pytest.mark.slow] * (stage in (1, 2) and (n_d, n_m) != GRIDS[0]))
            for stage in stages for n_d, n_m in GRIDS]


@pytest.mark.claim("P10")
@pytest.mark.parametrize("stage,n_d,n_m", grid_cases([1, 2, 3]))
def test_at_a_fixed_n_m_every_zero_stage_is_bit_identical(stage, n_d, n_m):
    """The stages shard over the DP group only, with unchanged code: at any N_d × N_m they give
    the bits of stage 0 at the same grid (losses of every rank, final weights)."""
    assert_same_training(mp_run(0, n_d, n_m), mp_run(stage, n_d, n_m))


@pytest.mark.claim("P10")
@pytest.mark.parametrize("n_d,n_m", GRIDS, ids=lambda g: str(g))
def test_replicated_parameters_stay_identical_on_every_mp_rank(n_d, n_m):
    """LayerNorms, row-parallel biases, the position table and ln_f are whole on every MP rank: their
    gradients come from identical inputs (the all-reduces hand every rank the same bits), so their
    masters stay bit-identical across the MP group without any extra communication."""
    r = mp_run(0, n_d, n_m)
    units = r.units
    for d in range(n_d):
        ranks = r.ranks[d * n_m:(d + 1) * n_m]
        for i, u in enumerate(units):
            for p in u.params:
                if not megatron.replicated(u.name, p.name):
                    continue
                sl = slice(p.offset, p.offset + p.numel)
                first = ranks[0].master[i][1][sl]
                assert all(torch.equal(first, o.master[i][1][sl]) for o in ranks[1:]), (u.name, p.name)


@pytest.mark.claim("P10")
@pytest.mark.parametrize("stage", [1, 2, 3], ids=stage_id)
def test_the_llama_family_at_n_m_2_is_bit_identical_in_every_zero_stage(stage):
    """RMSNorm, SwiGLU, GQA, RoPE, untied head, no bias, on the 2 × 2 grid: stages 1–3 give the
    bits of stage 0 at the same grid."""
    assert_same_training(mp_run(0, 2, 2, MP_LLAMA), mp_run(stage, 2, 2, MP_LLAMA))


@pytest.mark.claim("P10")
@pytest.mark.parametrize("model,n_m", [(MP_ODD, 2), (MP_ODD, 4), (MP_LLAMA, 2), (MP_PAD, 2)],
                         ids=["gpt2-2", "gpt2-4", "llama-2", "gpt2-2-padded-to-256"])
def test_model_parallel_training_is_the_same_model_within_the_adam_bound(model, n_m, claim_values):
    """N_m > 1 vs N_m = 1 differ only in the order row-parallel partial sums are added, so from
    the same weights every master stays within 2·Σ_t max|Adam update| + storage rounding
    (optim.adam.update_bound; spec/model_parallel.md) — and is not trivially equal. The same
    for the Llama-style block (GQA sliced by kv heads, SwiGLU's gate and up by rows), and with
    Megatron's padding of the vocabulary to 128·N_m (219 rows no token uses, out of the loss)."""
    one, mp = mp_run(0, 2, 1, model), mp_run(0, 2, n_m, model)
    assert mp.master.keys() == one.master.keys()
    assert all(mp.master[k].shape == one.master[k].shape for k in one.master)
    lr_bound = 2 * update_bound(STEPS, mp.config.adam)
    worst = max(float((mp.master[k] - one.master[k]).abs().max()) for k in one.master)
    wmax = max(float(t.abs().max()) for t in one.master.values())
    assert worst <= lr_bound + 2 * STEPS * 2.0 ** -24 * wmax
    assert worst > 0                    # the sum order matters: the comparison is not vacuous
    claim_values(f"max |Δw| = {worst:.2e} after {STEPS} steps; step-1 loss {mp.losses[0]!r} vs "
                 f"{one.losses[0]!r}", f"≤ {lr_bound:.2e} (derived bound)", f"N_d = 2, N_m = {n_m}")


def psi_m(n_m: int) -> int:
    """Ψ_m, the elements one MP rank of MP_ODD holds, written out from Megatron-LM's slicing (not
    from model/megatron.py): d = 20, V = 37 padded to a multiple of N_m (vocab_divisor 1), T = 12,
    L = 2, a 4d MLP with biases, the head tied. Per block, sliced over N_m: c_attn 3d·d + 3d and
    c_fc 4d·d + 4d (column-parallel, bias too), attn.c_proj d·d and mlp.c_proj 4d·d
    (row-parallel); whole on every rank: those two rows' biases d + d and two LayerNorms 2·2d.
    Outside the blocks: wte's ⌈V/N_m⌉ rows of d (vocab-parallel), wpe T·d and ln_f 2d whole."""
    d, v, t, layers = 20, 37, 12, 2
    sliced = (3 * d * d + 3 * d) + (4 * d * d + 4 * d) + d * d + 4 * d * d
    whole = 2 * d + 2 * 2 * d
    return layers * (sliced // n_m + whole) + -(-v // n_m) * d + t * d + 2 * d


def test_psi_m_written_out_is_megatrons_slicing_of_mp_odd():
    """The hand count's inputs are MP_ODD's, and at N_m = 1 it is GPT-2's Ψ = 12Ld² + 13Ld +
    Vd + Td + 2d = 11,140."""
    m = MP_ODD
    assert (m.n_embd, m.vocab_size, m.block_size, m.n_layer) == (20, 37, 12, 2) and m.tie_embeddings
    assert psi_m(1) == 12 * 2 * 400 + 13 * 2 * 20 + 37 * 20 + 12 * 20 + 2 * 20 == 11_140 == m.psi
    assert (psi_m(2), psi_m(4)) == (5_840, 3_190)


@pytest.mark.claim("C11", status="differs", page=f"{PAGE}#the-per-gpu-reduction-with-mp-c11")
@pytest.mark.parametrize("stage,n_d,n_m", grid_cases(range(4)))
def test_model_states_per_gpu_are_the_stage_formula_at_psi_over_n_m(stage, n_d, n_m, claim_values):
    """Each rank holds Ψ_m = Megatron's slice of the model (psi_m, counted by hand) and its
    stage's bytes for Ψ_m over N_d ranks: ZeRO-DP and MP multiply (C11). The paper's N_d × N_m
    is the reduction with every parameter sliced; ours replicates the embedding, the LayerNorms
    and the row-parallel biases on every MP rank, so stage 3 cuts 16Ψ by N_d·Ψ/Ψ_m, below it."""
    r = mp_run(stage, n_d, n_m)
    assert r.psi == psi_m(n_m)
    for rank in range(n_d * n_m):
        assert r.model_states(rank) == theory.model_state_bytes(stage, r.psi_held, n_d)
    if stage == 3:
        psi = psi_m(1)
        cut = Fraction(theory.model_state_bytes(0, psi, 1), r.model_states(0))
        assert cut == Fraction(n_d * psi, r.psi_held) and n_d < cut < n_d * n_m
        claim_values(f"16Ψ / model states = {float(cut):.2f} = {float(cut / n_d):.2f}·N_d",
                     f"N_d × N_m = {n_d * n_m} (C11)", f"P_os+g+p, N_d = {n_d}, N_m = {n_m}")


# -- MP traffic and P_a ------------------------------------------------------------------------------
def ckpt_run(stage: int, **kw):
    return mp_run(stage, 2, 2, checkpoint_activations=1, **kw)


P_A = {"plain": {}, "P_a": {"partition_activations": True},
       "P_a+cpu": {"partition_activations": True, "cpu_checkpointing": True}}


@pytest.mark.claim("P11")
@pytest.mark.parametrize("variant", list(P_A))
@pytest.mark.parametrize("stage", [pytest.param(s, id=stage_id(s), marks=[pytest.mark.slow] * (s in (1, 2)))
                                   for s in range(4)])   # 0 and 3: the runs C33, C35 and the table read
def test_checkpointing_p_a_and_p_a_cpu_change_no_bit(stage, variant):
    """A checkpoint per block, kept whole, split over the MP group (P_a) or moved to the host
    (P_a+cpu): the recompute runs on the same values, so every bit equals the run without."""
    assert_same_training(mp_run(0, 2, 2), ckpt_run(stage, **P_A[variant]))


def block_message(r) -> int:
    """b·s·hd: the activation each MP all-reduce carries (sequences per replica × seq × width)."""
    return r.config.batch // r.config.n_d * MP_ODD.block_size * MP_ODD.n_embd


@pytest.mark.claim("C33")
def test_mp_moves_six_all_reduces_per_block_and_p_a_adds_one_twelfth(claim_values):
    """Per block and step: 2 all-reduces of b·s·hd in forward, 2 in the recompute, 2 in backward
    (ring: 2(N_m−1)/N_m each); P_a adds one all-gather of the checkpoint, (N_m−1)/N_m·b·s·hd:
    1/12 of the blocks' MP traffic (C33), every figure read from the ledger's MP group."""
    plain, pa = ckpt_run(0), ckpt_run(0, partition_activations=True)
    S, L, n = block_message(plain), MP_ODD.n_layer, 2
    tokens = S // MP_ODD.n_embd
    for r in (plain, pa):
        ar = r.comm.records(0, group="mp", op="all_reduce", step=1)
        # besides the blocks' 6·L: the vocab-parallel embedding's sum (forward) and the LM head's
        # input gradient (backward), b·s·hd each; the cross-entropy's max, Σ exp and target logit, b·s
        assert sorted(x.numel for x in ar) == [tokens] * 3 + [S] * (6 * L + 2)
        blocks = sum(x.elements_sent for x in ar if x.numel == S) * 6 * L // (6 * L + 2)
        assert blocks == 6 * L * 2 * (n - 1) * S // n
    gathers = pa.comm.records(0, group="mp", op="all_gather", step=1)
    assert len(gathers) == L and {x.numel for x in gathers} == {S}
    assert plain.comm.records(0, group="mp", op="all_gather") == []
    ratio = sum(x.elements_sent for x in gathers) / blocks
    claim_values(f"P_a all-gather / MP all-reduces = {ratio:.4f}", "1/12 ≈ 0.0833, < 10% (C33)",
                 "N_m = 2, a checkpoint per block")
    assert ratio * 12 == 1


@pytest.mark.claim("C32")
@pytest.mark.parametrize("n_d,n_m", [(2, 2), (2, 4)], ids=lambda g: str(g))
def test_p_a_divides_checkpoint_memory_by_n_m(n_d, n_m):
    """P_a keeps 1/N_m of every checkpoint per rank: the ledger's checkpoint peak is exactly the
    whole-checkpoint peak / N_m, on every rank (C32)."""
    whole = mp_run(0, n_d, n_m, checkpoint_activations=1)
    part = mp_run(0, n_d, n_m, checkpoint_activations=1, partition_activations=True)
    for rank in range(n_d * n_m):
        w, p = whole.memory[rank].peak["checkpoints"], part.memory[rank].peak["checkpoints"]
        assert w == MP_ODD.n_layer * block_message(whole) * 4 and p * n_m == w


@pytest.mark.claim("C35")
def test_p_a_cpu_moves_twice_p_a_bytes_over_the_host_link_and_leaves_no_checkpoint_on_device():
    """P_a+cpu: 0 checkpoint bytes on the device; the host holds P_a's part; the rank's host link
    carries each part out and back, twice P_a's checkpoint bytes per step (C35) — and
    2/(N_m − 1) of the bytes P_a's all-gathers send, which P_a+cpu sends as well."""
    n_m = 2
    pa, cpu = ckpt_run(0, partition_activations=True), ckpt_run(0, partition_activations=True,
                                                                cpu_checkpointing=True)
    for rank in range(4):
        part = pa.memory[rank].peak["checkpoints"]
        assert cpu.memory[rank].peak["checkpoints"] == 0 and part > 0
        assert cpu.host[rank].peak["checkpoints"] == part and cpu.host[rank].current["checkpoints"] == 0
        assert cpu.ranks and cpu.memory[rank].current["checkpoints"] == 0
        for step in range(1, STEPS + 1):
            link = cpu.comm.records(rank, group="host", step=step)
            assert {x.op for x in link} == {"to_host", "from_host"}
            moved = sum(x.bytes_sent + x.bytes_recv for x in link)
            assert moved == 2 * part
            gathers = {r.comm.bytes(rank, group="mp", op="all_gather", step=step) for r in (pa, cpu)}
            assert gathers == {(n_m - 1) * moved // 2}
    assert pa.comm.records(0, group="host") == []


def test_model_parallel_table(md_snapshot):
    """spec/model_parallel.md's tiny-GPT table (N_d = 2, N_m = 2, stage 3, a checkpoint per
    block): per rank 0, Ψ held (the padded vocabulary row included), model states, checkpoint
    bytes, and each group's traffic."""
    rows = ["| variant | Ψ per rank | of which vocab padding (rank 0, 1) | model states (B) "
            "| checkpoints (B) | host (B) | DP elements | MP elements | host link (B) |",
            "|---|---|---|---|---|---|---|---|---|"]
    for name, kw in P_A.items():
        r = ckpt_run(3, **kw)
        led = r.comm
        pad = ", ".join(str(megatron.psi_padding(MP_ODD, 2, j)) for j in range(2))
        rows.append(f"| {name} | {r.psi:,} | {pad} | {r.model_states(0):,} "
                    f"| {r.memory[0].peak['checkpoints']:,} | {r.host[0].peak['checkpoints']:,} "
                    f"| {led.elements(0, group='dp'):,} | {led.elements(0, group='mp'):,} "
                    f"| {sum(x.bytes_sent + x.bytes_recv for x in led.records(0, group='host')):,} |")
    assert md_snapshot == "\n".join(rows)


@pytest.mark.claim("P10")
@pytest.mark.parametrize("model,n_m", [(MP_ODD, 2), (MP_ODD, 4), (MP_PAD, 2)],
                         ids=["2", "4", "2-padded-to-256"])
def test_step_one_loss_is_the_megatron_decomposition_of_the_same_model_bit_for_bit(model, n_m):
    """Every rank's first loss equals, bit for bit, one process running the whole model (its fp16
    weights, cast as every use casts them) with each row-parallel layer split N_m ways and the
    partials added in rank order, and the LM head's logits cut by rows of the padded vocabulary
    into Megatron's parallel cross-entropy (reference.vocab_parallel_loss) — so an N_m > 1 run is
    the N_m = 1 model up to those sum orders; the embedding's masked lookups add exactly."""
    import torch.nn.functional as F

    from zerospec.cluster.threads import torch_threads
    from zerospec.model import gpt
    from zerospec.testing.reference import megatron_block, vocab_parallel_loss
    from zerospec.training.run import make_batches
    from zerospec.training.step import micro_batch
    r = mp_run(0, 2, n_m, model)
    full = {u: {n: t.half().float() for n, t in ps.items()}
            for u, ps in gpt.init_params(model, r.config.seed).items()}
    wte = [megatron.shard(model, full, n_m, j)["embed"]["wte"] for j in range(n_m)]
    idx, tgt = make_batches(r.config)[0]
    with torch_threads(1), torch.no_grad():
        for d in range(2):
            i, t = micro_batch(idx, d, 2, 0, 1), micro_batch(tgt, d, 2, 0, 1)
            x = F.embedding(i, full["embed"]["wte"]) + full["embed"]["wpe"][:i.shape[1]]
            for b in range(model.n_layer):
                p = full[f"h.{b}"]
                x = megatron_block(model, x, [megatron.shard(model, {"h.0": p}, n_m, j)["h.0"]
                                              for j in range(n_m)])
            x = gpt.norm(model.norm, x, full["ln_f"]["weight"], full["ln_f"]["bias"], model.norm_eps)
            want = vocab_parallel_loss([F.linear(x, w).flatten(0, 1) for w in wte], t.reshape(-1),
                                       model.vocab_size)
            for j in range(n_m):
                assert torch.equal(r.rank_losses[d * n_m + j][0], want), (d, j)
