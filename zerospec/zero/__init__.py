"""ZeRO-DP stages 0–3, one small module each, each extending the previous one (cumulative)."""
from .ddp import DataParallel
from .gradients import Gradients
from .optimizer_states import ZERO1_COMM, OptimizerStates
from .parameters import Parameters

STAGES = {0: DataParallel, 1: OptimizerStates, 2: Gradients, 3: Parameters}
LABELS = {k: cls.label for k, cls in STAGES.items()}

__all__ = ["DataParallel", "OptimizerStates", "Gradients", "Parameters", "STAGES", "LABELS",
           "ZERO1_COMM"]
