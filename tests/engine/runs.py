"""Process-group training runs shared by the engine tests: each (N, model, precision) once per
session, all four stages in one launch (the processes start once)."""
from __future__ import annotations

import functools

from tests.runs import MODELS, STEPS
from zerospec.training.run import train_processes
from zerospec.training.config import TrainConfig


def gloo(n_d: int, model: str = "small", precision: str = "fp16") -> tuple:
    """Results of stages 0–3 on ``n_d`` gloo processes, in stage order."""
    return _gloo(n_d, model, precision)   # one cache key however the caller spells the defaults


@functools.lru_cache(maxsize=None)
def _gloo(n_d: int, model: str, precision: str) -> tuple:
    cfgs = [TrainConfig(stage=s, n_d=n_d, model=MODELS[model], steps=STEPS, precision=precision,
                        timeout=60) for s in range(4)]
    return tuple(train_processes(cfgs))


THREADS = 1   # the launcher's default torch threads per rank process


@functools.lru_cache(maxsize=None)
def sim_matched(stage: int, n_d: int, model: str, precision: str):
    """The simulator with the rank processes' intra-op thread count: CPU kernels split their
    reductions by thread, so bit-equality across engines needs the same count (spec/engine.md)."""
    from zerospec.cluster.threads import VirtualCluster
    from zerospec.training.run import train
    cfg = TrainConfig(stage=stage, n_d=n_d, model=MODELS[model], steps=STEPS, precision=precision)
    return train(cfg, cluster=VirtualCluster(n_d, torch_threads=THREADS))
