"""ZeRO-DP stages 0–3, one small module each, each extending the previous one (cumulative).

The class chain reads as the paper's: each class is the previous stage plus one more partitioned
state, and is named after that state — ``DataParallel`` (stage 0, nothing partitioned) →
``OptimizerStates`` (P_os) → ``Gradients`` (P_os+g: optimizer states *and* gradients) →
``Parameters`` (P_os+g+p). So ``Gradients(OptimizerStates)`` reads "partition the gradients too",
not "a gradient is an optimizer state". ``EXACT_STAGES`` holds the same four with exact fp64
gradient sums (zerospec/zero/exact.py).

Gradient reductions and the post-step parameter gathers go to ``stage.fused``: the interconnect
itself (one collective per unit), or fused buffers with its signatures that a run passes in as
``buckets`` — ZeRO-R's constant-size buckets or the naive whole-model buffer
(zerospec/zero_r/buffers.py; the stage code stays backend- and buffer-agnostic).
"""
from .stage0_dp import DataParallel
from .stage2_grads import Gradients
from .stage1_os import ZERO1_COMM, OptimizerStates
from .stage3_params import Parameters
from .exact import EXACT_STAGES

STAGES = {0: DataParallel, 1: OptimizerStates, 2: Gradients, 3: Parameters}
LABELS = {k: cls.label for k, cls in STAGES.items()}

__all__ = ["DataParallel", "OptimizerStates", "Gradients", "Parameters", "STAGES", "EXACT_STAGES",
           "LABELS", "ZERO1_COMM"]
