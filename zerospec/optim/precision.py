"""Precision policies: what the working copy of parameters and gradients is stored in.

* ``fp16`` — the paper's mixed precision (C2): fp16 parameters and gradients (2 + 2 bytes), fp32
  master weights, momentum and variance (K = 12).
* ``bf16`` — the same layout with bfloat16 working copies (same bytes, wider exponent).
* ``fp32`` — no separate master copy: the fp32 parameters *are* the weights Adam updates, so the
  optimizer state is only momentum and variance, K = 8, and parameters and gradients take 4 bytes
  each: (4 + 4 + 8)Ψ = 16Ψ, the same total by coincidence, split differently across stages.

The memory categories keep their names whatever the policy: ``param16``/``grad16`` hold the
working copies (fp32 under the fp32 policy) and ``master32`` exists only with a master copy.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# torch is imported on first use of a dtype, not here: the command line lists the policies'
# names for `zerospec train --help` and refuses a bad one without waiting seconds for torch


@dataclasses.dataclass(frozen=True)
class Precision:
    name: str
    dtype_name: str          # torch's name of the working storage dtype: torch.<dtype_name>
    master: bool             # a separate fp32 master copy of the weights exists

    @functools.cached_property   # read on hot paths; frozen, so computed once
    def dtype(self) -> torch.dtype:
        """The storage of the working parameters and gradients."""
        import torch
        return getattr(torch, self.dtype_name)

    @property
    def k(self) -> int:
        """Optimizer-state bytes per parameter (C4's K): master (if any) + exp_avg + exp_avg_sq."""
        return 12 if self.master else 8


POLICIES = {
    "fp16": Precision("fp16", "float16", True),
    "bf16": Precision("bf16", "bfloat16", True),
    "fp32": Precision("fp32", "float32", False),
}


def policy(name: str) -> Precision:
    if name not in POLICIES:
        raise ValueError(f"unknown precision {name!r}; accepted: {', '.join(POLICIES)}")
    return POLICIES[name]
