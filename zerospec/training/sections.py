"""The sections of a TrainConfig, one per feature, each option declared once: its default, its
command-line flag, its help and the values it accepts (a dataclass field's metadata).

A section checks its own values when it is made (:func:`check_options`: a switch is a bool, a
choice is among its choices; ValueError naming the field, the value and what is accepted); what
depends on other sections is checked in one place, ``TrainConfig.__post_init__``, by the features'
own checks. The command line derives every flag from these fields (zerospec/cli/options.py), so
``--hpz`` has one definition and one default in ``train``, ``scale`` and ``plan``.

The sections sit here, not in their feature packages, because the command line builds its flags
without importing torch (tests/unit/cli/test_plan.py) and those packages import torch when loaded.
A field's name is unique across sections: ``TrainConfig`` reads ``cfg.hpz`` as ``cfg.mesh.hpz``.
"""
from __future__ import annotations

import dataclasses

from ..optim.precision import POLICIES, policy
from ..paper.theory import ZERO1_COMM

# how the command line reads a flag's text (converters in zerospec/cli/argtypes.py); a section
# sees only converted values
PARSERS = ("int", "positive_int", "positive_float", "bucket_size", "ac_mode")
TIERS = ("cpu", "nvme")                  # where ZeRO-Offload / ZeRO-Infinity put states
MODES = ("paper", "deepspeed")           # which gradients go down to the host
PARTITIONS = ("bandwidth", "owner")      # where offloaded parameters live (C-I8 or its baseline)
FLAVOURS = ("paper", "fsdp2")            # how stage 3 keeps its states (zerospec/zero/fsdp2.py)
AC_MODES = ("none", "full", "selective-op", "selective-layer:K")   # torchtitan's, by these names


def ac_mode(mode) -> tuple[str, int]:
    """``--activation-checkpointing``'s value as (kind, k): ("none", 0), ("full", 1),
    ("selective-op", 0) or ("selective-layer", k) for ``selective-layer:K``, K >= 1 (torchtitan's
    ``mode`` and ``selective_ac_option``: zerospec/zero_r/selective.py). ValueError naming the
    value and the accepted ones."""
    if mode in ("none", "full", "selective-op"):
        return mode, int(mode == "full")
    kind, _, k = str(mode).partition(":")
    if kind == "selective-layer" and k.isdigit() and int(k) >= 1:
        return kind, int(k)
    raise ValueError(f"activation_checkpointing must be one of {', '.join(AC_MODES)} (K an "
                     f"integer >= 1), got {mode!r}")


def option(default, flag: str | None = None, help: str = "", *, choices: tuple | None = None,
           parse: str | None = None, metavar: str | None = None, build=None,
           low: int | None = None):
    """A section field: ``default``; ``flag`` and ``help`` for the command line; ``choices``: the
    accepted values (and None where None is the default); ``parse``: a name in PARSERS for the
    flag's text (a bool field is a switch); ``build``: the field's value from the parsed one;
    ``low``: an integer field's least value."""
    assert parse is None or parse in PARSERS, parse
    meta = dict(flag=flag, help=help, choices=choices, parse=parse, metavar=metavar, build=build,
                low=low)
    return dataclasses.field(default=default, metadata=meta)


def check_options(section) -> None:
    """A section's switches are bools, its choices among theirs and its counts integers of at
    least their least value: ValueError naming the field, the value and what is accepted."""
    for f in dataclasses.fields(section):
        v, choices = getattr(section, f.name), f.metadata.get("choices")
        if isinstance(f.default, bool) and not isinstance(v, bool):
            raise ValueError(f"{f.name} must be True or False, got {v!r}")
        low = f.metadata.get("low")
        if low is not None and (not isinstance(v, int) or isinstance(v, bool) or v < low):
            raise ValueError(f"{f.name} must be an integer >= {low}, got {v!r}")
        if choices is not None and v not in choices and not (v is None and f.default is None):
            none = " or None" if f.default is None else ""
            raise ValueError(f"{f.name} must be one of {', '.join(map(str, choices))}{none}, "
                             f"got {v!r}")


class Section:
    """Checks itself when made (see the module)."""

    def __post_init__(self):
        check_options(self)


def _loss_scale(init: float):
    from ..optim.loss_scale import LossScale
    return LossScale(init_scale=init)


def _adam():
    from ..optim.adam import AdamConfig
    return AdamConfig()


@dataclasses.dataclass(frozen=True)
class OptimOptions(Section):
    """Precision and the optimizer's real conditions (spec/loss_scaling.md, clipping.md)."""
    precision: str = option("fp16", "--precision", "default fp16", choices=tuple(POLICIES))
    adam: object = dataclasses.field(default_factory=_adam)        # optim/adam.py's AdamConfig
    loss_scale: object = option(        # optim/loss_scale.py's LossScale, or None: off
        None, "--loss-scale", "dynamic fp16 loss scaling from this initial scale, e.g. 65536 "
        "(GradScaler's rules; default off)", parse="positive_float", metavar="INIT",
        build=_loss_scale)
    clip_grad_norm: float | None = option(
        None, "--clip-grad-norm", "clip the global gradient norm to MAX (default off)",
        parse="positive_float", metavar="MAX")

    def __post_init__(self):
        policy(self.precision)                  # names the policies
        super().__post_init__()


@dataclasses.dataclass(frozen=True)
class BatchOptions(Section):
    """The global batch, its micro-batches and exact sums (zerospec/zero/exact.py)."""
    global_batch: int | None = None    # default: 2 sequences per rank per micro-step
    grad_accum_steps: int = option(1, "--grad-accum", "micro-batches per optimizer step, summed "
                                   "exactly in fp64 (the FSDP2 flavour: added in fp32, as FSDP2 "
                                   "does; default 1)", parse="positive_int", metavar="G",
                                   low=1)
    exact_grads: bool = False          # exact fp64 gradient sums also when G = 1


@dataclasses.dataclass(frozen=True)
class VariantOptions(Section):
    """Which variant of a stage runs: stage 1's gradient collective, DeepSpeed's ZeRO-3 settings
    (zerospec/zero/stage3_deepspeed.py; 0, 0: the paper's P_os+g+p), stage 3's flavour."""
    zero1_comm: str = option("reduce_scatter", "--zero1-comm",
                             "stage 1 gradient sync (default reduce_scatter)", choices=ZERO1_COMM)
    stage3_persistence_threshold: int = option(
        0, "--stage3-persistence-threshold", "DeepSpeed's stage3_param_persistence_threshold: "
        "units of at most E elements stay whole (stage 3; default 0, the paper's)", parse="int",
        metavar="E", low=0)
    stage3_max_reuse_distance: int = option(
        0, "--stage3-max-reuse-distance", "DeepSpeed's stage3_max_reuse_distance: keep a unit "
        "gathered from forward to backward when reused within E elements (default 0)",
        parse="int", metavar="E", low=0)
    flavour: str = option(
        "paper", "--flavour", "stage 3 as the paper counts it (paper: fp16 shards, fp32 master) "
        "or as FSDP2 and torchtitan run it (fsdp2: fp32 sharded parameters Adam updates, "
        "all-gathered in --precision's dtype, gradients reduce-scattered in fp32; root and last "
        "block kept gathered; spec/fsdp2.md); default paper", choices=FLAVOURS)

    def __post_init__(self):
        if self.zero1_comm not in ZERO1_COMM:
            raise ValueError(f"unknown ZeRO-1 variant {self.zero1_comm!r}; accepted: "
                             f"{', '.join(ZERO1_COMM)}")
        super().__post_init__()


@dataclasses.dataclass(frozen=True)
class ZeroROptions(Section):
    """ZeRO-R (zerospec/zero_r/, spec/activations.md, buffers.md, allocator.md)."""
    checkpoint_activations: int = option(
        0, "--checkpoint-activations", "activation checkpointing: keep the input of every K-th "
        "transformer block, recompute the rest in backward (1: one checkpoint per block; "
        "default 0: off)", parse="int", metavar="K")
    activation_checkpointing: str = option(
        "none", "--activation-checkpointing", "torchtitan's activation checkpointing "
        "(spec/activations.md): full (every block's input kept, the block recomputed), "
        "selective-layer:K (every K-th block so, the others keep everything), selective-op "
        "(every block keeps the outputs of its odd-numbered matmuls and attention, recomputes "
        "the rest); default none. --checkpoint-activations K is Megatron's segments of K "
        "blocks; give one of the two", parse="ac_mode", metavar="MODE")
    partition_activations: bool = option(
        False, "--partition-activations", "P_a: keep 1/N_m of each checkpoint per MP rank, "
        "all-gathered before the recompute; at --mp 1 the partition is over a group of one, the "
        "whole checkpoint (DeepSpeed's partition_activations; needs --checkpoint-activations or "
        "--activation-checkpointing)")
    cpu_checkpointing: bool = option(
        False, "--cpu-checkpointing", "P_a+cpu: keep the checkpoints in host memory, none on the "
        "device; with --partition-activations each MP rank's 1/N_m, without it the whole "
        "checkpoint (DeepSpeed's cpu_checkpointing runs either way; at --mp 1 the two are one "
        "run)")
    contiguous_checkpoints: bool = option(
        False, "--contiguous-checkpoints", "M_D: copy the checkpoints into one buffer per step "
        "(spec/allocator.md)")
    contiguous_gradients: bool = option(
        False, "--contiguous-gradients", "M_D for gradients: stages 2–3 write every unit's "
        "gradient into one slot allocated once")
    bucket_elements: int | str | None = option(    # None: per unit; "model": C29's naive buffer
        None, "--bucket-size", "reduce gradients (and stage 1/2's parameter gathers) through "
        "buckets of at most B elements (C_B, spec/buffers.md); 'model': one fp32 buffer of the "
        "whole model (C29's naive buffer); default: one collective per unit",
        parse="bucket_size", metavar="B|model")

    def __post_init__(self):
        ac_mode(self.activation_checkpointing)     # names the accepted modes
        super().__post_init__()


@dataclasses.dataclass(frozen=True)
class MeshOptions(Section):
    """The rank grid: model parallelism, nodes, hpZ's secondary partitions, MiCS's shard groups
    (comm/groups.py, spec/model_parallel.md, nodes.md, mics.md)."""
    n_m: int = option(1, "--mp", "model-parallel degree N_m: Megatron-LM slicing inside groups of "
                      "N_M neighbouring ranks, ZeRO over the other N/N_M (spec/model_parallel.md; "
                      "default 1)", parse="positive_int", metavar="N_M")
    gpus_per_node: int | None = option(
        None, "--gpus-per-node", "ranks sit on nodes of G GPUs (rank r on node r // G); default: "
        "one node", parse="positive_int", metavar="G")
    hpz: int = option(1, "--hpz", "zero_hpz_partition_size: stage 3's backward all-gather inside "
                      "H ranks of a node (H must divide G); default 1, off",
                      parse="positive_int", metavar="H")
    shard_group: int | None = option(
        None, "--shard-group", "MiCS / FSDP2's HSDP (spec/mics.md): shard stages 1-3 over groups "
        "of P consecutive ranks (P must divide the ranks), replicate across groups; default: "
        "shard over every rank", parse="positive_int", metavar="P")


@dataclasses.dataclass(frozen=True)
class QuantOptions(Section):
    """ZeRO++'s quantized collectives (zerospec/zero/zeropp.py, spec/zeropp.md); off: stage 3."""
    qwz: bool = option(False, "--qwz", "zero_quantized_weights: stage 3's weight all-gathers as "
                       "int8 (spec/zeropp.md; approximate; with --flavour fsdp2 FSDP2's custom "
                       "all-gather, spec/fsdp2.md)")
    qgz: bool = option(False, "--qgz", "zero_quantized_gradients: stage 3's gradient "
                       "reduce-scatter as an int4 all-to-all, inside the node then across "
                       "(approximate; with --flavour fsdp2 FSDP2's custom reduce-scatter)")
    quant_group_size: int | None = option(
        None, "--quant-group-size", "elements per quantization scale; default DeepSpeed's (up "
        "to 8000)", parse="positive_int", metavar="G_Q")


@dataclasses.dataclass(frozen=True)
class OffloadOptions(Section):
    """ZeRO-Offload and ZeRO-Infinity (zerospec/offload/, spec/offload.md, infinity.md); None:
    everything on the device."""
    offload_optimizer: str | None = option(
        None, "--offload-optimizer", "fp32 master, momentum, variance and Adam on the host (nvme: "
        "the states in swap files between steps); needs --stage 2 or 3; with --flavour fsdp2, "
        "cpu is FSDP2's CPUOffloadPolicy (fp32 shards, their gradients and AdamW on the host, "
        "copied up before each all-gather; spec/fsdp2.md); default off",
        choices=TIERS)
    offload_mode: str = option(
        "paper", "--offload-mode", "paper: fp16 gradients down (4 bytes per parameter per step "
        "over PCIe); deepspeed: fp32 gradients down (6); default paper", choices=MODES)
    offload_params: str | None = option(
        None, "--offload-params", "ZeRO-Infinity's parameter offload: stage 3's fp16 chunks on "
        "the host (cpu) or in NVMe swap files (nvme), fetched NVMe -> host -> device for each "
        "use; needs --stage 3 and --offload-optimizer (with --flavour fsdp2, cpu is the same "
        "run as --offload-optimizer cpu alone: CPUOffloadPolicy keeps the shards on the host)",
        choices=TIERS)
    offload_partition: str = option(
        "bandwidth", "--offload-partition", "where offloaded parameters live: bandwidth (C-I8: "
        "every rank 1/N, each PCIe link 1/N per fetch, then an all-gather) or owner (the "
        "baseline: one rank holds each unit, its link carries all, then a broadcast); default "
        "bandwidth", choices=PARTITIONS)
    offload_buffer_elements: int | None = option(
        None, "--offload-buffer-elements", "with --offload-params nvme: read parameters through "
        "one host buffer of N elements (at least the largest unit a rank reads); default a "
        "buffer per fetch", parse="int", metavar="N")
    offload_prefetch: bool = option(
        False, "--offload-prefetch", "C-I8's prefetcher for offloaded parameters (bandwidth "
        "partition): before operator i, read i+3 from NVMe, copy i+2 up, all-gather i+1; with "
        "--flavour fsdp2, FSDP2's explicit forward prefetch: each block's all-gather, its copy "
        "up inside, issued one block ahead (spec/fsdp2.md)")
    nvme_path: str | None = option(
        None, "--nvme-path", "an existing directory for the NVMe tier's swap files (default: a "
        "temporary one)", metavar="DIR")
    tiles: int = option(
        1, "--tiles", "memory-centric tiling (C-I3): each block's MLP weights as T units along "
        "d_ff, each gathered just before its slice of the MLP and freed after (T must divide "
        "d_ff; not with --mp or --checkpoint-activations); default 1: off",
        parse="int", metavar="T")
    dpu: int = option(0, "--dpu", "one-step delayed parameter update from step N (approximate, "
                      "B8); default 0: off", parse="int", metavar="N")


# TrainConfig's sections: (field name, type), in the order the flags of `zerospec train` list them
SECTIONS = {"optim": OptimOptions, "batching": BatchOptions, "variants": VariantOptions,
            "zero_r": ZeroROptions, "mesh": MeshOptions, "quant": QuantOptions,
            "offload": OffloadOptions}
# each section field's section: names are unique across sections (tests/unit/training)
SECTION_OF = {f.name: name for name, t in SECTIONS.items() for f in dataclasses.fields(t)}
