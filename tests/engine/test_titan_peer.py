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

import dataclasses

import pytest

from tests.support.memtracker import ledger_phases
from zerospec.evaluation import validation
from zerospec.model.presets import llama, preset
from zerospec.testing.titan_peer import TitanRun, missing, tracked_step
from zerospec.training.config import TrainConfig
from zerospec.training.scale import measure

pytestmark = [pytest.mark.titan, pytest.mark.slow]


@pytest.fixture(autouse=True, scope="module")
def _torchtitan():
    """Skip, saying why, where torchtitan cannot run; asked at the first test's setup, not at
    collection: every xdist worker collects this file, and the imports missing() tries take
    seconds (the default run deselects these tests and never pays them)."""
    why = missing()
    if why is not None:
        pytest.skip(why)

N, B, S = 8, 2, 256
# torchtitan's debugmodel (torchtitan/models/llama3/__init__.py: _debugmodel): MHA, untied head,
# d_ff = compute_ffn_hidden_dim(256, multiple_of=256) = 768, RoPE cache of max_seq_len 131,072
L, D, H, KV, F, V, ROPE_LEN = 6, 256, 16, 16, 768, 2048, 131072
HD = D // H
CFG = llama(L, D, H, KV, F, V, S, 5e5)


def block(cfg) -> int:
    """Parameters of one block: wqkv, wo, w1/w2/w3, two norms."""
    d, hd = cfg.n_embd, cfg.n_embd // cfg.n_head
    return d * (cfg.n_head + 2 * cfg.n_kv_head) * hd + cfg.n_head * hd * d + 3 * d * cfg.d_ff + 2 * d


BLOCK = block(CFG)
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



def test_each_block_keeps_its_odd_matmuls_outputs_by_the_trackers_module_reading(selective):
    """FSDPMemTracker's per-module reading: each block's forward grows the activations by the
    outputs of wqkv, w1 and w2 and its own output (the next block's input), b·s·2 bytes each per
    feature: (h + 2·kv)·head_dim + d_ff + d + d; zerospec's checkpoint of a block is that plus
    SDPA's output and logsumexp (its input is the previous block's output)."""
    tt, zs = selective
    kept = B * S * 2 * ((H + 2 * KV) * HD + F + D + D)
    blocks = {m: g for m, g in tt["modules"].items() if m.startswith("layers.")}
    assert sorted(blocks) == [f"layers.{i}" for i in range(L)]
    assert set(blocks.values()) == {kept}
    assert zs["forward"]["checkpoints"] == L * (kept + BSD * 2 + B * H * S * 4)

# -- torchtitan's 8-GPU configuration (spec/validation.md): Llama 3.1 8B, seq 8,192, local batch 2,
# FSDP over 8, selective per-op checkpointing; zerospec's side is the validation row's own step
EIGHT_B = TitanRun("8B", 8, validation.TORCHTITAN_BATCH, validation.TORCHTITAN_SEQ, "selective-op")
CFG_8B = dataclasses.replace(preset(validation.TORCHTITAN_PRESET).model,
                             block_size=validation.TORCHTITAN_SEQ)


@pytest.fixture(scope="module")
def eight_b():
    """(torchtitan's readings, the flavour's ledger, the validation row's allocated peak)."""
    settings = validation.TORCHTITAN_SETTINGS
    assert settings["activation_checkpointing"] == EIGHT_B.ac and EIGHT_B.n == 8
    zs = ledger_phases(measure(TrainConfig.of(model=CFG_8B, n_d=EIGHT_B.n, **settings),
                               micro_batch=EIGHT_B.batch, trace=True).memory(0))
    return tracked_step(EIGHT_B), zs, validation.torchtitan_step(EIGHT_B.n).allocated


def named_8b(tt, zs) -> dict[str, int]:
    """Each difference zerospec − torchtitan at the end of forward, by its mechanism, from the
    shape: the wrapping's extra gathered units, the RoPE caches, SDPA's kept output, the final
    norm's CPU upcast, the loss."""
    c, n = CFG_8B, EIGHT_B
    hd, bsd = c.n_embd // c.n_head, n.batch * n.seq * c.n_embd
    return {
        "Unsharded Param": 2 * c.vocab_size * c.n_embd + 2 * block(c),
        "Buffer": -c.n_layer * ROPE_LEN * (hd // 2) * 8,
        "Activation": c.n_layer * (bsd * 2 + n.batch * c.n_head * n.seq * 4)
        - (2 * bsd * 2 + n.batch * n.seq * 2) - 4,
    }


def test_8b_model_states_match_torchtitans_term_by_term(eight_b):
    """At torchtitan's 8B shape: fp32 shards, gradients and AdamW states as at the small shape."""
    tt, zs, _ = eight_b
    q = 4 * CFG_8B.psi // EIGHT_B.n
    assert tt["step"]["Sharded Param"] == zs["step"]["param32"] == q
    assert tt["step"]["Sharded Grad"] == zs["step"]["shard_grad32"] == q
    assert tt["step"]["OptState"] == (zs["step"]["exp_avg"] + zs["step"]["exp_avg_sq"]
                                      + 4 * tt["counts"]["parameters"])


def test_8b_forward_differs_by_the_named_terms_only(eight_b):
    """At the end of forward at 8B, every category differs by the mechanisms the small shape
    named: the gathered embeddings and last block, the per-layer RoPE caches, SDPA's output and
    logsumexp (kept by zerospec's list, recomputed on the CPU), the final norm's upcast, the loss."""
    tt, zs, _ = eight_b
    f, z, d = tt["forward"], zs["forward"], named_8b(tt, zs)
    assert z["gathered"] - f["Unsharded Param"] == d["Unsharded Param"]
    assert 0 - f["Buffer"] == d["Buffer"]
    assert z["activations"] + z["checkpoints"] - (f["Activation"] + f["Inputs"]) == d["Activation"]


def test_torchtitan_peer_table(eight_b, md_snapshot):
    """spec/validation.md's "torchtitan as a peer": FSDPMemTracker on torchtitan's own 8B step
    beside zerospec's ledger, bytes at the end of forward by category, the rise to each peak (the
    loss's backward temporaries), and the step's peaks; "named" is the difference the mechanisms
    give (for the peak: their sum)."""
    tt, zs, allocated = eight_b
    f, z, d = tt["forward"], zs["forward"], named_8b(tt, zs)
    pairs = {"Sharded Param": z["param32"], "Unsharded Param": z["gathered"], "Buffer": 0,
             "OptState": z["exp_avg"] + z["exp_avg_sq"],
             "Activation": z["activations"] + z["checkpoints"]}
    rows = ["| at | FSDPMemTracker (torchtitan) | zerospec | zerospec − tracker | named |",
            "|---|---|---|---|---|"]
    for cat, zb in pairs.items():
        tb = f[cat] + (f["Inputs"] if cat == "Activation" else 0)
        named = d.get(cat, 4 * tt["counts"]["parameters"] * -(cat == "OptState"))
        rows.append(f"| end of forward: {cat} | {tb:,} | {zb:,} | {zb - tb:,} | {named:,} |")
    peak, named = tt["peak"]["Total"], sum(d.values()) - 4 * tt["counts"]["parameters"]
    rise = (peak - (f["Total"]), allocated - z["Total"])
    rows += [f"| rise from the end of forward to the peak | {rise[0]:,} | {rise[1]:,} | "
             f"{rise[1] - rise[0]:,} | |",
             f"| peak of the step | {peak:,} | {allocated:,} | {allocated - peak:,} | {named:,} |",
             f"| peak: zerospec / tracker | | | | {allocated / peak:.2f} |"]
    assert md_snapshot == "\n".join(rows)
