"""torchtitan's selective modes under ZeRO-R's keepers: a selective checkpoint is a block's input,
kept as P_a (1/N_m per MP rank), P_a+cpu (on the host) or M_D (a slot of one buffer) keep a
Megatron segment's — the same bits, and the bytes each keeper's rule gives."""
from __future__ import annotations

import functools

import pytest

from tests.support.runs import assert_same_training
from zerospec.model.gpt import GPTConfig
from zerospec.training.config import TrainConfig
from zerospec.training.run import train
from zerospec.training.scale import measure

# Llama's block at toy size, every projection an aten.mm (what selective-op keeps); 4 blocks, so
# selective-layer:2 checkpoints two of them (blocks 2 and 4, counted from 1)
LLAMA = GPTConfig(vocab_size=64, block_size=8, n_layer=4, n_head=4, n_embd=16, n_kv_head=2,
                  norm="rmsnorm", mlp="swiglu", d_ff=24, positions="rope", tie_embeddings=False,
                  bias=False, attention="sdpa")
N_D, N_M = 2, 2
KEEPERS = {"P_a": {"partition_activations": True},
           "P_a+cpu": {"partition_activations": True, "cpu_checkpointing": True},
           "M_D": {"contiguous_checkpoints": True},
           "P_a+M_D": {"partition_activations": True, "contiguous_checkpoints": True}}
MODES = ["selective-op", "selective-layer:2"]


@functools.lru_cache(maxsize=None)
def run(mode: str, keeper: str = "") -> object:
    kw = KEEPERS.get(keeper, {})
    return train(TrainConfig.of(stage=3, n_d=N_D, n_m=N_M, model=LLAMA, steps=2,
                                activation_checkpointing=mode, **kw))


def at_forward_end(r, rank: int, category: str) -> int:
    return r.memory[rank].snapshots_by_label()["forward@1"][0].current[category]


def block_input(r) -> int:
    """One checkpoint, a block's input: b·s·d fp32 (CPU kernels compute in fp32)."""
    return r.config.batch // r.config.n_d * LLAMA.block_size * LLAMA.n_embd * 4


@pytest.mark.parametrize("mode,keeper", [   # the default run: each keeper once, the modes alternating
    pytest.param(m, k, id=f"{m}-{k}", marks=[pytest.mark.slow] * (m != MODES[(i + 1) % 2]))
    for i, k in enumerate(KEEPERS) for m in MODES])
def test_each_keeper_trains_a_selective_mode_bit_identically(mode, keeper):
    """Losses and master weights torch.equal to the same selective run without the keeper: the
    recompute starts from the same values, gathered, copied back or read from a slot."""
    assert_same_training(run(mode), run(mode, keeper))


@pytest.mark.parametrize("mode", MODES)
def test_p_a_keeps_one_n_m_th_of_each_selective_checkpoint_on_each_rank(mode):
    """At the end of forward each rank holds 1/N_m of every checkpointed block's input instead of
    all of it (L blocks under selective-op, L/K under selective-layer:K); the outputs selective-op
    keeps are each MP rank's own, kept as they were. P_a+cpu: those parts are on the host."""
    n = LLAMA.n_layer if mode == "selective-op" else LLAMA.n_layer // 2
    whole, pa, cpu = run(mode), run(mode, "P_a"), run(mode, "P_a+cpu")
    ck = block_input(whole)
    for rank in range(N_D * N_M):
        w = at_forward_end(whole, rank, "checkpoints")
        assert w - at_forward_end(pa, rank, "checkpoints") == n * ck * (N_M - 1) // N_M
        assert w - at_forward_end(cpu, rank, "checkpoints") == n * ck
        assert cpu.host[rank].peak["checkpoints"] == n * ck // N_M
        assert pa.memory[rank].current["checkpoints"] == cpu.host[rank].current["checkpoints"] == 0


@pytest.mark.parametrize("mode,slots,keeper,part", [   # the default run: each mode once, the keepers alternating
    pytest.param(mode, slots, keeper, part, id=f"{keeper}-{part}-{mode}-{slots}",
                 marks=[pytest.mark.slow] * (i % 2 != j))
    for j, (keeper, part) in enumerate([("M_D", 1), ("P_a+M_D", N_M)])
    for i, (mode, slots) in enumerate([("selective-op", 4), ("selective-layer:2", 2),
                                       ("selective-layer:3", 1), ("selective-layer:1", 4)])])
def test_m_d_allocates_one_buffer_of_the_selective_modes_checkpoints(mode, slots, keeper, part):
    """The buffer is allocated once per step and holds exactly the blocks the mode checkpoints:
    every block under selective-op, blocks K, 2K, … under selective-layer:K (4 blocks: 2 for K = 2,
    1 for K = 3), each b·s·d fp16 on meta (its 1/N_m part with P_a); freed in backward. The
    outputs selective-op keeps are saved beside it, none of the buffer's size."""
    r = measure(TrainConfig.of(stage=3, n_d=N_D, n_m=N_M, model=LLAMA,
                               activation_checkpointing=mode, **KEEPERS[keeper]),
                micro_batch=2, trace=True)
    size = slots * 2 * LLAMA.block_size * LLAMA.n_embd * 2 // part
    events = [(e.op, e.nbytes) for e in r.classes[0].memory.trace
              if e.category == "checkpoints" and e.op in ("alloc", "free")]
    assert events[0] == ("alloc", size)
    assert events.count(("alloc", size)) == events.count(("free", size)) == 1
    if mode != "selective-op":                   # selective-layer keeps nothing else
        assert events == [("alloc", size), ("free", size)]
