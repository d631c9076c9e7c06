"""Table 3's ZeRO configurations C1–C5 (C46) as presets, and Figure 6's search (C47).

Each configuration is a ZeRO-DP stage plus ZeRO-R options, spelled as the keyword arguments of
:func:`zerospec.training.scale.measure`:

* C_B, constant-size buffers: ``bucket_elements`` = 500,000,000, DeepSpeed's default
  ``reduce_bucket_size`` / ``allgather_bucket_size`` (deepspeed/runtime/zero/config.py, the
  ZeRO-100B code base the paper ran, C40);
* M_D, defragmentation: ``contiguous_checkpoints`` (zerospec/zero_r/defrag.py);
* P_a: ``partition_activations`` over the MP group (at MP 1 a group of one: the whole
  checkpoint), with a checkpoint per block (P_a partitions checkpoints, so all five run with
  activation checkpointing, as Megatron's runs did);
* P_a+cpu: ``cpu_checkpointing`` on top of P_a.

Figure 6 (C47) asks for the largest model each configuration trains at 400 GPUs, MP 16, 16
sequences per GPU. :func:`max_layers` finds it by measured peaks in one shape family: hidden
8192, 64 heads of 128 (Table 4's 80B–170B family, whose layer counts Figure 6's 140B and 150B
use), layers varied. The answer is the L where L fits and L + 1 does not, both measured.
"""
from __future__ import annotations

import dataclasses

from ..model.presets import gpt
from ..training.config import TrainConfig
from ..training.fit import largest
from ..training.scale import measure

BUCKET_ELEMENTS = 500_000_000          # DeepSpeed's reduce/allgather bucket default (C_B)


@dataclasses.dataclass(frozen=True)
class ZeroConfig:
    """One row of Table 3 (C46)."""

    name: str
    stage: int                      # ZeRO-DP: 1 = P_os, 2 = P_os+g
    partition_activations: bool     # P_a
    cpu_checkpointing: bool         # P_a+cpu

    @property
    def zero_dp(self) -> str:
        """Table 3's ZeRO-DP cell."""
        return "P_os" if self.stage == 1 else "P_os+g"

    @property
    def zero_r(self) -> str:
        """Table 3's ZeRO-R cell, as modelled here."""
        parts = ["C_B", "M_D"]
        if self.partition_activations:
            parts.append("P_a+cpu" if self.cpu_checkpointing else "P_a")
        return " + ".join(parts)

    def kwargs(self, n_m: int) -> dict:
        """``measure``'s keyword arguments for this configuration at MP degree ``n_m``."""
        return dict(n_m=n_m, checkpoint_activations=1, bucket_elements=BUCKET_ELEMENTS,
                    partition_activations=self.partition_activations,
                    cpu_checkpointing=self.cpu_checkpointing, contiguous_checkpoints=True)


CONFIGS = {c.name: c for c in (
    ZeroConfig("C1", 1, False, False),
    ZeroConfig("C2", 1, True, False),
    ZeroConfig("C3", 2, False, False),
    ZeroConfig("C4", 2, True, False),
    ZeroConfig("C5", 2, True, True),
)}

# Figure 6's runs (C52, [SC] appendix Table 4): 400 GPUs, MP 16, 16 sequences per GPU.
FIG6 = dict(gpus=400, n_m=16, micro_batch=16, d=8192, heads=64)
# Its searches' probes, whose line is the first guess: past where P_os+g's C_B bucket of 500M
# elements fills with a layer's 12·d²/N_m = 50.3M fp16 gradient elements per MP rank (at 10
# layers), so their bytes per layer are a large model's (below it each layer adds 2 B × 50.3M
# of bucket too); 8 and 16 straddle it, and their line guessed P_os+g's fits one step low
FIG6_PROBES = (16, 32)


def peak_bytes(config: ZeroConfig, layers: int, *, gpus: int, n_m: int, micro_batch: int,
               d: int, heads: int, over: int | None = None) -> int:
    """The highest measured peak of any rank of one meta step (model states, activations,
    checkpoints, buckets; the caching allocator's fragmentation is not included). ``over``: step
    the rank classes one at a time, in rank order, and stop at the first whose peak exceeds
    ``over`` bytes — the step does not fit whatever the others hold — answering the highest so
    far (what "does not fit" needs is that GPU alone; "fits" needs every one)."""
    cfg = TrainConfig.of(model=gpt(layers, d, heads), stage=config.stage, n_d=gpus // n_m,
                         **config.kwargs(n_m))
    if over is None:
        return max(c.memory.peak_total for c in measure(cfg, micro_batch=micro_batch).classes)
    peak, i, count = 0, 0, 1
    while i < count and peak <= over:
        r = measure(cfg, micro_batch=micro_batch, only=i)
        peak, i, count = max(peak, r.classes[0].memory.peak_total), i + 1, r.class_count
    return peak


def max_layers(config: ZeroConfig, capacity: int, probes=(8, 16), seen: dict | None = None,
               **shape) -> tuple[int, int]:
    """(the most layers whose step peaks within ``capacity`` bytes, meta steps measured), by the
    one fit search (zerospec/training/fit.py), its first guess the line through ``probes``.
    ``seen``, if given, receives every measured peak by L (the evidence, without measuring it
    again): every GPU's highest where L fits; where it does not, that of the GPUs stepped up to
    the first over ``capacity`` (:func:`peak_bytes`'s ``over``)."""
    shape = {**FIG6, **shape}
    seen = {} if seen is None else seen

    def peak(L: int) -> int:
        if L not in seen:
            seen[L] = peak_bytes(config, L, over=capacity, **shape)
        return seen[L]

    return largest(peak, capacity, probes=probes).value or 0, len(seen)
