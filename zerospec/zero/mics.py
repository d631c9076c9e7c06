"""MiCS (Zhang et al., arXiv:2205.00119) and FSDP2's HSDP: shard over a group of p GPUs,
replicate over N/p such groups (``TrainConfig.shard_group`` = p; spec/mics.md).

The N data-parallel ranks split into N/p *partition groups* of p consecutive ranks (comm/groups.py
``shard_group``; with p the GPUs per node, a node) and p *replication groups* of the N/p ranks at
the same position in each (``replica_group``). A stage (1, 2 or 3) runs unchanged over its
partition group, as if p were the whole world: units are padded for p and rank r holds chunk
r mod p, so the model states are those of stage k at N_d = p (M1: 16Ψ/p in stage 3). Every
all-gather and reduce-scatter stays inside the partition group.

Gradients take two hops (M2): the stage's own reduction inside the group (each micro-step in
stages 2–3), then one all-reduce of each gradient shard, Ψ/p elements, across the replication
group at the accumulation boundary (grad_sync), once per step whatever G is. Then every replica
holds the same mean gradient shard, so the overflow vote and the clipping norm, taken over the
partition group, are the global ones, and the replicas step identically.

With hpZ (zero/hpz.py) a partition group spanning nodes keeps forward's gathers across them
and backward's inside each node: hpZ's secondary partition is h ranks of the group (h | p).

Arithmetic: with exact sums (fp64 of fp16 gradients, zerospec/zero/exact.py) the second hop sums
fp64 partial sums and the one division is by N·G: the result is the exact mean, so MiCS trains
bit-identically to the flat stage at N. Without them, each hop's mean is rounded to the gradient
dtype: (Σ_group / p) rounded, then (Σ_replicas / (N/p)) rounded, against the flat ring's one
rounding of Σ_all / N — the bound is derived in spec/mics.md.
"""
from __future__ import annotations

import contextlib
import functools

import torch

from ..comm.groups import divides, divisors
from ..runtime.observe import off_device


def check(cfg) -> None:
    """``shard_group`` of a TrainConfig: ValueError naming the value and what is accepted."""
    p = cfg.shard_group
    if p is None:
        return
    if not divides(p, cfg.n_d):
        raise ValueError(f"shard_group (MiCS's partition group size p)={p!r} must be an integer "
                         f"that divides the {cfg.n_d} data-parallel ranks; accepted: "
                         f"{', '.join(map(str, divisors(cfg.n_d)))}")
    if cfg.stage == 0:
        raise ValueError(f"shard_group={p} shards the model states of stage 1, 2 or 3 over p of "
                         f"the data-parallel ranks: it needs stage >= 1, got stage={cfg.stage}")
    g = cfg.gpus_per_node and cfg.gpus_per_node // cfg.n_m   # DP ranks per node
    if getattr(cfg, "qgz", False) and g and p % g:
        raise ValueError(f"shard_group={p} with qgz: qgZ's two hops run inside and across the "
                         f"nodes of the partition group, so it must be whole nodes of "
                         f"gpus_per_node={g}; accepted: a multiple of {g} dividing {cfg.n_d}")
    h = getattr(cfg, "hpz", 1)
    if h > 1 and p % h:
        # hpZ's secondary partition is a split of the partition group (FSDP2's HSDP asks the
        # same of an integer reshard_after_forward: a factor of the shard mesh's size,
        # torch/distributed/fsdp/_fully_shard/_fsdp_init.py: _get_post_forward_mesh_info)
        raise ValueError(f"hpz (zero_hpz_partition_size)={h} with shard_group (mics_shard_size)="
                         f"{p}: hpZ's secondary partition splits MiCS's partition group of {p} "
                         f"ranks, so h must divide p; accepted hpz: "
                         f"{', '.join(str(d) for d in divisors(p) if g is None or g % d == 0)}")

class ReplicatedShards:
    """A stage over its partition group, whose gradient shards are all-reduced across the
    replication group at the accumulation boundary (see the module doc). ``ctx``: the partition
    group's view of the rank, with ``replicas``, the replication group's interconnect. qwZ and
    qgZ (zero/zeropp.py) quantize the partition group's collectives; the replicas' all-reduce
    is not quantized."""

    def __init__(self, ctx, *args, **kwargs):
        self.replicas = ctx.replicas
        super().__init__(ctx, *args, **kwargs)

    def reduce_gradients(self) -> None:
        super().reduce_gradients()           # inside the partition group (exact: then _average)
        if not (self.exact_sums or self.shards_leave or self.reduces_each_micro_step):
            # rounded means: the second hop's mean (already done in shard_ready otherwise)
            self._across_replicas("mean")

    def _average(self) -> None:
        """Exact sums: add the replicas' fp64 partial sums (exact), then the one division by N·G."""
        if not self.shards_leave:
            self._across_replicas("sum")
        n = self.ctx.n_ranks * self.replicas.n_ranks * self.accum_steps
        with off_device() if self.shards_leave else contextlib.nullcontext():
            for i in range(len(self.units)):
                self.grad_for_step(i).div_(n)

    def shard_ready(self, i: int, shard: torch.Tensor, op: str) -> None:
        """ZeRO-Offload: the shard leaves the device in backward, so the replicas reduce it
        before, each micro-batch (G all-reduces per step instead of one). With exact sums the
        order of the fp64 additions cannot matter; with rounded means G = 1 and this is the
        boundary's hop: the same bits either way."""
        if self.replicas.n_ranks > 1:
            self.replicas.all_reduce(shard, op)

    def _across_replicas(self, op: str) -> None:
        if self.replicas.n_ranks == 1:
            return
        with self.replicas.batch():
            for i in range(len(self.units)):
                self.replicas.all_reduce(self.grad_for_step(i), op)


@functools.cache
def with_mics(cls: type) -> type:
    """``cls`` (a stage class 1–3, exact or not) over a partition group, replicated."""
    return type(f"Mics{cls.__name__}", (ReplicatedShards, cls), {})
