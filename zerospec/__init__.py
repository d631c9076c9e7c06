"""zerospec: an executable specification of ZeRO (Rajbhandari et al., arXiv:1910.02054).

The public face: configure a run, train it on virtual GPUs (threads) or on real processes, read
its :class:`Result`. Everything else lives in one package per layer (see README, "Layout").
"""
from .cluster.threads import VirtualCluster
from .model.gpt import ODD, SMALL, GPTConfig
from .optim.adam import AdamConfig
from .optim.loss_scale import LossScale
from .runtime.context import RankContext
from .runtime.errors import ClusterAborted, ClusterError, CollectiveError, CollectiveTimeout, RankError
from .training.config import TrainConfig
from .training.result import Result
from .training.run import train, train_processes

__version__ = "0.1.0"
__all__ = ["train", "train_processes", "TrainConfig", "Result", "GPTConfig", "SMALL", "ODD",
           "AdamConfig", "LossScale", "VirtualCluster", "RankContext", "ClusterError",
           "ClusterAborted", "CollectiveError", "CollectiveTimeout", "RankError"]
