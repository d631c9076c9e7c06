"""One reader of DeepSpeed JSON configs (``plan --deepspeed-config``; ZeRO++ and offload read it too).

:func:`read` turns a config into a :class:`DeepSpeedConfig`: the settings zerospec models, each with
DeepSpeed 0.19.8's default where the file is silent (deepspeed/runtime/zero/config.py), the batch
keys as given (:meth:`DeepSpeedConfig.batch` resolves them for N_d GPUs by DeepSpeed's rule), and
every other key of the file in :attr:`DeepSpeedConfig.not_modelled`, each with why: nothing is
ignored silently. DeepSpeed's own reading (unknown keys refused, deprecated keys moved, ``"auto"``
dropped) is zerospec/plan/ds_owner.py's; an ``"auto"`` transformers' Trainer fills waits in
:attr:`DeepSpeedConfig.auto` until :meth:`DeepSpeedConfig.resolve` has the model and the
micro-batch. Torch-free: the command line reads a config before it imports anything heavy.
"""
from __future__ import annotations

import dataclasses
import math

from . import ds_owner
from .ds_auto import HIDDEN_AUTO, autos as _autos
from .ds_owner import OFFLOAD_DEFAULTS, OFFLOAD_DEVICES, OFFLOAD_NOT_MODELLED

# zero_optimization settings zerospec reads, with DeepSpeed 0.19.8's defaults. overlap_comm's
# default depends on the stage (True at 3, else False: DeepSpeed's overlap_comm_valid).
ZERO_DEFAULTS = {"stage": 0, "reduce_bucket_size": 500_000_000, "allgather_bucket_size": 500_000_000,
                 "use_multi_rank_bucket_allreduce": True, "contiguous_gradients": True,
                 "overlap_comm": None, "stage3_prefetch_bucket_size": 50_000_000,
                 "stage3_param_persistence_threshold": 100_000,
                 "stage3_max_live_parameters": 1_000_000_000,
                 "stage3_max_reuse_distance": 1_000_000_000}
# activation_checkpointing settings (DeepSpeed's defaults: all off)
ACTIVATION_DEFAULTS = {"partition_activations": False, "cpu_checkpointing": False,
                       "contiguous_memory_optimization": False}
# ZeRO++ and MiCS keys (spec/zeropp.md, spec/nodes.md, spec/mics.md), DeepSpeed's defaults: off.
# mics_shard_size -1 is off; DeepSpeed 0.19 removed MiCS and refuses the key, zerospec models it.
ZEROPP_DEFAULTS = {"zero_hpz_partition_size": 1, "zero_quantized_weights": False,
                   "zero_quantized_gradients": False, "mics_shard_size": -1}
BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")

# read but changing no byte the ledger counts
NO_BYTES = {"steps_per_print", "wall_clock_breakdown", "dump_state", "prescale_gradients",
            "gradient_predivide_factor", "gradient_clipping"}


@dataclasses.dataclass(frozen=True)
class Batch:
    """The batch keys resolved for a data-parallel world of N_d GPUs (DeepSpeed's rule)."""

    micro: int        # train_micro_batch_size_per_gpu
    gas: int          # gradient_accumulation_steps
    train: int        # train_batch_size = micro × gas × N_d


@dataclasses.dataclass(frozen=True)
class Offload:
    """One of zero_optimization's offload sections: ``device`` "cpu" or "nvme" (an absent section
    or device "none" is no Offload), and DeepSpeed's pinned swap buffers (used with nvme only):
    ``buffer_count`` of ``buffer_size`` elements each (None: the optimizer's, sized by DeepSpeed
    to the largest partition it swaps)."""

    section: str                  # "offload_optimizer" | "offload_param"
    device: str
    buffer_count: int
    buffer_size: int | None
    nvme_path: str | None


@dataclasses.dataclass(frozen=True)
class DeepSpeedConfig:
    path: str
    stage: int
    precision: str                      # "fp16" | "bf16" | "fp32" (neither enabled)
    reduce_bucket_size: int
    allgather_bucket_size: int
    use_multi_rank_bucket_allreduce: bool
    contiguous_gradients: bool
    overlap_comm: bool
    stage3_prefetch_bucket_size: int
    stage3_param_persistence_threshold: int
    stage3_max_live_parameters: int
    stage3_max_reuse_distance: int
    zero_hpz_partition_size: int        # ZeRO++ hpZ's h (1: off)
    zero_quantized_weights: bool        # ZeRO++ qwZ
    zero_quantized_gradients: bool      # ZeRO++ qgZ
    mics_shard_size: int                # MiCS's p (-1: off)
    partition_activations: bool
    cpu_checkpointing: bool
    contiguous_memory_optimization: bool
    offload_optimizer: Offload | None   # ZeRO-Offload (spec/offload.md)
    offload_param: Offload | None       # ZeRO-Infinity's parameter offload
    train_batch_size: int | None
    train_micro_batch_size_per_gpu: int | None
    gradient_accumulation_steps: int | None
    given: frozenset[str]               # the zero_optimization / activation keys the file sets
    not_modelled: tuple[tuple[str, str], ...]   # (dotted key, why) for every other key
    auto: frozenset[str] = frozenset()  # keys still "auto" (None above): resolve() fills them
    resolved: tuple[tuple[str, str], ...] = ()  # (dotted key, "auto → value, from where")

    def resolve(self, hidden_size: int | None = None, micro_batch: int | None = None,
                ) -> "DeepSpeedConfig":
        """The "auto" values transformers' Trainer fills (zerospec/plan/ds_auto.py)."""
        from .ds_auto import resolve
        return resolve(self, hidden_size, micro_batch)

    def batch(self, n_d: int) -> Batch:
        """DeepSpeed's batch rule for N_d GPUs: two of the three keys give the third (floor
        division, as DeepSpeed), then train_batch_size = micro × gas × N_d must hold exactly."""
        t, m, g = (self.train_batch_size, self.train_micro_batch_size_per_gpu,
                   self.gradient_accumulation_steps)
        if "train_micro_batch_size_per_gpu" in self.auto:
            raise ValueError(f"{self.path!r}: train_micro_batch_size_per_gpu is \"auto\", which "
                             f"transformers fills from per_device_train_batch_size; give "
                             f"--micro-batch N")
        if t is None and m is None:
            raise ValueError(f"{self.path!r}: neither train_batch_size nor "
                             f"train_micro_batch_size_per_gpu is set; DeepSpeed needs one")
        if m is None:
            m = t // n_d // (g or 1)
        if g is None:
            g = 1 if t is None or m == 0 else t // m // n_d
        if t is None:
            t = m * g * n_d
        if m < 1 or g < 1 or t != m * g * n_d:
            raise ValueError(f"{self.path!r}: train_batch_size {t} != train_micro_batch_size_per_gpu "
                             f"{m} × gradient_accumulation_steps {g} × N_d {n_d} (DeepSpeed's rule)")
        return Batch(m, g, t)


def _number(path: str, key: str, value, *, bool_: bool = False, positive: bool = False):
    if bool_:
        if not isinstance(value, bool):
            raise ValueError(f"{path!r}: {key} = {value!r}; accepted: true or false")
        return value
    # DeepSpeed accepts 5e8 for an integer setting
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value) and float(value) == int(value) and value >= (1 if positive else 0))
    if not ok:
        raise ValueError(f"{path!r}: {key} = {value!r}; accepted: an integer >= {int(positive)}")
    return int(value)


def _section(path: str, doc: dict, name: str) -> dict:
    sec = doc.get(name, {})
    if not isinstance(sec, dict):
        raise ValueError(f"{path!r}: {name} must be an object, got {sec!r}")
    return sec


def _precision(path: str, doc: dict, resolved: list) -> str:
    """fp16 / bf16 (or the legacy bfloat16) enabled, else fp32; ``enabled: "auto"`` as
    transformers fills it: TrainingArguments' fp16 / bf16, False unless asked (fp32)."""
    on = []
    for name, (key, sec) in ds_owner.precision_sections(path, doc).items():
        enabled = sec.get("enabled", False)
        if enabled == "auto":
            resolved.append((f"{key}.enabled", f"auto → false (transformers: TrainingArguments."
                                               f"{name} defaults to False)"))
        elif enabled is True:
            on.append(name)
        elif enabled is not False:
            raise ValueError(f"{path!r}: {key}.enabled = {enabled!r}; accepted: true or false")
    if len(on) > 1:
        raise ValueError(f"{path!r}: fp16 and bf16 are both enabled; DeepSpeed accepts one")
    return on[0] if on else "fp32"


def _offload(path: str, zero: dict, name: str, left: list) -> Offload | None:
    """zero_optimization.``name`` (an offload section) with DeepSpeed's defaults; every key that
    changes no counted byte (:data:`OFFLOAD_NOT_MODELLED`) goes to ``left``, with why."""
    sec, defaults = _section(path, zero, name), OFFLOAD_DEFAULTS[name]
    where = f"zero_optimization.{name}"
    ds_owner.unknown(path, where, sec, defaults)
    sec = {k: v for k, v in sec.items() if v != "auto"}      # DeepSpeed drops "auto"
    device = sec.get("device", "none")
    if device not in OFFLOAD_DEVICES:
        raise ValueError(f"{path!r}: {where}.device = {device!r}; accepted: "
                         f"{', '.join(OFFLOAD_DEVICES)}")
    if device == "none":
        left += [(f"{where}.{k}", "device none: nothing offloaded") for k in sec if k != "device"]
        return None
    nvme = sec.get("nvme_path")
    if device == "nvme" and not (isinstance(nvme, str) and nvme):
        raise ValueError(f"{path!r}: {where}.device = 'nvme' needs {where}.nvme_path, the "
                         f"directory of the swap files; got {nvme!r}")
    count = _number(path, f"{where}.buffer_count", sec.get("buffer_count", defaults["buffer_count"]))
    size = None
    if "buffer_size" in defaults:
        size = _number(path, f"{where}.buffer_size", sec.get("buffer_size", defaults["buffer_size"]))
    ratio = sec.get("ratio", 1.0)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio <= 1:
        raise ValueError(f"{path!r}: {where}.ratio = {ratio!r}; accepted: a number in [0, 1]")
    read = ("device", "buffer_count", "buffer_size") if device == "nvme" else ("device",)
    left += [(f"{where}.{k}", OFFLOAD_NOT_MODELLED[k]) for k in sec
             if k not in read and not (k == "ratio" and sec[k] == 1)]
    return Offload(name, device, count, size, nvme)


def parse(doc, path: str = "<config>") -> DeepSpeedConfig:
    """A DeepSpeed config (a parsed JSON object) → :class:`DeepSpeedConfig`; a value DeepSpeed
    would refuse raises ValueError naming the key, the value and what is accepted."""
    if not isinstance(doc, dict):
        raise ValueError(f"{path!r}: a DeepSpeed config is a JSON object, got a {type(doc).__name__}")
    ds_owner.check_finite(path, doc)
    zero, legacy = ds_owner.zero_section(path, doc)
    act = _section(path, doc, "activation_checkpointing")
    kw, auto, resolved = {}, set(), []
    stage = zero.get("stage", 0)
    for key, default in ZERO_DEFAULTS.items():
        value = zero.get(key, default)
        if value == "auto":           # DeepSpeedConfigModel drops it: the default, unless
            if key in HIDDEN_AUTO and (stage == 3 or key == "reduce_bucket_size"):
                auto.add(f"zero_optimization.{key}")    # transformers fills it (resolve)
                kw[key] = None
                continue
            value = default
            resolved.append((f"zero_optimization.{key}", "auto → DeepSpeed's default (its config "
                                                         "model drops \"auto\")"))
        if value is None:             # overlap_comm: DeepSpeed's stage-dependent default
            value = kw["stage"] == 3
        kw[key] = _number(path, f"zero_optimization.{key}", value,
                          bool_=default is None or isinstance(default, bool),
                          positive=key == "reduce_bucket_size")    # Field(gt=0) in 0.19.8
    for key, default in ZEROPP_DEFAULTS.items():
        value = zero.get(key, default)
        if value == "auto":           # dropped by DeepSpeed's config model: the default
            value = default
            resolved.append((f"zero_optimization.{key}", "auto → DeepSpeed's default (its config "
                                                         "model drops \"auto\")"))
        if key == "mics_shard_size" and value == -1:
            kw[key] = -1
        elif key == "mics_shard_size" and (isinstance(value, bool) or not isinstance(value, int)
                                           or value < 1):
            raise ValueError(f"{path!r}: zero_optimization.mics_shard_size = {value!r}; accepted: "
                             f"-1 (off) or an integer >= 1 (the partition group size p)")
        else:
            kw[key] = _number(path, f"zero_optimization.{key}", value,
                              bool_=isinstance(default, bool), positive=True)
    if kw["stage"] not in (0, 1, 2, 3):
        raise ValueError(f"{path!r}: zero_optimization.stage = {kw['stage']!r}; accepted: 0, 1, 2 or 3")
    for key, default in ACTIVATION_DEFAULTS.items():
        kw[key] = _number(path, f"activation_checkpointing.{key}", act.get(key, default), bool_=True)
    for key in BATCH_KEYS:
        if doc.get(key) == "auto":    # transformers: from the micro-batch and the accumulation
            if key == "train_micro_batch_size_per_gpu":
                auto.add(key)          # --micro-batch fills it (resolve)
            elif key == "gradient_accumulation_steps":
                resolved.append((key, "auto → 1 (transformers: TrainingArguments."
                                      "gradient_accumulation_steps defaults to 1)"))
            else:
                resolved.append((key, "auto → micro × gas × N_d (transformers: world_size × "
                                      "per_device_train_batch_size × gradient_accumulation_steps)"))
            kw[key] = 1 if key == "gradient_accumulation_steps" else None
            continue
        kw[key] = None if doc.get(key) is None else _number(path, key, doc[key], positive=True)
    left = list(legacy)
    offload = {k: _offload(path, zero, k, left) for k in OFFLOAD_DEFAULTS}
    for key in doc:
        if key in BATCH_KEYS or key in ("zero_optimization", "activation_checkpointing", "fp16",
                                        "bf16", "bfloat16"):
            continue
        left.append((key, "changes no byte of the step" if key in NO_BYTES else
                     "Adam's states are modelled (K = 12), its settings are not" if key == "optimizer"
                     else "DeepSpeed's async I/O tuning: how fast NVMe moves, not how many bytes"
                     if key == "aio" else "not read by zerospec"))
    for key in zero:
        if key not in ZERO_DEFAULTS and key not in ZEROPP_DEFAULTS and key not in OFFLOAD_DEFAULTS:
            left.append((f"zero_optimization.{key}", "not read by zerospec" + (
                f": {ds_owner.ZERO_WHY[key]}" if key in ds_owner.ZERO_WHY else "")))
    for sec in ("fp16", "bf16", "bfloat16"):   # loss scaling and the like: no byte of the step
        left += [(f"{sec}.{k}", "changes no byte of the step") for k in doc.get(sec, {})
                 if k != "enabled"]
    left += [(f"{k} (\"auto\")", "filled by transformers' Trainer; not modelled") for k in
             _autos(doc) if k.partition(".")[0] not in ("zero_optimization", "fp16", "bf16",
                                                        *BATCH_KEYS)]
    for key in act:
        if key not in ACTIVATION_DEFAULTS:
            left.append((f"activation_checkpointing.{key}", "not read by zerospec" + {
                "number_checkpoints": ": the model code's checkpoint count; zerospec's is "
                                      "--checkpoint-activations K",
                "synchronize_checkpoint_boundary": ": a device synchronisation, no byte",
                "profile": ": timing, no byte"}.get(key, "")))
    given = frozenset([k for k in zero if k in ZERO_DEFAULTS or k in ZEROPP_DEFAULTS
                       or k in OFFLOAD_DEFAULTS] + [k for k in act if k in ACTIVATION_DEFAULTS])
    return DeepSpeedConfig(path=path, precision=_precision(path, doc, resolved), given=given,
                           not_modelled=tuple(left), auto=frozenset(auto),
                           resolved=tuple(resolved), **offload, **kw)



def read(path: str) -> DeepSpeedConfig:
    """Read and :func:`parse` the DeepSpeed JSON config at ``path``."""
    try:
        doc = ds_owner.load(path)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read DeepSpeed config {path!r} ({exc}); accepted: a JSON file "
                         f"such as deepspeed.initialize(config=...) takes") from None
    return parse(doc, path)
