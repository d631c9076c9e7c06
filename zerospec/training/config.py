"""TrainConfig: everything that defines one training run, checked when it is made.

A bad value raises ValueError naming the value and what is accepted, before any rank starts.
"""
from __future__ import annotations

import dataclasses

import torch

from ..model import gpt
from ..model.units import Unit
from ..optim.adam import AdamConfig
from ..optim.loss_scale import LossScale
from ..optim.precision import POLICIES, Precision, policy
from ..zero import STAGES, ZERO1_COMM
from ..zero import hpz, mics, zeropp
from ..zero.exact import MAX_TERMS
from ..zero_r import buffers, checkpointing
from ..offload import check as check_offload
from . import combine

DEVICES = ("cpu", "meta")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    stage: int = 0
    n_d: int = 4                       # data-parallel degree N_d (ZeRO shards over these ranks)
    model: gpt.GPTConfig = gpt.SMALL
    global_batch: int | None = None    # default: 2 sequences per rank per micro-step
    steps: int = 5
    seed: int = 0
    zero1_comm: str = "reduce_scatter"
    adam: AdamConfig = AdamConfig()
    count_flops: bool = False
    device: str = "cpu"
    precision: str = "fp16"
    timeout: float = 120.0
    # surviving real conditions (spec/loss_scaling.md … checkpoints.md); defaults: the plain step
    loss_scale: LossScale | None = None       # dynamic fp16 loss scaling
    clip_grad_norm: float | None = None       # global-norm clipping threshold
    grad_accum_steps: int = 1                 # micro-batches per optimizer step (G)
    exact_grads: bool = False                 # exact fp64 gradient sums also when G = 1
    checkpoint_activations: int = 0           # ZeRO-R: blocks per checkpoint, 0 = off (zero_r/)
    bucket_elements: int | str | None = None  # ZeRO-R C_B: B-element buckets; "model": C29's
    #                                           naive fp32 buffer; None: per unit (zero_r/buffers.py)
    n_m: int = 1                              # model-parallel degree N_m: N = N_d × N_m ranks
    partition_activations: bool = False       # ZeRO-R's P_a: checkpoints split over the MP group
    cpu_checkpointing: bool = False           # P_a+cpu: the partitioned checkpoints in host memory
    contiguous_checkpoints: bool = False      # ZeRO-R's M_D: checkpoints in one buffer (zero_r/defrag.py)
    contiguous_gradients: bool = False        # M_D for stages 2–3: one reused gradient slot
    # DeepSpeed's ZeRO-3 settings (zero/ds3.py); 0, 0: the paper's P_os+g+p
    stage3_persistence_threshold: int = 0     # units of at most this many elements stay whole
    stage3_max_reuse_distance: int = 0        # keep gathered from forward to backward within this
    # nodes and ZeRO++'s hpZ (spec/nodes.md, zero/hpz.py): None = one node; hpz 1 = off
    gpus_per_node: int | None = None          # rank r sits on node r // gpus_per_node
    hpz: int = 1                              # zero_hpz_partition_size h: backward gathers in-node
    # ZeRO-Offload (zerospec/offload/, spec/offload.md); None: everything on the device
    offload_optimizer: str | None = None      # "cpu" | "nvme": fp32 states and Adam on the host
    offload_mode: str = "paper"               # "paper": fp16 grads down; "deepspeed": fp32 down
    offload_params: str | None = None         # "cpu" | "nvme": ZeRO-Infinity's fp16 parameters
    offload_partition: str = "bandwidth"      # "bandwidth": 1/N per PCIe link (C-I8); "owner"
    offload_buffer_elements: int | None = None  # NVMe params: one host staging buffer this big
    offload_prefetch: bool = False            # C-I8's prefetcher: i+1 gathered, i+2 up, i+3 read
    nvme_path: str | None = None              # the NVMe tier's directory (None: a temporary one)
    dpu: int = 0                              # delayed parameter update from step N (0: off, B8)
    # MiCS / FSDP2's HSDP (spec/mics.md, zero/mics.py): shard over p ranks, replicate over N_d/p
    shard_group: int | None = None            # p; None: shard over all N_d ranks (p = N_d)
    # ZeRO++'s quantized collectives (zero/zeropp.py, spec/zeropp.md); off: stage 3 unchanged
    qwz: bool = False                         # zero_quantized_weights: int8 weight all-gathers
    qgz: bool = False                         # zero_quantized_gradients: int4 all-to-all reduce
    quant_group_size: int | None = None       # elements per scale; None: DeepSpeed's choice
    tiles: int = 1                            # ZeRO-Infinity's MLP tiles along d_ff (C-I3); 1: off

    def __post_init__(self):
        if self.stage not in STAGES:
            raise ValueError(f"stage must be one of {sorted(STAGES)}, got {self.stage!r}")
        if not isinstance(self.n_d, int) or self.n_d < 1:
            raise ValueError(f"n_d (number of ranks) must be an integer >= 1, got {self.n_d!r}")
        g = self.grad_accum_steps
        if not isinstance(g, int) or isinstance(g, bool) or g < 1:
            raise ValueError(f"grad_accum_steps must be an integer >= 1, got {g!r}")
        if self.global_batch is not None and (self.global_batch < 1
                                              or self.global_batch % (self.n_d * g)):
            times = f" × grad_accum_steps={g}" if g > 1 else ""
            raise ValueError(f"global_batch={self.global_batch} must be a positive multiple of "
                             f"n_d={self.n_d}{times} (each rank takes equal micro-batches)")
        if not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"steps must be an integer >= 1, got {self.steps!r}")
        if self.zero1_comm not in ZERO1_COMM:
            raise ValueError(f"unknown ZeRO-1 variant {self.zero1_comm!r}; accepted: "
                             f"{', '.join(ZERO1_COMM)}")
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, got {self.device!r}")
        policy(self.precision)
        combine.check(self)   # the table's refused pairs, each with its reason
        checkpointing.check(self.checkpoint_activations, self.model.n_layer)
        buffers.check(self.bucket_elements, self.stage, self.n_d)
        gpt.check_mp(self.model, self.n_m)
        check_config(self)
        check_zero_r(self)
        hpz.check(self)
        check_offload(self)
        mics.check(self)
        zeropp.check(self)
        check_tiles(self)

    @property
    def n_ranks(self) -> int:
        """N = N_d × N_m: every rank of the grid (comm/groups.py)."""
        return self.n_d * self.n_m

    @property
    def exact(self) -> bool:
        """Gradients are summed exactly in fp64 (zerospec/zero/exact.py)."""
        return self.exact_grads or self.grad_accum_steps > 1

    @property
    def policy(self) -> Precision:
        return POLICIES[self.precision]

    @property
    def compute_dtype(self) -> torch.dtype:
        """CPU kernels compute in fp32 from the stored copies; elsewhere in the storage dtype."""
        return torch.float32 if self.device == "cpu" else self.policy.dtype

    @property
    def batch(self) -> int:
        return self.global_batch if self.global_batch is not None else 2 * self.n_d * self.grad_accum_steps

    @property
    def label(self) -> str:
        return STAGES[self.stage].label

    @property
    def shard_size(self) -> int:
        """The ranks the model states are sharded over: p with MiCS, else N_d."""
        return self.n_d if self.shard_group is None else self.shard_group

    def units(self) -> tuple[Unit, ...]:
        return self.model.units(self.shard_size, pad=STAGES[self.stage].pad, n_m=self.n_m,
                                tiles=self.tiles)


def check_tiles(cfg) -> None:
    """Memory-centric tiling's setting (spec/infinity.md, C-I3): ValueError naming the value and
    what is accepted (with model parallelism, T tiles of each rank's d_ff / N_m)."""
    gpt.check_tiles(cfg.model, cfg.tiles, cfg.n_m)


def check_config(cfg) -> None:
    """TrainConfig's robustness fields: ValueError naming the value and what is accepted."""
    if cfg.loss_scale is not None and not isinstance(cfg.loss_scale, LossScale):
        raise ValueError(f"loss_scale must be a LossScale or None, got {cfg.loss_scale!r}")
    c = cfg.clip_grad_norm
    if c is not None and not (isinstance(c, (int, float)) and 0 < c < float("inf")):
        raise ValueError(f"clip_grad_norm must be a finite number > 0 or None, got {c!r}")
    if cfg.exact and cfg.precision != "fp16":
        raise ValueError(f"exact gradient sums (grad_accum_steps > 1 or exact_grads) need "
                         f"precision='fp16', got {cfg.precision!r}: only fp16 values add "
                         f"up exactly in fp64 (zerospec/zero/exact.py)")
    if cfg.exact and cfg.n_d * cfg.grad_accum_steps > MAX_TERMS:
        raise ValueError(f"n_d × grad_accum_steps = {cfg.n_d * cfg.grad_accum_steps} exceeds "
                         f"{MAX_TERMS}, the most fp16 gradients fp64 sums exactly")


def check_zero_r(cfg) -> None:
    """Model parallelism and P_a's switches: ValueError naming the values and what is needed."""
    if cfg.partition_activations and (cfg.n_m < 2 or not cfg.checkpoint_activations):
        raise ValueError(f"partition_activations (P_a) splits activation checkpoints over the "
                         f"model-parallel group: it needs n_m >= 2 and checkpoint_activations >= 1, "
                         f"got n_m={cfg.n_m}, checkpoint_activations={cfg.checkpoint_activations}")
    for name in ("stage3_persistence_threshold", "stage3_max_reuse_distance"):
        v = getattr(cfg, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {v!r}")
        if v and cfg.stage != 3:
            raise ValueError(f"{name}={v} is a ZeRO-3 setting (zerospec/zero/ds3.py): it needs "
                             f"stage 3, got stage={cfg.stage}")
    if cfg.contiguous_gradients and cfg.stage < 2:
        raise ValueError(f"contiguous_gradients (M_D for gradients) reuses the slot stages 2–3 "
                         f"reduce-scatter each unit's gradient from: it needs stage 2 or 3, got "
                         f"stage={cfg.stage} (stages 0–1 keep one persistent gradient buffer per "
                         f"unit already)")
    if cfg.contiguous_checkpoints and not cfg.checkpoint_activations:
        raise ValueError("contiguous_checkpoints (M_D) copies activation checkpoints into one "
                         "buffer: it needs checkpoint_activations >= 1, got 0 (off)")
    if cfg.cpu_checkpointing and not cfg.partition_activations:
        raise ValueError("cpu_checkpointing (P_a+cpu) moves the partitioned checkpoints to host "
                         "memory: it needs partition_activations=True")
