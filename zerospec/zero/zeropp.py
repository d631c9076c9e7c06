"""ZeRO++'s quantized collectives for stage 3 (arXiv:2306.10209; D2's qwZ and qgZ rows, D3).

**qwZ** (``zero_quantized_weights``): each all-gather of a unit's fp16 weights over the DP group
carries int8 codes, 1 B per element, plus one fp32 scale per group (comm/quantize.py: DeepSpeed's
block-symmetric kernel); every rank dequantizes what arrives — its own chunk too, so all ranks hold
the same values. Cross-node bytes of the gather: half of fp16's (D2: M → 0.5M), plus the scales.
With hpZ, backward gathers from the secondary shards inside the node, unquantized (zero/hpz.py).

**qgZ** (``zero_quantized_gradients``): a unit's gradient reduce-scatter becomes DeepSpeed's
``all_to_all_quant_reduce`` (runtime/comm/coalesced_collectives.py; read, not copied), a
hierarchical all-to-all on int4 codes. Rank r = a·G + i (node a, local index i) owns chunk r of
the padded unit (c elements), as in stage 3:

1. inside the node (group ``local``): to local rank j go the n chunks {b·G + j}, quantized;
   each rank dequantizes the G pieces it got and sums them (fp32, local order);
2. across nodes (group ``global``, the n GPUs of local index i): the partial sums are quantized
   again and chunk b·G + i goes to node b; each rank dequantizes the n pieces and sums them, then
   divides by N (the mean) and rounds once to fp16.

Every reduction adds dequantized values (D3): codes under different scales are never added.
Cross-node bytes per GPU: (n−1)·c/2 of int4, (n−1)/n · P/2 bytes per node for a unit of P padded
elements, a quarter of fp16's (D2: M → 0.25M), plus scales. DeepSpeed falls back to a plain
reduce-scatter for a 1-D tensor and for one whose size is not a multiple of 2N; zerospec reduces
a unit's flat gradient as one tensor (DeepSpeed: each parameter's, one tensor of the list its
bucket hands over), so a unit whose parameters are all 1-D (the final LayerNorm) or whose padded
size is not a multiple of 2N goes as stage 3's fp16 reduce-scatter, listed in ``qgz_fallback`` and
booked as the reduce-scatter it is.

**With C_B's buckets** each unit waits whole in a bucket and is reduced on its own when the bucket
is flushed, through :meth:`reduce_unit` (zero_r/unit_buckets.py, after DeepSpeed's
``all_to_all_quant_reduce``, which takes the bucket as a list): the same bits as without buckets.
**With exact sums** (gradient accumulation, zero/exact.py) each micro-batch's gradient goes
through qgZ's reduction (:meth:`reduce_sum`), as DeepSpeed's stage 3 reduces every micro-step
(``stage3.py: __avg_scatter_grads``); the mean, rounded to fp16 as DeepSpeed's dequantize
(``dequantize<__half>``) rounds it, times N is added into the fp64 shard: the sum is exact over
the quantized reductions (spec/zeropp.md, "qgZ with gradient accumulation").

Both are approximate by design: bounds in comm/quantize.py and tests/unit/zero/test_zeropp.py,
training's divergence from stage 3 measured in spec/zeropp.md. Wire buffers (codes, scales) are
counted under ``buffer``; the fp32 dequantized sums are not (DeepSpeed's kernel dequantizes and
reduces in registers).
"""
from __future__ import annotations

import functools

import torch

from ..comm.groups import Nodes
from ..comm.quantize import dequantize, group_size, quantize


def falls_back(unit, n: int) -> bool:
    """qgZ sends this unit as a plain reduce-scatter (DeepSpeed's fall-back, see the module)."""
    return all(len(p.shape) == 1 for p in unit.params) or unit.padded % (2 * n) != 0


def check(cfg) -> None:
    """``qwz``, ``qgz`` and ``quant_group_size`` of a TrainConfig: ValueError naming the value."""
    for name in ("qwz", "qgz"):
        v = getattr(cfg, name)
        if not isinstance(v, bool):
            raise ValueError(f"{name} must be True or False, got {v!r}")
    if not (cfg.qwz or cfg.qgz):
        return
    on = " and ".join(n for n in ("qwz", "qgz") if getattr(cfg, n))
    if cfg.stage != 3:
        raise ValueError(f"{on} quantize ZeRO-3's collectives over the data-parallel ranks: they "
                         f"need stage 3, got stage={cfg.stage}")
    if cfg.qgz and cfg.gpus_per_node and cfg.gpus_per_node % cfg.n_m:
        raise ValueError(f"qgz's hops run inside and across nodes of data-parallel ranks: with "
                         f"n_m={cfg.n_m} a node of gpus_per_node={cfg.gpus_per_node} GPUs must hold "
                         f"whole model-parallel groups; accepted: a multiple of {cfg.n_m}")
    if cfg.precision not in ("fp16", "bf16"):
        raise ValueError(f"{on} quantize 16-bit parameters and gradients (DeepSpeed's kernels take "
                         f"fp16/bf16), got precision={cfg.precision!r} (fp32 parameters); "
                         f"accepted: 'fp16', 'bf16'")
    if cfg.flavour == "fsdp2":   # its custom comms quantize each group's rows: zero/fsdp2.py
        return
    for u in cfg.units():
        if cfg.qwz or not falls_back(u, cfg.shard_size):
            group_size(u.chunk, cfg.quant_group_size, f"shard of unit {u.name!r}")


class Quantized:
    """qwZ and/or qgZ in front of a stage-3 class (see the module doc)."""

    def __init__(self, ctx, *args, qwz: bool, qgz: bool, quant_group_size: int | None,
                 gpus_per_node: int | None, qgz_groups=None, **kwargs):
        """``qgz_groups``: with qgZ, this rank's (local, global) all-to-all groups, the run's
        mesh's (comm/mesh.py: the nodes of the ranks the stage sees, its DP or MiCS partition
        group)."""
        self.qwz, self.qgz = qwz, qgz
        self.nodes = Nodes(ctx.n_ranks, gpus_per_node)
        if qgz:
            local, across = qgz_groups
            self.local_comm, self.global_comm = ctx.comm.subgroup(local), ctx.comm.subgroup(across)
        super().__init__(ctx, *args, **kwargs)
        self.qgz_fallback = [u.name for u in self.units if qgz and falls_back(u, ctx.n_ranks)]
        self.quant_group = [group_size(u.chunk, quant_group_size) if qwz or not falls_back(
            u, ctx.n_ranks) else 0 for u in self.units]

    # -- qwZ ---------------------------------------------------------------------------------------
    def gather_unit(self, i: int, full: torch.Tensor, chunk: torch.Tensor) -> torch.Tensor:
        if not self.qwz:
            return super().gather_unit(i, full, chunk)
        return quantized_all_gather(full, chunk, self.comm, self.quant_group[i], self.memory)

    # -- qgZ ---------------------------------------------------------------------------------------
    def _quantizes(self, i: int) -> bool:
        return self.qgz and self.units[i].name not in self.qgz_fallback

    def reduce_unit(self, i: int, out: torch.Tensor, slot: torch.Tensor, post: bool = False) -> None:
        if not self._quantizes(i):
            return super().reduce_unit(i, out, slot, post)
        quantized_reduce_scatter(out, slot, self.local_comm, self.global_comm,
                                 self.nodes.n_nodes, self.quant_group[i], self.memory)

    def grad_ready(self, i: int, slot: torch.Tensor) -> None:
        """With exact sums and no buckets, a quantized unit's micro-batch gradient goes through
        :meth:`reduce_sum` and is added into the shard's fp64 sum (see the module doc); all else
        as the stage does it (buckets hand every unit to ``reduce_sum`` themselves)."""
        if not (self.exact_sums and self.fused is self.comm and self._quantizes(i)):
            return super().grad_ready(i, slot)
        part = self.memory.alloc("buffer", (self.units[i].chunk,), torch.float64, zero=False)
        self.reduce_sum(i, part, slot)
        if self.grad_buffer is None:       # M_D's reused slot stays
            self.memory.free(slot)
        self.grad_for_step(i).add_(part)   # exact: fp16 values times N, summed in fp64
        self.memory.free(part)

    def reduce_sum(self, i: int, out: torch.Tensor, slot: torch.Tensor) -> None:
        """qgZ under exact sums: the micro-batch's quantized mean, rounded to fp16 as qgZ's
        reduction always is, times N: the sum over the ranks it stands for, exact in fp64 (an fp16
        value times N ≤ 2^13 has at most 24 significant bits), so the one division by N·G gives
        back the mean of the G quantized means, rounded once."""
        if not self._quantizes(i):
            return super().reduce_sum(i, out, slot)
        mean = self.memory.alloc("buffer", (self.units[i].chunk,), slot.dtype, zero=False)
        self.reduce_unit(i, mean, slot)
        out.copy_(mean).mul_(self.ctx.n_ranks)   # exact (see above)
        self.memory.free(mean)


def _wire(memory, codes: torch.Tensor, inv: torch.Tensor):
    """Count a quantizer's outputs (what goes on the wire) in the memory ledger."""
    return memory.track("buffer", codes), memory.track("buffer", inv)


def quantized_all_gather(full: torch.Tensor, chunk: torch.Tensor, comm, g: int,
                          memory) -> torch.Tensor:
    """qwZ: ``full`` gets every rank's ``chunk`` as int8 codes (1 B per element) and one fp32
    scale per group of ``g``, dequantized to ``full``'s dtype — this rank's own chunk too."""
    c = chunk.numel()
    codes, inv = _wire(memory, *quantize(chunk, g, 8))
    all_codes = memory.alloc("buffer", (full.numel(),), codes.dtype, zero=False)
    all_inv = memory.alloc("buffer", (inv.numel() * comm.n_ranks,), inv.dtype, zero=False)
    comm.all_gather(all_codes, codes)
    comm.all_gather(all_inv, inv)
    full.copy_(dequantize(all_codes, all_inv, g, 8, c, full.dtype))
    for t in (codes, inv, all_codes, all_inv):
        memory.free(t)
    return full


def quantized_reduce_scatter(out: torch.Tensor, x: torch.Tensor, local_comm, global_comm,
                             n: int, g: int, memory) -> torch.Tensor:
    """qgZ: ``out`` (chunk r of N = n·G, fp16) gets the mean over every rank of its ``x``'s chunk
    r, by the two quantized all-to-alls of the module doc (groups of ``g`` in each chunk)."""
    total = quantized_mean(x, local_comm, global_comm, n, g, out.numel(), memory)
    return out.copy_(total)                   # the mean, rounded once to the gradient's dtype


def quantized_mean(x: torch.Tensor, local_comm, global_comm, n: int, g: int, c: int,
                   memory) -> torch.Tensor:
    """The fp32 mean over every rank of chunk r of ``x`` (N chunks of ``c``, rank-major), r this
    rank's: qgZ's two all-to-alls (module doc), groups of ``g`` in each chunk."""
    G = local_comm.n_ranks
    # step 1: piece j holds chunks {b·G + j : b < n}, the ones local rank j reduces
    pieces = x.view(n, G, c).transpose(0, 1).reshape(G, n * c)
    part = _exchange(local_comm, pieces, g, c, memory)      # (G, n·c) fp32, dequantized
    part = part.sum(0) if G > 1 else part[0]                # reduced after dequantizing (D3)
    # step 2: chunk b·G + i to node b, quantized again
    got = _exchange(global_comm, part.view(n, c), g, c, memory)   # (n, c) fp32
    total = got.sum(0) if n > 1 else got[0]
    return total.div_(G * n)


def _exchange(comm, x: torch.Tensor, g: int, c: int, memory) -> torch.Tensor:
    """All-to-all of the rows of ``x`` (row k to the group's rank k) as int4 codes and fp32
    scales, groups of ``g`` inside each chunk of ``c``; returns the received rows dequantized
    (fp32), in the group's rank order."""
    k = x.shape[0]
    if k == 1:                       # a group of one: nothing travels, nothing is quantized
        return x.to(torch.float32)
    codes, inv = _wire(memory, *quantize(x.reshape(-1), g, 4, c))
    got_codes = memory.alloc("buffer", codes.shape, codes.dtype, zero=False)
    got_inv = memory.alloc("buffer", inv.shape, inv.dtype, zero=False)
    comm.all_to_all(got_codes, codes)
    comm.all_to_all(got_inv, inv)
    out = dequantize(got_codes, got_inv, g, 4, c).view(k, -1)
    for t in (codes, inv, got_codes, got_inv):
        memory.free(t)
    return out


@functools.cache
def with_zeropp(cls: type) -> type:
    """``cls`` (a stage-3 class) with qwZ/qgZ in front."""
    return type(f"Quantized{cls.__name__}", (Quantized, cls), {})
