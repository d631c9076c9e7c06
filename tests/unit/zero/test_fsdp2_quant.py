"""qwZ and qgZ under the FSDP2 flavour (zerospec/zero/fsdp2_quant.py): FSDP2's custom all-gather
and reduce-scatter quantize each group's flat buffer, rank major, as the owner's hook sees it.

The expected values are computed here with plain torch ops from what the run holds before each
collective (the fp32 shards; the bf16 unsharded gradients), with DeepSpeed's block-symmetric rule
written out below from its kernel (``csrc/includes/quantization_utils.h``): per group of g
elements, s = 2^b / (2·max|x|) (1 when all zero), q = round-half-even(x·s) clamped to
[−2^(b−1), 2^(b−1) − 1], the value q·(1/s) in fp32. Two shapes, one node each:

* a 2-block GPT-2 (V = 37, T = 12, C = 16, tied head) on N = 4: the root group (embeddings, final
  norm) is a row of 196 + 8 elements, one quantization group whose scale the embeddings' largest
  weight sets (per unit, the final norm's weights of 1 would have their own);
* ODD (C = 15, 3 heads) on N = 2: the root group's row is 383 elements, odd, so qgZ pads each
  row with one zero to whole bytes of int4 codes.
"""
from __future__ import annotations

import pytest
import torch

from zerospec.model.gpt import ODD, GPTConfig
from zerospec.training.config import TrainConfig
from zerospec.training.run import train
from zerospec.zero import fsdp2
from zerospec.zero.fsdp2 import FSDP2Parameters

M = GPTConfig(vocab_size=37, block_size=12, n_layer=2, n_head=4, n_embd=16)
TARGET = 8000   # DeepSpeed's CUDAQuantizer.target_group_size


def _deq(x: torch.Tensor, bits: int) -> torch.Tensor:
    """x (fp32, a row) through DeepSpeed's block-symmetric quantizer and back, groups of the
    fewest near-equal sizes of at most TARGET."""
    k = -(-x.numel() // TARGET)
    g = -(-x.numel() // k)
    out = torch.empty_like(x)
    for a in range(0, x.numel(), g):
        grp = x[a:a + g]
        m = grp.abs().max()
        s = torch.tensor(1.0) if m == 0 else torch.tensor(2.0 ** bits) / (2 * m)
        half = 2 ** (bits - 1)
        q = torch.clamp(torch.round(grp * s), -half, half - 1)
        out[a:a + g] = q * (1 / s)
    return out


@pytest.fixture(scope="module", params=[(M, 4), (ODD, 2)], ids=["N=4", "ODD N=2"])
def run(request):
    """One step with qwZ and qgZ: each rank's fp32 shards and its first forward gather of each
    unit; each rank's bf16 unsharded gradients and the sharded gradients they became."""
    model, n = request.param
    seen = {"shards": {}, "gathered": {}, "grads": {}, "sharded": {}}
    acquire, reduce, end = FSDP2Parameters.acquire, FSDP2Parameters._reduce, \
        FSDP2Parameters.end_backward

    def spy_acquire(self, i):
        r = self.ctx.rank
        seen["shards"].setdefault(r, [p.clone() for p in self.param32])
        full = acquire(self, i)
        if self.ctx.phase_name == "forward":
            seen["gathered"].setdefault(r, {}).setdefault(i, full.clone())
        return full

    def spy_reduce(self, group, slots):
        seen["grads"].setdefault(self.ctx.rank, {})[tuple(group)] = [s.clone() for s in slots]
        return reduce(self, group, slots)

    def spy_end(self):
        seen["sharded"][self.ctx.rank] = [g.clone() for g in self.grad32]
        return end(self)

    mp = pytest.MonkeyPatch()
    mp.setattr(FSDP2Parameters, "acquire", spy_acquire)
    mp.setattr(FSDP2Parameters, "_reduce", spy_reduce)
    mp.setattr(FSDP2Parameters, "end_backward", spy_end)
    try:
        cfg = TrainConfig.of(stage=3, n_d=n, model=model, steps=1, precision="bf16",
                             flavour="fsdp2", qwz=True, qgz=True)
        seen["result"] = train(cfg)
    finally:
        mp.undo()
    return cfg, seen


def _groups(cfg) -> list[list[int]]:
    root, _ = fsdp2.groups(cfg.model, cfg.tiles)
    return [sorted(root)] + [[i] for i in range(len(cfg.units())) if i not in root]


def test_qwz_gathers_each_groups_flat_copy_in_quantized_as_one_row_on_every_rank(run):
    """Every rank's unsharded parameters are the bf16 casts of every rank's row of the group's
    flat copy-in (the root's units together), each row through int8 and back, cast to bf16."""
    cfg, seen = run
    units, n_ranks = cfg.units(), cfg.n_d
    for group in _groups(cfg):
        rows = [torch.cat([seen["shards"][r][i].to(torch.bfloat16).float() for i in group])
                for r in range(n_ranks)]
        deq = torch.stack([_deq(x, 8) for x in rows]).to(torch.bfloat16)   # (N, C)
        a = 0
        for i in group:
            c, n = units[i].chunk, units[i].numel
            want = deq[:, a:a + c].reshape(-1)[:n]
            for r in range(n_ranks):
                assert torch.equal(seen["gathered"][r][i], want), (i, r)
            a += c


def test_qgz_reduces_each_groups_rank_major_input_through_int4_and_back(run):
    """Each rank's fp32 sharded gradient is the mean over ranks, summed in rank order, of its
    chunk of every rank's row (each unit's r-th chunk, the root's together; an odd row padded
    with one zero), each chunk through int4 and back: one node, so the hop across nodes moves
    nothing."""
    cfg, seen = run
    units, n_ranks = cfg.units(), cfg.n_d
    for group in _groups(cfg):
        c_row = sum(units[i].chunk for i in group)

        def row(src: int, dst: int) -> torch.Tensor:   # src's chunk dst of the group, fp32
            parts = []
            for s, i in zip(seen["grads"][src][tuple(group)], group):
                c, n = units[i].chunk, units[i].numel
                part = torch.zeros(c)
                lo = dst * c
                part[:max(0, min(c, n - lo))] = s[lo:lo + c].float()
                parts.append(part)
            return torch.cat(parts + [torch.zeros(c_row % 2)])

        for dst in range(n_ranks):
            total = _deq(row(0, dst), 4)
            for src in range(1, n_ranks):
                total = total + _deq(row(src, dst), 4)
            got = torch.cat([seen["sharded"][dst][i] for i in group])
            assert torch.equal(got, (total / n_ranks)[:c_row]), (group, dst)


def test_the_wire_carries_int8_and_int4_codes_and_one_fp32_scale_per_row(run):
    """Traffic: each all-gather moves N rows of int8 codes (1 B an element) and one fp32 scale a
    row; each reduce's all-to-all N rows of packed int4 (half a byte, an odd row padded) and a
    scale a row: the root group in one collective, each block in its own; backward re-gathers
    the first block only. Ledger: the wire buffers peak at a block's gather, codes and scales
    sent and received."""
    cfg, seen = run
    units, result, n = cfg.units(), seen["result"], cfg.n_d
    root, block = sum(units[i].chunk for i in _groups(cfg)[0]), units[1].chunk   # rows
    got = [(x.phase, x.op, str(x.dtype).split(".")[1], x.numel) for x in result.comm.records(0)]
    gather = lambda ph, c: [(ph, "all_gather", "int8", n * c), (ph, "all_gather", "float32", n)]
    reduce = lambda c: [("backward", "all_to_all", "uint8", n * -(-c // 2)),
                        ("backward", "all_to_all", "float32", n)]
    assert got == [*gather("forward", root), *gather("forward", block), *gather("forward", block),
                   *reduce(block), *gather("backward", block), *reduce(block), *reduce(root)]
    assert result.memory[0].peak["buffer"] == block + 4 + n * block + 4 * n


def test_with_hpz_backward_gathers_the_post_forward_shards_through_the_same_int8_comm():
    """hpZ (h = 2 on N = 4): FSDP2's unshard hands the group's custom comm to the post-forward
    mesh's all-gather too, so backward's gather of a resharded block is each of the h ranks'
    post-forward shard (1/h of the block forward gathered, already dequantized) through int8 and
    back, over the h ranks."""
    seen: dict = {}
    acquire = FSDP2Parameters.acquire

    def spy(self, i):
        full = acquire(self, i)
        if self.ctx.rank == 0 and i == 1:
            seen.setdefault(self.ctx.phase_name, full.clone())
        return full

    mp = pytest.MonkeyPatch()
    mp.setattr(FSDP2Parameters, "acquire", spy)
    try:
        cfg = TrainConfig.of(stage=3, n_d=4, model=M, steps=1, precision="bf16", flavour="fsdp2",
                             qwz=True, gpus_per_node=4, hpz=2)
        result = train(cfg)
    finally:
        mp.undo()
    u = cfg.units()[1]
    fwd = torch.cat([seen["forward"].float(), torch.zeros(u.padded - u.numel)])
    half = u.padded // 2
    want = torch.cat([_deq(fwd[j * half:(j + 1) * half], 8) for j in range(2)])
    assert torch.equal(seen["backward"], want.to(torch.bfloat16)[:u.numel])
    assert [(x.dtype, x.numel) for x in result.comm.records(0, phase="backward", group="hpz")
            ][:2] == [(torch.int8, u.padded), (torch.float32, 2)]
