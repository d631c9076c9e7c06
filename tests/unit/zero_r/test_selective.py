"""zerospec/zero_r/selective.py: torchtitan's activation checkpointing modes (full,
selective-layer:K, selective-op) — what each keeps, observed, and that none moves a bit."""
from __future__ import annotations

import functools

import pytest
import torch

from tests.support.runs import assert_same_training
from zerospec.__main__ import main
from zerospec.model import gpt
from zerospec.model.gpt import GPTConfig
from zerospec.training.config import TrainConfig
from zerospec.training.run import train
from zerospec.training.scale import measure
from zerospec.zero_r import selective

aten = torch.ops.aten
# Llama's block at toy size: RMSNorm, RoPE, GQA, SwiGLU, no bias (every projection an aten.mm)
LLAMA = GPTConfig(vocab_size=64, block_size=16, n_layer=3, n_head=4, n_embd=32, n_kv_head=2,
                  norm="rmsnorm", mlp="swiglu", d_ff=48, positions="rope", tie_embeddings=False,
                  bias=False, attention="sdpa")
N = 2


@functools.lru_cache(maxsize=None)
def trained(mode: str, stage: int = 0, model: GPTConfig = LLAMA):
    return train(TrainConfig.of(stage=stage, n_d=N, model=model, steps=2,
                                activation_checkpointing=mode))


def at_forward_end(r, category: str) -> int:
    return r.memory[0].snapshots_by_label()["forward@1"][0].current[category]


def kept_by_one_block(cfg: GPTConfig, B: int = 2, T: int = 8):
    """What the policy keeps running one block of ``cfg`` on (B, T, C) fp32 inputs: (op, shapes)."""
    g = torch.Generator().manual_seed(0)
    params = {n: torch.randn(s, generator=g) * 0.1 for n, s in dict(cfg.unit_spec())["h.0"]}
    x = torch.randn(B, T, cfg.n_embd, generator=g)
    with torch.no_grad(), selective.policy() as pol:
        gpt.block(cfg, x, params)
    return [(op, tuple(tuple(t.shape) for t in (o if isinstance(o, tuple) else (o,))))
            for op, o in pol.kept]


def test_selective_op_keeps_the_odd_matmuls_and_the_attention_kernel_of_a_llama_block():
    """torchtitan @9dec370's _custom_policy on a Llama block: the mms are qkv (1, kept), wo (2),
    w1 (3, kept), w3 (4), w2 (5, kept); the attention kernel's output and log-sum-exp are kept."""
    B, T, C, H, kv, hd, ff = 2, 8, 32, 4, 2, 8, 48
    assert kept_by_one_block(LLAMA, B, T) == [
        (aten.mm.default, ((B * T, C + 2 * kv * hd),)),          # q, k, v: one fused mm
        (selective.FLASH, ((B, T, C), (B, H, T))),               # flash SDPA: out, lse
        (aten.mm.default, ((B * T, ff),)),                       # w1 (c_gate)
        (aten.mm.default, ((B * T, C),)),                        # w2 (c_proj)
    ]


def test_what_a_selective_op_checkpoint_saves_reaches_the_saved_tensor_hooks(monkeypatch):
    """Observed where autograd hands tensors to the ledger (zerospec/zero/saved.py's pack): each
    block's checkpoint saves its input, then the kept outputs in the order they ran, and nothing
    else; the dtypes are the kernels' (the log-sum-exp fp32)."""
    from zerospec.zero.saved import SavedTensors
    seen, pack = [], SavedTensors.pack

    def spy(self, t):
        if self.category == "checkpoints":
            seen.append((tuple(t.shape), t.dtype))
        return pack(self, t)
    monkeypatch.setattr(SavedTensors, "pack", spy)
    train(TrainConfig.of(stage=0, n_d=1, model=LLAMA, steps=1, global_batch=2,
                         activation_checkpointing="selective-op"))
    B, T, C, H, kv, hd, ff, f32 = 2, 16, 32, 4, 2, 8, 48, torch.float32
    block = [((B, T, C), f32), ((B * T, C + 2 * kv * hd), f32), ((B, T, C), f32),
             ((B, H, T), f32), ((B * T, ff), f32), ((B * T, C), f32)]
    assert seen == block * LLAMA.n_layer


def test_selective_op_keeps_no_addmm_and_no_eager_attention():
    """With biases every projection is an aten.addmm and eager attention runs bmm: none of them
    is on torchtitan's list, so a GPT-2 block keeps nothing but its input."""
    gpt2 = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_embd=32)
    assert kept_by_one_block(gpt2) == []


def test_selective_layer_k_checkpoints_the_blocks_torchtitan_counts_to_a_multiple_of_k():
    """torchtitan counts blocks from 1 and wraps block c when c % K == 0."""
    assert [i for i in range(6) if selective.checkpointed(i, 2)] == [1, 3, 5]
    assert [i for i in range(6) if selective.checkpointed(i, 3)] == [2, 5]
    assert [i for i in range(3) if selective.checkpointed(i, 1)] == [0, 1, 2]


@pytest.mark.parametrize("mode", ["full", "selective-op", "selective-layer:2"])
@pytest.mark.parametrize("stage", [0, 3])
def test_every_mode_trains_bit_identically_to_no_checkpointing(mode, stage):
    """Losses, every rank's master weights: torch.equal with and without (the recompute runs the
    same kernels on the same inputs; selective-op hands back what those kernels returned)."""
    assert_same_training(trained("none", stage), trained(mode, stage))


def test_the_ledger_holds_each_modes_checkpoints_and_no_more():
    """At the end of forward, one checkpoint is a block's input (B·T·C fp32 on the CPU):
    full keeps L of them, selective-layer:2 of L = 3 one (block 2's), selective-op L plus what
    each block's policy keeps; the blocks selective-layer leaves alone keep their activations."""
    B, T, C, H, kv, hd, ff, L = 2, 16, 32, 4, 2, 8, 48, 3
    ck = B * T * C * 4
    kept = (B * T * (C + 2 * kv * hd) + B * T * C + B * T * ff + B * T * C) * 4 + B * H * T * 4
    none, full = trained("none"), trained("full")
    assert at_forward_end(none, "checkpoints") == 0
    assert at_forward_end(full, "checkpoints") == L * ck
    assert at_forward_end(trained("selective-layer:2"), "checkpoints") == ck
    assert at_forward_end(trained("selective-op"), "checkpoints") == L * (ck + kept)
    block = (at_forward_end(none, "activations") - at_forward_end(full, "activations")) // L
    assert at_forward_end(trained("selective-layer:2"), "activations") == \
        at_forward_end(full, "activations") + (L - 1) * block


def test_selective_op_recomputes_only_the_even_matmuls():
    """On meta, torch's FLOP formulas: backward with selective-op less backward without is one
    forward of wo and w3 per block (2·tokens·C·C + 2·tokens·C·d_ff); the kept mms are not run."""
    cfg = GPTConfig(vocab_size=64, block_size=16, n_layer=3, n_head=4, n_embd=32, n_kv_head=2,
                    norm="rmsnorm", mlp="swiglu", d_ff=48, positions="rope",
                    tie_embeddings=False, bias=False, attention="sdpa")

    def backward(mode):
        r = measure(TrainConfig.of(stage=0, n_d=1, model=cfg, count_flops=True,
                                   activation_checkpointing=mode), micro_batch=2)
        return r.classes[0].output.flops[0]["backward"]
    tokens, C, ff = 2 * 16, 32, 48
    assert backward("selective-op") - backward("none") == 3 * 2 * tokens * (C * C + C * ff)


def test_the_options_refuse_a_second_rule_naming_both_and_a_bad_mode():
    """Megatron's segments of K and torchtitan's modes are two rules for the same blocks; full
    and K = 1 say the same and are taken."""
    with pytest.raises(ValueError, match="activation checkpointing with selective activation "
                                         "checkpointing .* refused: --activation-checkpointing "
                                         "selective-op or selective-layer:K .* and "
                                         "--checkpoint-activations K"):
        TrainConfig.of(model=LLAMA, activation_checkpointing="selective-op",
                       checkpoint_activations=2)
    assert TrainConfig.of(model=LLAMA, activation_checkpointing="full",
                          checkpoint_activations=1).segment_blocks == 1
    with pytest.raises(ValueError, match="none, full, selective-op, selective-layer:K.*'op'"):
        TrainConfig.of(model=LLAMA, activation_checkpointing="op")
    with pytest.raises(ValueError, match="at most n_layer=3"):
        TrainConfig.of(model=LLAMA, activation_checkpointing="selective-layer:4")


def test_the_cli_takes_a_mode_and_refuses_a_bad_one_or_both_rules_in_one_line(capsys):
    """--activation-checkpointing reaches TrainConfig; selective-layer:0, or a mode beside
    --checkpoint-activations 2: exit 2, one line naming the values."""
    args = ["train", "--stage", "3", "--ranks", "2", "--steps", "1", "--model", "odd"]
    assert main([*args, "--activation-checkpointing", "selective-op"]) == 0
    capsys.readouterr()
    assert main([*args, "--activation-checkpointing", "selective-layer:0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'selective-layer:0'" in err
    assert main([*args, "--activation-checkpointing", "full", "--checkpoint-activations", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "activation_checkpointing='full'" in err \
        and "checkpoint_activations=2" in err
