"""zerospec: an executable specification of ZeRO (Rajbhandari et al., arXiv:1910.02054).

The public face: configure a run, train it on virtual GPUs (threads) or on real processes, read
its :class:`Result`. Everything else lives in one package per layer (see README, "Layout").

The names below load on first use (PEP 562), so ``import zerospec`` and the command line's parser
do not import torch: ``zerospec plan --gpu-mem lots`` fails in a fraction of a second.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"
_HOME = {"VirtualCluster": ".cluster.threads",
         "ODD": ".model.gpt", "SMALL": ".model.gpt", "GPTConfig": ".model.gpt",
         "AdamConfig": ".optim.adam", "LossScale": ".optim.loss_scale",
         "RankContext": ".runtime.context",
         "ClusterAborted": ".runtime.errors", "ClusterError": ".runtime.errors",
         "CollectiveError": ".runtime.errors", "CollectiveTimeout": ".runtime.errors",
         "RankError": ".runtime.errors",
         "TrainConfig": ".training.config", "Result": ".training.result",
         "train": ".training.run", "train_processes": ".training.run"}
__all__ = ["train", "train_processes", "TrainConfig", "Result", "GPTConfig", "SMALL", "ODD",
           "AdamConfig", "LossScale", "VirtualCluster", "RankContext", "ClusterError",
           "ClusterAborted", "CollectiveError", "CollectiveTimeout", "RankError"]


def __getattr__(name: str):
    """A public name from its module, or a subpackage (``zerospec.training.checkpoint.load``), on
    first use; importing a module sets it here, so later lookups do not come back."""
    if name in _HOME:
        value = getattr(importlib.import_module(_HOME[name], __name__), name)
        globals()[name] = value
        return value
    if name.startswith("_"):    # tools probe dunders (__wrapped__, __path__ …): no import for those
        raise AttributeError(f"module 'zerospec' has no attribute {name!r}")
    try:
        module = importlib.import_module(f".{name}", __name__)
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":    # the subpackage exists but lacks a dependency
            raise
        raise AttributeError(f"module 'zerospec' has no attribute {name!r}") from None
    # a dotted path (zerospec.training.checkpoint.load) reaches into modules the package used to
    # import eagerly: load them, as it did
    for home in set(_HOME.values()):
        importlib.import_module(home, __name__)
    return module


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
