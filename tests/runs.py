"""Training runs shared by the claim tests: each distinct config is trained once per session.

Results are deterministic (the baton serialises the ranks; reductions sum in rank order), so one
cached run can serve every test that reads it.
"""
from __future__ import annotations

import functools

from zerospec.model import ODD, SMALL
from zerospec.train import Result, TrainConfig, train

MODELS = {"small": SMALL, "odd": ODD}
N_DS = (1, 2, 4, 8, 32)
STEPS = 5


@functools.lru_cache(maxsize=None)
def run(stage: int, n_d: int, model: str = "small", steps: int = STEPS, **kw) -> Result:
    return train(TrainConfig(stage=stage, n_d=n_d, model=MODELS[model], steps=steps, **kw))


def stage_id(stage: int) -> str:
    return {0: "DP", 1: "P_os", 2: "P_os+g", 3: "P_os+g+p"}[stage]
