"""torchtitan as a peer: its own Llama 3, wrapped by its own ``parallelize_llama``, one training
step under ``FSDPMemTracker`` on fake tensors and the fake process group, on the CPU
(zerospec/testing/titan_peer.py, as torchtitan's ``scripts/estimate/estimation.py`` runs it),
beside zerospec's ledger of stage 3's FSDP2 flavour for the same shape (``measure``).

Small shape: torchtitan's own ``debugmodel`` (6 layers, d = 256, 16 heads, vocab 2,048) at world
size 8, local batch 2, sequence 256. Each tracker category is compared with its zerospec
counterpart; where they differ, the test names the term and pins it by its arithmetic from the
shape. Large shape (spec/validation.md, "torchtitan as a peer"): Llama 3.1 8B, seq 8,192, batch 2,
8 ranks, selective per-op checkpointing — peaks and ratio pinned in a snapshot.

Optional: ``pip install -e ".[titan]"`` then ``pip install --no-deps "torchtitan==0.3.0"``;
marked ``titan`` and ``slow`` (each run spawns a process importing torchtitan, ~10 s; the 8B
one ~1 min), skipped with the reason when torchtitan is not importable.
"""
from __future__ import annotations

import pytest

from tests.support.memtracker import ledger_phases
from zerospec.model.presets import PUBLISHED, llama
from zerospec.testing.titan_peer import TitanRun, missing, tracked_step
from zerospec.training.config import TrainConfig
from zerospec.training.scale import measure

MISSING = missing()
pytestmark = [pytest.mark.titan, pytest.mark.slow,
              pytest.mark.skipif(MISSING is not None, reason=MISSING or "")]

N, B, S = 8, 2, 256
# torchtitan's debugmodel (torchtitan/models/llama3/__init__.py: _debugmodel): MHA, untied head,
# d_ff = compute_ffn_hidden_dim(256, multiple_of=256) = 768, RoPE cache of max_seq_len 131,072
L, D, H, KV, F, V, ROPE_LEN = 6, 256, 16, 16, 768, 2048, 131072
HD = D // H
CFG = llama(L, D, H, KV, F, V, S, 5e5)
BLOCK = D * (H + 2 * KV) * HD + H * HD * D + 3 * D * F + 2 * D   # wqkv, wo, w1/w2/w3, 2 norms
BSD = B * S * D                                                  # elements of one b·s·d tensor


def zerospec_step(cfg, ac: str, seq: int = S) -> dict[str, dict[str, int]]:
    """The flavour's ledger for the step on meta, rank 0 (as the FSDP2 flavour's tracker test)."""
    tc = TrainConfig.of(stage=3, n_d=N, model=cfg, precision="bf16", flavour="fsdp2",
                        activation_checkpointing=ac)
    return ledger_phases(measure(tc, micro_batch=B, trace=True).memory(0))


@pytest.fixture(scope="module")
def plain():
    """(torchtitan, zerospec) without activation checkpointing."""
    return tracked_step(TitanRun("debugmodel", N, B, S, "none")), zerospec_step(CFG, "none")


@pytest.fixture(scope="module")
def selective():
    """(torchtitan, zerospec) with selective per-op activation checkpointing."""
    return (tracked_step(TitanRun("debugmodel", N, B, S, "selective-op")),
            zerospec_step(CFG, "selective-op"))


def test_model_states_after_the_step_match_torchtitans_term_by_term(plain):
    """torchtitan's fp32 sharded parameters and gradients are the flavour's ``param32`` and
    ``shard_grad32`` (4Ψ/N each, Ψ zerospec's count of the same shape); its AdamW states are
    ``exp_avg`` + ``exp_avg_sq`` plus torch's step counters, 4 bytes per parameter tensor."""
    tt, zs = plain
    q = 4 * CFG.psi // N
    assert tt["step"]["Sharded Param"] == zs["step"]["param32"] == q
    assert tt["step"]["Sharded Grad"] == zs["step"]["shard_grad32"] == q
    assert tt["step"]["OptState"] == (zs["step"]["exp_avg"] + zs["step"]["exp_avg_sq"]
                                      + 4 * tt["counts"]["parameters"])


def test_forward_ends_with_different_units_gathered_by_the_wrapping(plain):
    """torchtitan 0.3.0's ``apply_fsdp_to_decoder`` keeps only [norm, lm_head] gathered after
    forward (its own unit; the embeddings and every block are resharded); zerospec's flavour
    (torchtitan at 9dec370) keeps the root — embeddings, norm, head — and the last block: the
    difference is the bf16 embedding table and one block."""
    tt, zs = plain
    head = 2 * (D + V * D)
    assert tt["forward"]["Unsharded Param"] == head
    assert zs["forward"]["gathered"] == head + 2 * V * D + 2 * BLOCK


def test_torchtitans_buffers_are_a_rope_cache_per_layer_which_zerospec_does_not_book(plain):
    """Each of torchtitan's attention modules builds its own RoPE cache (complex64, max_seq_len
    131,072 × head_dim / 2); FSDP2 does not shard buffers. zerospec's ledger has no buffers."""
    tt, zs = plain
    cache = L * ROPE_LEN * (HD // 2) * 8
    assert tt["forward"]["Buffer"] == tt["counts"]["buffers"] == cache
    assert "Buffer" not in zs["forward"] and "buffers" not in zs["forward"]


def test_activations_at_the_end_of_forward_differ_by_named_terms(plain):
    """torchtitan's Activation + Inputs are zerospec's activations plus the loss (4 bytes, alive
    not saved), plus per RMSNorm (2L + 1) what the CPU's composite ``rms_norm`` saves beyond the
    fused kernel zerospec books — fp32 instead of bf16 copies of the input and of x·rstd
    (2 · b·s·d · 2 bytes more) and an fp32 instead of bf16 rstd (b·s · 2 bytes more) — less, per
    block, the RoPE cos/sin zerospec books (2 · s · head_dim · 2 bytes; torchtitan's complex
    multiply saves a view of its cache)."""
    tt, zs = plain
    norms = (2 * L + 1) * (2 * BSD * 2 + B * S * 2)
    rope = L * 2 * S * HD * 2
    f = tt["forward"]
    assert f["Activation"] + f["Inputs"] == zs["forward"]["activations"] + 4 + norms - rope


def test_selective_op_differs_by_the_attention_output_torchtitans_cpu_run_recomputes(selective):
    """With per-op selective checkpointing each block keeps its input and the outputs of its
    odd-numbered matmuls — in both, with q/k/v fused (torchtitan 0.3.0's ``fuse_qkv=True``,
    zerospec's c_attn): wqkv, w1 and w2 of wqkv, wo, w1, w3, w2. zerospec's list (torchtitan at
    9dec370) also keeps the flash SDPA op's output and logsumexp (b·s·d bf16 + b·h·s fp32 per
    block); torchtitan 0.3.0's list has no CPU attention op
    (``_scaled_dot_product_flash_attention_for_cpu``), so its run recomputes them. Outside the
    blocks: the loss and the final norm's CPU upcast, as without checkpointing."""
    tt, zs = selective
    attention = L * (BSD * 2 + B * H * S * 4)
    final_norm = 2 * BSD * 2 + B * S * 2
    f, z = tt["forward"], zs["forward"]
    assert f["Activation"] + f["Inputs"] == (z["activations"] + z["checkpoints"] + 4
                                             + final_norm - attention)
