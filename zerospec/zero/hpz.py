"""ZeRO++'s hpZ (hierarchical partitioning, ``zero_hpz_partition_size`` = h): stage 3 whose
backward all-gather stays inside a node (D2's middle row, D6).

Forward gathers each unit over the whole DP group, as stage 3 does, and each GPU keeps a
*secondary* fp16 shard of it: 1/h of the unit, its slice for the h consecutive ranks of its
secondary partition (comm/groups.py ``hpz_group``; h dividing the GPUs per node puts the
partition inside a node). Backward — the re-gather of C24/C57, and a checkpointed segment's
recompute, which runs in backward — gathers the unit over those h ranks from their secondary
shards: on intra-node links only, so backward's cross-node volume is 0 (stage 3: M). With model
parallelism the partition is h consecutive ranks of the stage's DP group, h·N_m GPUs.

Memory (D6): the secondary shards of every unit, 2Ψ/h bytes (padded), live from forward to the
end of backward, then are freed: +2Ψ/h per GPU at the peak between forward and backward, none
after the step.

**With ZeRO-Infinity's parameter offload** (``offload_params="cpu"``) the secondary shards live
in host memory, as DeepSpeed keeps them: ``Init._partition_param_sec``
(deepspeed/runtime/zero/partition_parameters.py) allocates ``ds_secondary_tensor`` on
``remote_device``, which ``offload_param.device`` sets (pinned on the host), and its coalesced
gather moves it to the device (``p.ds_secondary_tensor.to(...)``) before the all-gather inside
the secondary group. So forward copies each 1/h shard down (device → host, booked ``to_host``)
and backward copies it up (``from_host``) and gathers it over the h ranks: +2Ψ/h on the host, not
on the device. ``offload_params="nvme"`` has no home for it: DeepSpeed passes the same
``remote_device`` to ``torch.empty``, and "nvme" is no torch device (:func:`check` says so).

**With MiCS** (``shard_group`` = p, zero/mics.py) the stage shards over the rank's partition
group, so forward's gather runs over those p ranks, crossing nodes when p exceeds the GPUs per
node, and units are padded for p. The secondary partition is h consecutive ranks of the DP
group, which lie inside one partition group because h divides p (mics.check) and inside one node
because h divides the GPUs per node: backward gathers over them, and each GPU holds 2Ψ_p/h, Ψ_p
padded for p. FSDP2's HSDP builds the same layout from an integer ``reshard_after_forward``, a
factor of the shard mesh's size (torch/distributed/fsdp/_fully_shard/_fsdp_init.py:
``_get_post_forward_mesh_info`` views the mesh as (-1, h)).

**With the FSDP2 flavour** (zero/fsdp2.py) hpZ is FSDP2's integer ``reshard_after_forward = h``,
which that stage class runs itself: its post-forward shard is freed at the block's backward
unshard, and the blocks it keeps unsharded keep none (training/step.py does not add this class).

No arithmetic: a secondary shard holds the bits forward gathered, so backward's gather returns
the bits stage 3's would, and hpZ trains bit-identically to stage 3 on every path (checkpointing,
accumulation, clipping, checkpoints). Rank r's secondary partition is in DP index space.
"""
from __future__ import annotations

import functools

import torch

from ..comm.groups import Nodes, divisors
from ..runtime.observe import off_device


def check(cfg) -> None:
    """``gpus_per_node`` and ``hpz`` of a TrainConfig: ValueError naming the value and what is
    accepted."""
    nodes = Nodes(cfg.n_ranks, cfg.gpus_per_node)     # refuses a G that does not divide N
    h = cfg.hpz
    if not isinstance(h, int) or isinstance(h, bool) or h < 1:
        raise ValueError(f"hpz (zero_hpz_partition_size) must be an integer >= 1 (1: off), got {h!r}")
    if h == 1:
        return
    g, m = nodes.per_node, cfg.n_m
    if g % (h * m):   # h consecutive DP ranks span h·N_m GPUs (rank = dp_index·N_m + mp_index)
        on = f" × n_m={m}" if m > 1 else ""
        raise ValueError(f"hpz (zero_hpz_partition_size)={h}{on} must divide the GPUs per node "
                         f"({g}) so that each secondary partition lies inside one node; accepted: "
                         f"{', '.join(str(d // m) for d in divisors(g) if d % m == 0)}")
    if cfg.stage != 3:
        raise ValueError(f"hpz={h} is a ZeRO-3 setting over the data-parallel ranks: it needs "
                         f"stage 3, got stage={cfg.stage}")
    if cfg.offload_params == "nvme":
        raise ValueError(f"hpz={h} with offload_params='nvme': DeepSpeed keeps hpZ's secondary "
                         f"partition on the parameters' offload device (_partition_param_sec: "
                         f"torch.empty(..., device=remote_device)), and NVMe is no device a "
                         f"tensor lives on; accepted: offload_params 'cpu' or None")


class SecondaryPartition:
    """hpZ in front of a stage-3 class (see the module doc): forward keeps a 1/h secondary shard
    of each unit it gathers; backward gathers from those shards over the h-rank partition."""

    def __init__(self, ctx, *args, hpz_group, hpz_on_host: bool = False, **kwargs):
        """``hpz_group``: this rank's secondary partition, the run's mesh's (comm/mesh.py: h
        consecutive ranks of its DP group); ``hpz_on_host``: with offloaded parameters (doc)."""
        self.h, self.on_host = hpz_group.size, hpz_on_host
        self.hpz_comm = ctx.comm.subgroup(hpz_group)
        self.secondary: dict[int, torch.Tensor] = {}
        super().__init__(ctx, *args, **kwargs)

    def acquire(self, i: int) -> torch.Tensor:
        if self.is_resident(i):
            return super().acquire(i)
        if self.ctx.phase_name == "backward":   # the re-gather, or a recompute inside backward
            return self._from_secondary(i)
        full = super().acquire(i)   # over the DP group, across nodes
        if i not in self.secondary:
            c = self.units[i].padded // self.h
            j = self.hpz_comm.rank
            piece = full[j * c:(j + 1) * c]
            if self.on_host:   # DeepSpeed's ds_secondary_tensor on the offload device (doc)
                with off_device():
                    sec = self.ctx.host.alloc("secondary16", (c,), self.dtype, zero=False)
                self.secondary[i] = self.comm.copy_to_host(sec, piece)
            else:
                sec = self.memory.alloc("secondary16", (c,), self.dtype, zero=False)   # 2·padded/h B
                self.secondary[i] = sec.copy_(piece)
        return full

    def _from_secondary(self, i: int) -> torch.Tensor:
        sec = self.secondary.get(i)
        if sec is None:
            raise RuntimeError(f"hpZ: unit {self.units[i].name!r} is gathered in backward but "
                               f"forward kept no secondary shard of it")
        full = self.memory.alloc("gathered", (self.units[i].padded,), self.dtype, zero=False)
        if not self.on_host:
            return self.hpz_comm.all_gather(full, sec)   # inside the node
        up = self.memory.alloc("secondary16", (sec.numel(),), self.dtype, zero=False)
        self.comm.copy_from_host(up, sec)   # host → device, then inside the node
        self.hpz_comm.all_gather(full, up)
        self.memory.free(up)
        return full

    def end_backward(self) -> None:
        """Backward is over: the secondary shards go (the next forward makes new ones)."""
        for sec in self.secondary.values():
            (self.ctx.host if self.on_host else self.memory).free(sec)
        self.secondary.clear()


@functools.cache
def with_hpz(cls: type) -> type:
    """``cls`` (a stage-3 class: the paper's, the exact one, DeepSpeed's) with hpZ in front."""
    return type(f"Hpz{cls.__name__}", (SecondaryPartition, cls), {})
