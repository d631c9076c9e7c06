"""ZeRO-R: memory beyond the model states (§3.2, §6): activation checkpointing
(:mod:`.checkpointing`), partitioned activation checkpoints P_a and P_a+cpu (:mod:`.partition`,
with model parallelism, zerospec/model/megatron.py) and constant-size fused buffers (:mod:`.buffers`; under qgZ of whole units,
:mod:`.unit_buckets`)."""
from .checkpointing import block_runner, count, segments
from .partition import Partitioned

__all__ = ["block_runner", "count", "segments", "Partitioned"]
