"""ZeRO-DP stages 0–3, one small module each, each extending the previous one (cumulative)."""
from .stage0_dp import DataParallel
from .stage2_grads import Gradients
from .stage1_os import ZERO1_COMM, OptimizerStates
from .stage3_params import Parameters

STAGES = {0: DataParallel, 1: OptimizerStates, 2: Gradients, 3: Parameters}
LABELS = {k: cls.label for k, cls in STAGES.items()}

__all__ = ["DataParallel", "OptimizerStates", "Gradients", "Parameters", "STAGES", "LABELS",
           "ZERO1_COMM"]
