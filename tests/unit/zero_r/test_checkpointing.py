"""zerospec/zero_r/checkpointing.py: segments of k blocks, what the ledger counts, what stage 3
gathers again, and how a bad k is refused (TrainConfig and the CLI). The recompute's FLOPs are
measured at paper scale, tests/claims/test_activations.py (C27)."""
from __future__ import annotations

import functools

import pytest

from tests.support.runs import assert_same_training
from zerospec.__main__ import main
from zerospec.model.gpt import ODD, GPTConfig
from zerospec.training.config import TrainConfig
from zerospec.training.sections import ZeroROptions
from zerospec.training.run import train
from zerospec.zero_r import segments

ODD3 = GPTConfig(vocab_size=37, block_size=12, n_layer=3, n_head=3, n_embd=15)   # k = 2 leaves 1
N = 4


@functools.lru_cache(maxsize=None)
def trained(k: int, stage: int = 0, model: GPTConfig = ODD3, **kw):
    return train(TrainConfig.of(stage=stage, n_d=N, model=model, steps=2, checkpoint_activations=k,
                                **kw))


def at_forward_end(r, category: str, rank: int = 0) -> int:
    return r.memory[rank].snapshots_by_label()["forward@1"][0].current[category]


def test_segments_cut_the_blocks_into_runs_of_k_the_last_one_shorter():
    """k blocks per checkpoint; the last segment holds what is left; k = 0 checkpoints nothing."""
    assert segments(1, 3) == [range(0, 1), range(1, 2), range(2, 3)]
    assert segments(2, 3) == [range(0, 2), range(2, 3)]
    assert segments(3, 3) == [range(0, 3)]
    assert segments(0, 3) == []


@pytest.mark.parametrize("k", [-1, 4, 1.0, True, "1"], ids=repr)
def test_a_k_that_is_not_0_or_1_to_n_layer_blocks_is_refused_naming_it(k):
    """TrainConfig refuses k outside 0..L (or not an int), naming the value and the range."""
    with pytest.raises(ValueError, match=r"checkpoint_activations must be 0 \(off\) or blocks per "
                                         r"checkpoint 1\.\.3 \(n_layer\), got " + repr(repr(k))[1:-1]):
        TrainConfig(model=ODD3, zero_r=ZeroROptions(checkpoint_activations=k))


@pytest.mark.parametrize("k", [1, 2, 3])
def test_training_is_bit_identical_with_a_checkpoint_every_k_blocks(k):
    """Stage 3, N = 4, three blocks: every k, the short last segment included, changes no bit."""
    assert_same_training(trained(0, 3), trained(k, 3))


def test_gradient_accumulation_with_checkpointing_is_bit_identical():
    """G = 2 micro-batches (exact fp64 sums), stage 3: checkpointing on vs off, the same bits."""
    assert_same_training(trained(0, 3, grad_accum_steps=2), trained(1, 3, grad_accum_steps=2))


@pytest.mark.parametrize("k", [1, 2, 3])
def test_the_ledger_counts_checkpoints_and_one_segments_recompute_apart(k):
    """At the end of forward: one checkpoint (B·T·C fp32 on CPU) per segment and, under
    "activations", only what lies outside the blocks; in backward the recompute holds exactly k
    blocks' activations (one block's = the plain run's activations less those outside, over L)."""
    plain, r = trained(0), trained(k)
    b, T, C, L = 2, ODD3.block_size, ODD3.n_embd, ODD3.n_layer        # 2 sequences per rank
    outside = at_forward_end(trained(1), "activations")
    per_block = (at_forward_end(plain, "activations") - outside) // L
    for rank in range(N):
        assert at_forward_end(r, "checkpoints", rank) == len(segments(k, L)) * b * T * C * 4
        assert at_forward_end(r, "activations", rank) == outside
        assert at_forward_end(r, "recomputed", rank) == 0
        assert r.memory[rank].peak["recomputed"] == k * per_block
    assert per_block * L == at_forward_end(plain, "activations") - outside > 0


def test_stage3_gathers_each_block_again_once_in_the_recompute_and_nothing_more():
    """P_os+g+p: the recompute's all-gathers replace backward's re-gathers one for one — the same
    collectives in forward and in backward as without checkpointing (3Ψ, C24), and no more
    gathered bytes at once (a block is gathered for its recompute and kept through its backward)."""
    plain, r = trained(0, 3), trained(1, 3)
    for rank in range(N):
        for phase in ("forward", "backward"):
            sizes = sorted(c.numel for c in r.comm.records(rank, phase=phase, op="all_gather"))
            assert sizes == sorted(c.numel for c in plain.comm.records(rank, phase=phase,
                                                                        op="all_gather"))
        assert r.comm.elements(rank) == plain.comm.elements(rank)
        assert r.memory[rank].peak["gathered"] == plain.memory[rank].peak["gathered"]
    block = r.units[1].padded
    assert sum(c.numel == block for c in r.comm.records(0, phase="backward", step=1,
                                                         op="all_gather")) == ODD3.n_layer


def test_the_cli_trains_with_checkpointing_and_refuses_a_bad_k_in_one_line(capsys):
    """--checkpoint-activations K reaches TrainConfig; K out of range exits 2 with one line."""
    args = ["train", "--stage", "3", "--ranks", "2", "--steps", "2", "--model", "odd"]
    assert main([*args, "--checkpoint-activations", "1"]) == 0
    assert "activation checkpoint every 1 block(s)" in capsys.readouterr().out
    assert main([*args, "--checkpoint-activations", "3"]) == 2
    err = capsys.readouterr().err
    assert err == ("zerospec: error: checkpoint_activations must be 0 (off) or blocks per "
                   "checkpoint 1..2 (n_layer), got 3\n")
    assert ODD.n_layer == 2
