"""DeepSpeed 0.19.8's own reading of a config, before zerospec maps it (zerospec/plan/ds_config.py):

* the JSON as ``DeepSpeedConfig`` loads it: duplicate keys refused
  (deepspeed/runtime/config_utils.py: ``dict_raise_error_on_duplicate_keys``); a NaN or an
  infinity (``1e400``) refused here by its dotted key, where DeepSpeed would fail later without one;
* ``zero_optimization``, its offload sections and ``fp16`` / ``bf16`` are ``DeepSpeedConfigModel``s
  (runtime/zero/config.py, zero/offload_config.py, runtime/precision_config.py): pydantic models with
  ``extra="forbid"`` and ``populate_by_name`` (a field by its name or its ``stage3_`` alias), so an
  unknown key is refused: here with the nearest known one;
* ``"auto"``: ``DeepSpeedConfigModel.__init__`` drops every ``"auto"`` value (the default stands);
  transformers' Trainer fills them first (zerospec/plan/ds_auto.py);
* deprecated fields with ``new_param`` (``_process_deprecated_field``): ``cpu_offload`` →
  ``offload_optimizer`` {device: cpu}, ``cpu_offload_param`` → ``offload_param`` {device: cpu},
  refused beside the field they replace; ``zero_optimization: true`` is stage 1
  (``read_zero_config_deprecated``); a missing ``bf16`` section reads the legacy ``bfloat16``
  (precision_config.py: ``get_bfloat16_config``).
"""
from __future__ import annotations

import difflib
import json
import math

# DeepSpeedZeroConfig's fields (0.19.8), by the name a file may use: field name → its alias
ZERO_ALIASES = {"prefetch_bucket_size": "stage3_prefetch_bucket_size",
                "param_persistence_threshold": "stage3_param_persistence_threshold",
                "model_persistence_threshold": "stage3_model_persistence_threshold",
                "max_live_parameters": "stage3_max_live_parameters",
                "max_reuse_distance": "stage3_max_reuse_distance",
                "gather_16bit_weights_on_model_save": "stage3_gather_16bit_weights_on_model_save",
                "module_granularity_threshold": "stage3_module_granularity_threshold",
                "use_all_reduce_for_fetch_params": "stage3_use_all_reduce_for_fetch_params",
                "allgather_sequential": "stage3_allgather_sequential"}
ZERO_FIELDS = frozenset({
    "stage", "contiguous_gradients", "reduce_scatter", "reduce_bucket_size",
    "use_multi_rank_bucket_allreduce", "allgather_partitions", "allgather_bucket_size",
    "overlap_comm", "compute_grad_norm", "load_from_fp32_weights", "elastic_checkpoint",
    "offload_param", "offload_optimizer", "zenflow", "sub_group_size", "cpu_offload_param",
    "cpu_offload_use_pin_memory", "cpu_offload", "stage3_gather_fp16_weights_on_model_save",
    "ignore_unused_parameters", "legacy_stage1", "round_robin_gradients", "parameter_alignment",
    "zero_hpz_partition_size", "zero_quantized_weights", "zero_quantized_nontrainable_weights",
    "zero_quantized_gradients", "memory_efficient_linear", "pipeline_loading_checkpoint",
    "override_module_apply", "log_trace_cache_warnings", "enable_sanity_checks",
    "save_muon_momentum_buffer_in_memory", "leaf_module", *ZERO_ALIASES.values(),
    "mics_shard_size"})   # mics_shard_size: not DeepSpeed 0.19.8's (MiCS removed); zerospec's
FP16_FIELDS = frozenset({"enabled", "auto_cast", "loss_scale", "initial_scale_power",
                         "loss_scale_window", "hysteresis", "consecutive_hysteresis",
                         "min_loss_scale", "fp16_master_weights_and_grads"})
BF16_FIELDS = frozenset({"enabled", "immediate_grad_update", "check_grad_overflow",
                         "bf16_master_weights_and_grads", "bf16_optimizer_states"})
# ZeRO-Offload's and ZeRO-Infinity's sections (deepspeed/runtime/zero/offload_config.py, 0.19.8):
# each key with its default; the keys marked in OFFLOAD_READ change what is measured (spec/offload.md)
OFFLOAD_DEFAULTS = {
    "offload_optimizer": {"device": "none", "nvme_path": None, "buffer_count": 4, "pin_memory": True,
                          "pipeline_read": False, "pipeline_write": False, "fast_init": False,
                          "ratio": 1.0, "super_offload": False, "cpuadam_cores_perc": 0.8},
    "offload_param": {"device": "none", "nvme_path": None, "buffer_count": 5,
                      "buffer_size": 100_000_000, "max_in_cpu": 1_000_000_000, "pin_memory": True}}
OFFLOAD_DEVICES = ("none", "cpu", "nvme")
# why each offload key that changes no byte zerospec counts is not modelled
OFFLOAD_NOT_MODELLED = {
    "nvme_path": "where the swap files go on the machine that runs it: no byte changes",
    "pin_memory": "page-locked or pageable host memory: the same bytes, a different speed",
    "pipeline_read": "overlaps NVMe reads with the host Adam: when, not how much",
    "pipeline_write": "overlaps NVMe writes with the host Adam: when, not how much",
    "fast_init": "how the NVMe files are first written: no byte of the step",
    "ratio": "ZeRO-3's partial offload (the rest of the states and Adam on the GPU): measured as 1, "
             "everything on the host",
    "super_offload": "a Superchip's CPU offload: measured as the plain host path",
    "cpuadam_cores_perc": "CPU cores for the host Adam: speed only",
    "max_in_cpu": "parameters kept in host memory before NVMe: measured as all on NVMe",
    "buffer_count": "DeepSpeed's pinned swap buffers exist only with device nvme",
    "buffer_size": "DeepSpeed's pinned swap buffers exist only with device nvme"}


# deprecated zero fields: the field each sets (None: set_new_param False, only a warning)
DEPRECATED = {"cpu_offload": "offload_optimizer", "cpu_offload_param": "offload_param",
              "cpu_offload_use_pin_memory": None,
              "stage3_gather_fp16_weights_on_model_save": "stage3_gather_16bit_weights_on_model_save"}


# why each DeepSpeedZeroConfig key zerospec does not map changes nothing it counts
_WHEN = "how parameters are fetched: when, not how much"
_NO_STEP = "checkpoints and saving: no byte of the training step"
ZERO_WHY = {
    "sub_group_size": "DeepSpeed steps the optimizer in sub-groups of this many elements; "
                      "zerospec steps each partition whole",
    "reduce_scatter": "reduce-scatter or all-reduce at stages 1–2: the stage's own collective is "
                      "measured",
    "allgather_partitions": "all-gather or broadcasts of the updated partitions: the same bytes",
    "load_from_fp32_weights": _NO_STEP, "elastic_checkpoint": _NO_STEP,
    "pipeline_loading_checkpoint": _NO_STEP, "stage3_gather_16bit_weights_on_model_save": _NO_STEP,
    "ignore_unused_parameters": "a check: no byte", "compute_grad_norm": "a diagnostic: no byte",
    "log_trace_cache_warnings": "a diagnostic: no byte", "enable_sanity_checks": "a check: no byte",
    "round_robin_gradients": "how offloaded gradients are copied: when, not how much",
    "memory_efficient_linear": "how DeepSpeed hooks the model's linears: the same tensors",
    "override_module_apply": "how DeepSpeed hooks nn.Module.apply: the same tensors",
    "stage3_model_persistence_threshold": "a cap on the parameters kept whole: not applied "
                                          "(persistence is measured per unit)",
    "stage3_module_granularity_threshold": _WHEN, "stage3_use_all_reduce_for_fetch_params": _WHEN,
    "stage3_allgather_sequential": _WHEN,
    "zero_quantized_nontrainable_weights": "quantizes frozen weights: every weight trains here",
}


def _no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    dup = sorted({k for k in keys if keys.count(k) > 1})
    if dup:
        raise ValueError(f"duplicate keys {dup} (DeepSpeed refuses a config with duplicate keys)")
    return dict(pairs)


def load(path: str):
    """The JSON at ``path``, as DeepSpeed loads it (duplicate keys refused)."""
    with open(path) as f:
        return json.load(f, object_pairs_hook=_no_duplicates)


def check_finite(path: str, doc, where: str = "") -> None:
    """ValueError naming the first NaN or infinite number (``1e400`` reads as inf) by its key."""
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for k, v in items:
        key = f"{where}.{k}" if where else str(k)
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"{path!r}: {key} = {v!r}; accepted: a finite number")
        check_finite(path, v, key)


def unknown(path: str, section: str, sec: dict, known) -> None:
    """ValueError for the first key of ``sec`` not in ``known`` (pydantic's extra="forbid"),
    naming the nearest known key."""
    for key in sec:
        if key not in known:
            near = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.55)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise ValueError(f"{path!r}: {section}.{key} is not a DeepSpeed 0.19.8 setting "
                             f"(its config model forbids unknown keys){hint}")


def zero_section(path: str, doc: dict) -> tuple[dict, list]:
    """zero_optimization as DeepSpeedZeroConfig reads it: a bool is the deprecated stage 0/1;
    field names become their aliases; deprecated fields move to the ones they name. Returns the
    section and the (dotted key, why) of each key read only to be rewritten."""
    zero = doc.get("zero_optimization", {})
    notes = []
    if isinstance(zero, bool):          # read_zero_config_deprecated
        zero = {"stage": int(zero)}
        notes.append(("zero_optimization", f"{doc['zero_optimization']}: DeepSpeed's deprecated "
                      f"form, read as stage {zero['stage']}"))
    if not isinstance(zero, dict):
        raise ValueError(f"{path!r}: zero_optimization must be an object, got {zero!r}")
    unknown(path, "zero_optimization", zero, ZERO_FIELDS | set(ZERO_ALIASES))
    out = {}
    for key, value in zero.items():
        alias = ZERO_ALIASES.get(key, key)
        if alias in out:
            raise ValueError(f"{path!r}: zero_optimization sets {key} and {alias}, one field")
        out[alias] = value
    for old, new in DEPRECATED.items():
        if old not in out:
            continue
        value = out.pop(old)
        if new is None:
            notes.append((f"zero_optimization.{old}", "deprecated, only a warning in DeepSpeed; "
                          "page-locked or pageable host memory: the same bytes"))
            continue
        if new in out:
            raise ValueError(f"{path!r}: zero_optimization.{old} and {new} together; DeepSpeed "
                             f"refuses a deprecated key beside the one replacing it")
        if old.startswith("cpu_offload"):
            if value not in (True, False, None, "auto"):
                raise ValueError(f"{path!r}: zero_optimization.{old} = {value!r}; accepted: true "
                                 f"or false")
            if value is True:
                out[new] = {"device": "cpu"}
            notes.append((f"zero_optimization.{old}", f"deprecated: read as {new}"
                          + (" {device: cpu}" if value is True else " absent")))
        else:
            out[new] = value
            notes.append((f"zero_optimization.{old}", f"deprecated: read as {new}"))
    return out, notes


def precision_sections(path: str, doc: dict) -> dict:
    """{"fp16": section, "bf16": section}: bf16 from ``bf16``, else the legacy ``bfloat16``;
    unknown keys refused as DeepSpeedFP16Config / DeepSpeedBF16Config refuse them."""
    out = {}
    for name, legacy, fields in (("fp16", None, FP16_FIELDS), ("bf16", "bfloat16", BF16_FIELDS)):
        key = name if name in doc or legacy not in doc else legacy
        sec = doc.get(key, {})
        if not isinstance(sec, dict):
            raise ValueError(f"{path!r}: {key} must be an object, got {sec!r}")
        unknown(path, key, sec, fields)
        out[name] = (key, sec)
    return out
