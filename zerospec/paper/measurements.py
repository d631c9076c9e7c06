"""Published measurements taken on real GPUs, each with its source and configuration: what
spec/validation.md sets zerospec's predictions beside (zerospec/evaluation/validation.py).

Every value is as its source prints it. A memory reading is in the source's unit: torchtitan
prints GiB = 2^30 B (``torchtitan/metrics.py::DeviceMemoryMonitor._to_gib`` at 9dec370, "GiB
(gibibyte) is 1024, vs GB is 1000") to one decimal, so a printed 82.4 covers [82.35, 82.45) GiB.
A model size is the paper's (decimal billions of parameters, rounded as the paper rounds).
"""
from __future__ import annotations

import dataclasses
from fractions import Fraction

GiB = 2**30

# [TT] pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md (the page: added in 820504e2;
#      its runs: torchtitan 9dec370, torch 1963fc8): Llama 3.1 8B on 96 GB HBM2e H100s
#      (zerospec/paper/hardware.py GRAND_TETON_H100), train_configs/llama3_8b.toml at 9dec370 with
#      --training.batch_size 2: seq 8192, AdamW (foreach), selective activation checkpointing per op
#      ('op'), bf16 parameters and fp32 gradient reduction (config_manager.py defaults), eager
#      unless "compile"; run_llama_train.sh sets PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.
#      "Memory" is torchtitan's logged max_reserved: memory_stats()["reserved_bytes.all.peak"]
#      (torchtitan/metrics.py::DeviceMemoryMonitor.get_peak_stats), the lifetime peak since the
#      loop began (its peaks are reset only to the current value).
TT = "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md (runs at 9dec370)"
# [ZeRO] Rajbhandari et al., arXiv:1910.02054, Figure 6 (SC'20 Figure 5) and Table 3: the largest
#      model each configuration trained, 400 V100-32GB, MP 16, batch fixed (C47; C3 inferred).
ZERO = "ZeRO (arXiv:1910.02054) Figure 6, Table 3"
# [ZO] Ren et al., ZeRO-Offload (arXiv:2101.06840) abstract and §1: "over 13 billion" parameters
#      on a single V100 (32 GB) (B7).
ZO = "ZeRO-Offload (arXiv:2101.06840) abstract, §1"


@dataclasses.dataclass(frozen=True)
class Published:
    """One published measurement: ``key``, where it is printed, the run's configuration, and the
    value with its unit ("GiB reserved" or "parameters"), and as the source prints it."""

    key: str
    source: str
    configuration: str
    value: Fraction
    unit: str
    printed: str
    kind: str = "published measurement"

    @property
    def bytes(self) -> Fraction:
        if self.unit != "GiB reserved":
            raise ValueError(f"{self.key} is a model size, not bytes")
        return self.value * GiB


_TT_CFG = ("Llama 3.1 8B, FSDP {n} (fully_shard, bf16 params, fp32 reduce), local batch 2 × seq "
           "8192, selective op AC, AdamW, {mode}, expandable segments")
TORCHTITAN = (
    Published("torchtitan-8gpu", f"{TT}, Table 1", _TT_CFG.format(n=8, mode="eager"),
              Fraction("82.4"), "GiB reserved", "82.4 GiB"),
    Published("torchtitan-8gpu-compile", f"{TT}, Table 1", _TT_CFG.format(n=8, mode="torch.compile"),
              Fraction("77.0"), "GiB reserved", "77.0 GiB"),
    Published("torchtitan-128gpu", f"{TT}, Table 3", _TT_CFG.format(n=128, mode="eager"),
              Fraction("67.0"), "GiB reserved", "67.0 GiB"),
)

_C47_CFG = "400 V100-32GB, MP 16, 16 × 1024 tokens per GPU, {zero}"
_C47 = {"C1": ("P_os + C_B + M_D", 40), "C2": ("P_os + C_B + M_D + P_a", 60),
        "C3": ("P_os+g + C_B + M_D (inferred)", 50), "C4": ("P_os+g + C_B + M_D + P_a", 140),
        "C5": ("P_os+g + C_B + M_D + P_a+cpu", 150)}
ZERO_FIGURE6 = tuple(Published(f"zero-fig6-{c}", ZERO, _C47_CFG.format(zero=z),
                               Fraction(b * 10**9), "parameters", f"{b}B")
                     for c, (z, b) in _C47.items())

ZERO_OFFLOAD = (
    Published("zero-offload-1gpu", ZO, "1 V100-32GB, ZeRO-2 with the optimizer on the CPU",
              Fraction(13 * 10**9), "parameters", "over 13B"),
)

ALL = TORCHTITAN + ZERO_FIGURE6 + ZERO_OFFLOAD
