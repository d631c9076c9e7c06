"""Training runs shared by the claim tests: each distinct config is trained once per session.

Results are deterministic (the baton serialises the ranks; reductions sum in rank order), so one
cached run can serve every test that reads it.
"""
from __future__ import annotations

import functools

from zerospec.model.gpt import ODD, SMALL
from zerospec.paper import theory
from zerospec.training.result import Result
from zerospec.training.config import TrainConfig
from zerospec.training.run import train

MODELS = {"small": SMALL, "odd": ODD}
N_DS = (1, 2, 4, 8, 32)
STEPS = 5


@functools.lru_cache(maxsize=None)
def run(stage: int, n_d: int, model: str = "small", steps: int = STEPS, **kw) -> Result:
    return train(TrainConfig(stage=stage, n_d=n_d, model=MODELS[model], steps=steps, **kw))


def stage_cases(claim) -> list:
    """stage × N_d × model parameters with readable ids (``P_os+g/nd=32/small``), each marked with
    ``claim(stage)``'s id, read from theory's stage table (``lambda s: s.memory_claim``); the default
    model last, so its N = 32 row speaks in the summary."""
    import pytest
    return [pytest.param(s, n, m, id=f"{stage_id(s)}/nd={n}/{m}",
                         marks=pytest.mark.claim(claim(theory.stage(s))))
            for m in reversed(list(MODELS)) for n in N_DS for s in range(4)]


def stage_id(stage: int) -> str:
    """The paper's label of ``stage``, as test ids carry it: DP, P_os, P_os+g, P_os+g+p."""
    return theory.stage(stage).label
