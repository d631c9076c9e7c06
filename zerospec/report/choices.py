"""What ``zerospec report`` may be asked for, without torch: the command line builds its options
from these names and refuses a wrong one in tenths of a second, where the modules that measure and
build (:mod:`.measure`, :mod:`.tables`) import torch, which takes seconds. Those modules take the
names from here."""
from __future__ import annotations

from ..paper import theory


def _variant(stage: int, zero1_comm: str = "reduce_scatter") -> tuple[int, str, str]:
    """(stage, ZeRO-1 gradient sync, label), the label from the stage table: ``ZeRO-1 (P_os)``."""
    extra = ", all-reduce" if zero1_comm == "all_reduce" else ""
    return stage, zero1_comm, f"ZeRO-{stage} ({theory.stage(stage).label}{extra})"


# the report's runs: "1" is the paper's 2Ψ ZeRO-1 (C22); "1ar" the all-reduce ZeRO-1 of the seed
# and of DeepSpeed's first version, 3Ψ (C23)
VARIANTS = {"0": _variant(0), "1": _variant(1), "1ar": _variant(1, "all_reduce"), "2": _variant(2),
            "3": _variant(3)}
# the report's tables (:mod:`.tables`), in the order printed
TABLES = ("memory", "comm", "equivalence", "flops", "wallclock", "activations", "zero_r", "scaled")
