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
from ..optim.precision import POLICIES, Precision
from ..zero import STAGES
from ..zero import fsdp2, fsdp2_offload, hpz, mics, zeropp
from ..zero.exact import MAX_TERMS
from ..zero_r import buffers, checkpointing
from ..offload import check as check_offload
from . import combine
from .sections import (SECTION_OF, SECTIONS, ac_mode, BatchOptions, MeshOptions, OffloadOptions,
                       OptimOptions, QuantOptions, VariantOptions, ZeroROptions)

DEVICES = ("cpu", "meta")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    stage: int = 0
    n_d: int = 4                       # data-parallel degree N_d (ZeRO shards over these ranks)
    model: gpt.GPTConfig = gpt.SMALL
    steps: int = 5
    seed: int = 0
    count_flops: bool = False
    device: str = "cpu"
    timeout: float = 120.0
    # the sections, each with its feature's options (zerospec/training/sections.py); defaults:
    # the plain step of the paper's P_os / P_os+g / P_os+g+p on one node
    optim: OptimOptions = OptimOptions()        # precision, Adam, loss scaling, clipping
    batching: BatchOptions = BatchOptions()     # global batch, accumulation, exact sums
    variants: VariantOptions = VariantOptions()  # stage 1's collective, DeepSpeed's ZeRO-3 knobs
    zero_r: ZeroROptions = ZeroROptions()       # ZeRO-R: checkpointing, P_a, C_B, M_D
    mesh: MeshOptions = MeshOptions()           # N_m, nodes, hpZ, MiCS's shard group
    quant: QuantOptions = QuantOptions()        # ZeRO++'s qwZ, qgZ
    offload: OffloadOptions = OffloadOptions()  # ZeRO-Offload, ZeRO-Infinity, DPU, tiles

    def __getattr__(self, name: str):
        """A section's option by its own name (``cfg.hpz`` is ``cfg.mesh.hpz``): names are unique
        across sections."""
        section = SECTION_OF.get(name)
        if section is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(object.__getattribute__(self, section), name)

    @classmethod
    def of(cls, **options) -> "TrainConfig":
        """A TrainConfig from top-level fields and section options by their names, each put in
        its section (``TrainConfig.of(stage=3, hpz=2)``): for readers of foreign configurations
        whose keys map to options one by one (zerospec/plan/deepspeed.py)."""
        top = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(k for k in options if k not in top and k not in SECTION_OF)
        if unknown:
            raise ValueError(f"unknown TrainConfig option(s) {', '.join(unknown)}; accepted: "
                             f"{', '.join(sorted(top | set(SECTION_OF)))}")
        kw = {k: v for k, v in options.items() if k in top}
        for name, section in SECTIONS.items():
            mine = {k: v for k, v in options.items() if SECTION_OF.get(k) == name}
            if mine:
                kw[name] = dataclasses.replace(kw.get(name, section()), **mine)
        return cls(**kw)

    def replace(self, **options) -> "TrainConfig":
        """This config with some top-level fields or section options changed, by their names."""
        kw = {k: v for k, v in options.items() if k not in SECTION_OF}
        for name in SECTIONS:
            mine = {k: v for k, v in options.items() if SECTION_OF.get(k) == name}
            if mine:
                kw[name] = dataclasses.replace(getattr(self, name), **mine)
        return dataclasses.replace(self, **kw)

    def __post_init__(self):
        if self.stage not in STAGES:
            raise ValueError(f"stage must be one of {sorted(STAGES)}, got {self.stage!r}")
        if not isinstance(self.n_d, int) or self.n_d < 1:
            raise ValueError(f"n_d (number of ranks) must be an integer >= 1, got {self.n_d!r}")
        g = self.grad_accum_steps             # an integer >= 1 (its section checked)
        if self.global_batch is not None and (self.global_batch < 1
                                              or self.global_batch % (self.n_d * g)):
            times = f" × grad_accum_steps={g}" if g > 1 else ""
            raise ValueError(f"global_batch={self.global_batch} must be a positive multiple of "
                             f"n_d={self.n_d}{times} (each rank takes equal micro-batches)")
        if not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"steps must be an integer >= 1, got {self.steps!r}")
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, got {self.device!r}")
        combine.check(self)   # the table's refused pairs, each with its reason
        checkpointing.check(self.checkpoint_activations, self.model.n_layer)
        buffers.check(self.bucket_elements, self.stage, self.n_d)
        gpt.check_mp(self.model, self.n_m)
        check_config(self)
        check_zero_r(self)
        hpz.check(self)
        check_offload(self)
        fsdp2_offload.check(self)   # offload under the FSDP2 flavour: CPUOffloadPolicy
        mics.check(self)
        zeropp.check(self)
        fsdp2.check(self)      # qwZ/qgZ's groups under the FSDP2 flavour
        check_tiles(self)

    @property
    def n_ranks(self) -> int:
        """N = N_d × N_m: every rank of the grid (comm/groups.py)."""
        return self.n_d * self.n_m

    @property
    def exact(self) -> bool:
        """Gradients are summed exactly in fp64 (zerospec/zero/exact.py): asked for, or to
        accumulate micro-batches on the paper's stages (the FSDP2 flavour adds its fp32
        reduce-scatter outputs instead, zero/fsdp2.py)."""
        return self.exact_grads or (self.grad_accum_steps > 1 and self.flavour != "fsdp2")

    @property
    def accumulates(self) -> bool:
        """Micro-batch gradients are summed over a step, or exact sums asked for with G = 1."""
        return self.exact_grads or self.grad_accum_steps > 1

    @property
    def segment_blocks(self) -> int:
        """Blocks per checkpointed segment (zerospec/zero_r/checkpointing.py): Megatron's
        ``checkpoint_activations``, or 1 for torchtitan's ``full`` (a checkpoint per block); 0:
        none (torchtitan's selective modes checkpoint single blocks on their own rule)."""
        return self.checkpoint_activations or int(self.activation_checkpointing == "full")

    @property
    def selective_ac(self) -> bool:
        """torchtitan's selective activation checkpointing is on (zerospec/zero_r/selective.py)."""
        return ac_mode(self.activation_checkpointing)[0].startswith("selective")

    @property
    def policy(self) -> Precision:
        return POLICIES[self.precision]

    @property
    def compute_dtype(self) -> torch.dtype:
        """CPU kernels compute in fp32 from the stored copies; elsewhere in the storage dtype. The
        FSDP2 flavour computes in its param_dtype everywhere, as FSDP2 does on a CPU too."""
        if self.device == "cpu" and self.flavour != "fsdp2":
            return torch.float32
        return self.policy.dtype

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
    if cfg.exact_grads and cfg.flavour == "fsdp2":
        raise ValueError("exact_grads=True sums gradients exactly in fp64 (zerospec/zero/exact.py); "
                         "flavour='fsdp2' reduce-scatters them in fp32 as FSDP2 does: it takes "
                         "exact_grads=False")
    if cfg.exact and cfg.precision != "fp16":
        raise ValueError(f"exact gradient sums (grad_accum_steps > 1 or exact_grads) need "
                         f"precision='fp16', got {cfg.precision!r}: only fp16 values add "
                         f"up exactly in fp64 (zerospec/zero/exact.py)")
    if cfg.exact and cfg.n_d * cfg.grad_accum_steps > MAX_TERMS:
        raise ValueError(f"n_d × grad_accum_steps = {cfg.n_d * cfg.grad_accum_steps} exceeds "
                         f"{MAX_TERMS}, the most fp16 gradients fp64 sums exactly")


def check_zero_r(cfg) -> None:
    """Model parallelism and P_a's switches: ValueError naming the values and what is needed."""
    kind, k = ac_mode(cfg.activation_checkpointing)
    if kind != "none" and cfg.checkpoint_activations and (kind, cfg.checkpoint_activations) != \
            ("full", 1):
        raise ValueError(f"activation_checkpointing={cfg.activation_checkpointing!r} "
                         f"(torchtitan's) and checkpoint_activations="
                         f"{cfg.checkpoint_activations} (Megatron's segments of K blocks) are two "
                         f"rules for which blocks keep what: give one ('full' is "
                         f"checkpoint_activations=1)")
    if kind == "selective-layer" and k > cfg.model.n_layer:
        raise ValueError(f"activation_checkpointing={cfg.activation_checkpointing!r} checkpoints "
                         f"blocks K, 2K, …: K must be at most n_layer={cfg.model.n_layer}")
    checkpoints = cfg.segment_blocks or kind != "none"   # Megatron's segments or torchtitan's
    for name in ("partition_activations", "cpu_checkpointing"):
        if getattr(cfg, name) and not checkpoints:
            what = {"partition_activations": "P_a splits activation checkpoints over the "
                    "model-parallel group", "cpu_checkpointing": "P_a+cpu keeps activation "
                    "checkpoints on the host"}[name]
            raise ValueError(f"{name}=True: {what}; it needs "
                             f"checkpoint_activations >= 1 or an activation_checkpointing mode, "
                             f"got checkpoint_activations={cfg.checkpoint_activations}, "
                             f"activation_checkpointing={cfg.activation_checkpointing!r}")
    for name in ("stage3_persistence_threshold", "stage3_max_reuse_distance"):
        v = getattr(cfg, name)                # an integer >= 0 (its section checked)
        if v and cfg.stage != 3:
            raise ValueError(f"{name}={v} is a ZeRO-3 setting (zerospec/zero/stage3_deepspeed.py): "
                             f"it needs stage 3, got stage={cfg.stage}")
    if cfg.flavour != "paper" and cfg.stage != 3:
        raise ValueError(f"flavour={cfg.flavour!r} is a way of running stage 3 (FSDP2's "
                         f"fully_shard, zerospec/zero/fsdp2.py): it needs stage 3, got "
                         f"stage={cfg.stage}")
    if cfg.contiguous_gradients and cfg.stage < 2:
        raise ValueError(f"contiguous_gradients (M_D for gradients) reuses the slot stages 2–3 "
                         f"reduce-scatter each unit's gradient from: it needs stage 2 or 3, got "
                         f"stage={cfg.stage} (stages 0–1 keep one persistent gradient buffer per "
                         f"unit already)")
    if cfg.contiguous_checkpoints and not checkpoints:
        raise ValueError("contiguous_checkpoints (M_D) copies activation checkpoints into one "
                         "buffer: it needs checkpoint_activations >= 1 or an "
                         "activation_checkpointing mode, got neither")
