"""qgZ composed (zero/zeropp.py): with C_B's buckets each unit keeps its own quantization groups
(zero_r/unit_buckets.py), so the buckets change no bit; with gradient accumulation every
micro-batch goes through qgZ's reduction and the quantized means are summed exactly
(spec/zeropp.md, spec/accumulation.md).

Runs: a 2-block GPT on N = 4 virtual GPUs in 2 nodes of 2 (both of qgZ's hops carry codes); its
units' padded sizes are 784, 3280, 3280 and 32 (the final LayerNorm, all 1-D: qgZ's fall-back).
"""
from __future__ import annotations

from collections import Counter

import pytest
import torch

from tests.support.runs import assert_same_training
from zerospec.model.gpt import GPTConfig
from zerospec.training import run as run_module
from zerospec.training.config import TrainConfig
from zerospec.training.run import train

M = GPTConfig(vocab_size=37, block_size=12, n_layer=2, n_head=4, n_embd=16)
QGZ = dict(model=M, stage=3, n_d=4, gpus_per_node=2, qgz=True)


def _cfg(**kw) -> TrainConfig:
    return TrainConfig.of(**{**QGZ, "steps": 2, **kw})


def _wire(r, rank: int, step: int) -> Counter:
    """What ``rank`` put on the wire in ``step``: each collective's op, dtype, size, bytes, group."""
    return Counter((x.op, x.dtype, x.numel, x.bytes_sent, x.bytes_recv, x.group)
                   for x in r.comm.records(rank, step=step))


# -- qgZ with C_B ---------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("b", [4, 1000, "model"])
def test_qgz_through_buckets_trains_bit_for_bit_as_per_unit(b):
    """Buckets smaller than every unit, of about one unit, and of the whole model: every loss and
    master weight equals qgZ's without buckets (each unit quantized in its own groups)."""
    assert_same_training(train(_cfg(bucket_elements=b)), train(_cfg()))


def test_qgz_buckets_hold_units_whole_and_put_the_same_collectives_on_the_wire():
    """A bucket of at least the model holds every unit's fp16 gradient (2·Σ padded bytes) and
    sends the same collectives, each unit's codes and scales, only after backward's last gather;
    a bucket smaller than every unit holds one unit at a time (2·max padded bytes), full at once,
    so it is reduced where it would be without buckets: the same collectives in the same order."""
    cfg = _cfg(bucket_elements=10 ** 6)
    padded = [u.padded for u in cfg.units()]
    one, off, each = train(cfg), train(_cfg()), train(_cfg(bucket_elements=4))
    for rank in range(4):
        assert one.memory[rank].peak["bucket"] == 2 * sum(padded)
        assert each.memory[rank].peak["bucket"] == 2 * max(padded)
        assert one.memory[rank].current["bucket"] == each.memory[rank].current["bucket"] == 0
        assert off.memory[rank].peak["bucket"] == 0
        for step in (1, 2):
            assert _wire(one, rank, step) == _wire(off, rank, step) == _wire(each, rank, step)
    for r, after in ((one, True), (off, False)):   # the whole model's bucket: after every gather
        ops = [x.op for x in r.comm.records(0, step=2, phase="backward")]
        last_gather = max(k for k, op in enumerate(ops) if op == "all_gather")
        first_a2a = min(k for k, op in enumerate(ops) if op == "all_to_all")
        assert (first_a2a > last_gather) is after
    for rank in range(4):
        assert [(x.op, x.numel, x.group) for x in each.comm.records(rank)] == [
            (x.op, x.numel, x.group) for x in off.comm.records(rank)]


# -- qgZ with gradient accumulation -----------------------------------------------------------------
def _grads_after_step_1(cfg: TrainConfig, monkeypatch, half: int | None = None) -> list[list]:
    """Every rank's gradient of each unit as the step read it (step 1, from the initial weights);
    ``half``: the run's global batch is that half of the G = 2 runs' global batch."""
    if half is not None:
        full = run_module.make_batches(_cfg(grad_accum_steps=2, steps=1))[0]
        monkeypatch.setattr(run_module, "make_batches", lambda c: [tuple(
            t[half * len(t) // 2:(half + 1) * len(t) // 2] for t in full)])
    grads = {}
    train(cfg, on_step=lambda step, st: grads.setdefault(st.ctx.rank, [
        st.grad_for_step(i).clone() for i in range(len(st.units))]))
    monkeypatch.undo()
    return [grads[r] for r in range(4)]


def test_each_micro_batch_is_quantized_and_the_quantized_means_are_summed_exactly(monkeypatch):
    """G = 2: a quantized unit's gradient is the fp64 mean of qgZ's two fp16 means, each taken
    from a run of qgZ alone on that micro-batch; the final LayerNorm, which qgZ sends unquantized,
    has accumulation's exact gradient (the run without qgZ)."""
    both = _grads_after_step_1(_cfg(grad_accum_steps=2, steps=1), monkeypatch)
    plain = [_grads_after_step_1(_cfg(steps=1), monkeypatch, half=k) for k in (0, 1)]
    exact = _grads_after_step_1(_cfg(grad_accum_steps=2, steps=1, qgz=False), monkeypatch)
    names = [u.name for u in _cfg().units()]
    for rank in range(4):
        for i, name in enumerate(names):
            got = both[rank][i]
            if name == "ln_f":
                assert torch.equal(got, exact[rank][i])
                continue
            m1, m2 = (p[rank][i] for p in plain)
            assert m1.dtype == torch.float16 and got.dtype == torch.float64
            assert torch.equal(got, (m1.double() + m2.double()) / 2), name


def test_two_micro_batches_of_the_same_tokens_train_as_one(monkeypatch):
    """G = 2 with both micro-batches holding micro-batch 0's tokens trains every loss and master
    weight bit for bit as G = 1 on it (exact sums: (2·N·m)/(2N) = m)."""
    one = _cfg(exact_grads=True)
    batches = run_module.make_batches(one)
    monkeypatch.setattr(run_module, "make_batches", lambda c: [
        tuple(torch.cat([t, t]) for t in b) for b in batches])
    twice = train(_cfg(grad_accum_steps=2))
    monkeypatch.undo()
    assert_same_training(twice, train(one))


@pytest.mark.slow
def test_accumulation_under_qgz_moves_quantized_codes_every_micro_batch():
    """Each micro-batch: the quantized units' int4 codes and fp32 scales (qgZ's bytes, as at
    G = 1), and the fall-back unit's fp64 reduce-scatter (accumulation's); nothing else. What is
    held is accumulation's: an fp64 gradient shard, 8 bytes per owned element, and no buffer left."""
    acc, one = train(_cfg(grad_accum_steps=2)), train(_cfg())
    exact = train(_cfg(grad_accum_steps=2, qgz=False))
    owned = sum(u.chunk for u in acc.config.units())
    for rank in range(4):
        assert acc.memory[rank].current["grad16"] == 8 * owned
        assert acc.memory[rank].current["buffer"] == 0       # qgZ's buffers all freed
        assert acc.model_states(rank) == exact.model_states(rank)
        def a2a(r):
            return Counter({k: v for k, v in _wire(r, rank, 2).items() if k[0] == "all_to_all"})
        assert a2a(acc) == Counter({k: 2 * v for k, v in a2a(one).items()}) != Counter()
        ln_f = [x for x in exact.comm.records(rank, step=2, op="reduce_scatter") if x.numel == 32]
        assert [(x.op, x.dtype, x.numel) for x in acc.comm.records(rank, step=2, op="reduce_scatter")
                ] == [(x.op, x.dtype, x.numel) for x in ln_f] == [("reduce_scatter", torch.float64, 32)] * 2


@pytest.mark.slow
def test_zero_offload_under_qgz_and_accumulation_reduces_through_qgz():
    """ZeRO-Offload's exact path reduces through the stage's hook: the same bits as without it."""
    kw = dict(grad_accum_steps=2)
    assert_same_training(train(_cfg(offload_optimizer="cpu", **kw)), train(_cfg(**kw)))
    assert_same_training(train(_cfg(offload_optimizer="cpu", bucket_elements=1000, **kw)),
                         train(_cfg(**kw)))
