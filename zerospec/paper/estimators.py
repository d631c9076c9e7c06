"""Per-GPU model-state estimators, side by side: the paper's, DeepSpeed's and Megatron-LM's.

They disagree, and the point of showing them together is *why*: each counts a different set of
buffers. Bytes are exact (:class:`fractions.Fraction` or ``int``); ``None`` means the estimator has no
formula for that stage (it is not a zero).

* ``paper`` — ZeRO's own accounting (C2, C6–C9): fp16 parameter 2 + fp16 gradient 2 + K = 12 bytes of
  fp32 master, momentum and variance = 16 bytes per parameter, partitioned stage by stage. The closed
  forms live in :mod:`zerospec.paper.theory`; this module only names them.
* ``deepspeed`` — the formulas of DeepSpeed's ``estimate_zero2_model_states_mem_needs`` and
  ``estimate_zero3_model_states_mem_needs`` (deepspeed/runtime/zero/stage_1_and_2.py and stage3.py,
  deepspeedai/DeepSpeed at commit edaa7221267243c7be7fb49c5d5f5c4fb97b4641, the version the
  tests compare with; older releases printed 4Ψ + 16Ψ/N for ZeRO-2). Without offload, ZeRO-2 is
  2Ψ + ⌊18Ψ/N⌋ and ZeRO-3 is 4·L + ⌊18Ψ/N⌋, with L the largest layer's parameter count. The 18 is
  2 (fp16 gradient) + 4 (fp32 gradient) + 4 (fp32 master) + 8 (momentum, variance): DeepSpeed counts
  an fp32 copy of the gradient partition that the paper's K = 12 leaves out (+4Ψ/N), and ZeRO-3 adds
  a 4-bytes-per-parameter buffer for the largest layer gathered in flight. With the optimizer
  offloaded to the CPU the GPU keeps 2Ψ (ZeRO-2), or 4·L + 2Ψ/N (ZeRO-3), or 4·L with the parameters
  offloaded too. DeepSpeed has no estimator for stages 0 and 1. Its printout divides by 2**30 but
  labels the result "GB"; we print decimal GB unless GiB is asked for.
* ``megatron`` — the bytes-per-parameter table of Megatron-LM's distributed optimizer
  (docs/api-guide/dist_optimizer.md, NVIDIA/Megatron-LM): with fp16 parameters and fp16 gradients
  20 bytes non-distributed, 4 + 16/d distributed; bf16 parameters with fp32 gradients 18 and
  6 + 12/d; fp32 both 16 and 8 + 8/d. Megatron keeps an fp32 *main gradient* (+4 bytes) beside the
  model gradient and shards it with the optimizer state, so its "distributed optimizer" is ZeRO-1
  with a fatter shard; it has no stage 2 or 3.
"""
from __future__ import annotations

import dataclasses
from fractions import Fraction
from typing import Callable

from . import theory

Bytes = Fraction | int


@dataclasses.dataclass(frozen=True)
class Estimator:
    name: str
    source: str
    counts: str                                              # which buffers it counts, one line
    formulas: dict[int, str]                                 # stage -> formula text
    _bytes: Callable[[int, int, int], Bytes | None]

    def model_state_bytes(self, stage: int, psi, n_d: int) -> Bytes | None:
        """Per-GPU bytes at ``stage`` for ``psi`` parameters on ``n_d`` GPUs, or None (no formula)."""
        theory.check(psi, n_d, stage)
        return self._bytes(stage, psi, n_d)

    def formula(self, stage: int) -> str:
        return self.formulas.get(stage, "n/a")

    def max_params(self, stage: int, gpu_bytes, n_d: int) -> int | None:
        """Largest integer Ψ whose estimate fits ``gpu_bytes`` (inclusive), or None (no formula)."""
        if self.model_state_bytes(stage, 1, n_d) is None:
            return None
        # Every estimate is a·Ψ + b up to a floor: start at the linear answer and step to the exact one.
        big = 10**15
        f1, f2 = self._bytes(stage, big, n_d), self._bytes(stage, 2 * big, n_d)
        a = Fraction(f2 - f1, big)
        b = f1 - a * big
        psi = max(0, int((Fraction(gpu_bytes) - b) / a))
        while psi > 0 and self._bytes(stage, psi, n_d) > gpu_bytes:
            psi -= 1
        while self._bytes(stage, psi + 1, n_d) <= gpu_bytes:
            psi += 1
        return psi


def _paper(stage: int, psi, n_d: int) -> Fraction:
    return theory.model_state_bytes(stage, psi, n_d)


def deepspeed_bytes(stage: int, psi, n_d: int, largest_layer: int = 0, offload_optimizer: bool = False,
                    offload_params: bool = False) -> int | None:
    """GPU bytes of DeepSpeed's ZeRO-2/ZeRO-3 estimators (see the module docstring for the source)."""
    psi = int(psi)
    if stage == 2:
        return 2 * psi if offload_optimizer else 2 * psi + (18 * psi) // n_d
    if stage == 3:
        layer = 4 * largest_layer
        if offload_optimizer and offload_params:
            return layer
        if offload_optimizer:
            return layer + (2 * psi) // n_d
        return layer + (18 * psi) // n_d
    return None


MEGATRON_BYTES = {  # dtype policy -> (non-distributed per param, (replicated, sharded) distributed)
    "fp16": (20, (4, 16)),
    "bf16": (18, (6, 12)),
    "fp32": (16, (8, 8)),
}


def megatron_bytes(stage: int, psi, n_d: int, dtype: str = "fp16") -> Fraction | None:
    """Megatron-LM's distributed-optimizer table: stage 0 = non-distributed, 1 = distributed."""
    if dtype not in MEGATRON_BYTES:
        raise ValueError(f"unknown Megatron dtype {dtype!r}; accepted: {', '.join(MEGATRON_BYTES)}")
    full, (rep, shard) = MEGATRON_BYTES[dtype]
    if stage == 0:
        return full * Fraction(psi)
    if stage == 1:
        return rep * Fraction(psi) + shard * Fraction(psi) / n_d
    return None


# fp32 training (no fp16/bf16): 4-byte parameters and gradients, no master copy, K = 8
# (theory.model_state_bytes's p and k); the formulas as the paper's, with those numbers
FP32_FORMULAS = {0: "(4+4+8)Ψ", 1: "8Ψ+8Ψ/N", 2: "4Ψ+12Ψ/N", 3: "16Ψ/N"}


def estimators(largest_layer: int = 0, megatron_dtype: str = "fp16") -> dict[str, Estimator]:
    """The three estimators; ``largest_layer`` feeds DeepSpeed's ZeRO-3 gather buffer (4 B/param).
    ``megatron_dtype`` is the run's precision: "fp32" makes the paper's accounting fp32's too
    (p = 4, K = 8); DeepSpeed's formulas take no dtype."""
    megatron_bytes(0, 1, 1, megatron_dtype)          # validates the dtype name
    full, (rep, shard) = MEGATRON_BYTES[megatron_dtype]
    fp32 = megatron_dtype == "fp32"
    return {
        "paper": Estimator(
            "paper", "ZeRO §3.1, §5 (C2, C6–C9)" + (", fp32: p = 4, K = 8" if fp32 else ""),
            "fp32 param 4 + fp32 grad 4 + momentum/variance 8 = 16 B/param" if fp32 else
            "fp16 param 2 + fp16 grad 2 + fp32 master/momentum/variance 12 = 16 B/param",
            FP32_FORMULAS if fp32 else {s.index: s.formula for s in theory.STAGES},
            (lambda s, p, n: theory.model_state_bytes(s, p, n, 8, 4)) if fp32 else _paper),
        "deepspeed": Estimator(
            "deepspeed", "DeepSpeed estimate_zero2/zero3_model_states_mem_needs (no offload)",
            "adds an fp32 gradient shard (+4Ψ/N); ZeRO-3 adds 4 B × largest layer in flight",
            {2: "2Ψ+18Ψ/N", 3: "4L+18Ψ/N"},
            lambda s, p, n: deepspeed_bytes(s, p, n, largest_layer)),
        "megatron": Estimator(
            "megatron", f"Megatron-LM distributed optimizer table ({megatron_dtype} params)",
            f"adds an fp32 main gradient: {full} B/param replicated, {rep}+{shard}/d distributed",
            {0: f"{full}Ψ", 1: f"{rep}Ψ+{shard}Ψ/N"},
            lambda s, p, n: megatron_bytes(s, p, n, megatron_dtype)),
    }


ESTIMATOR_NAMES = ("paper", "deepspeed", "megatron")
