"""ZeRO-R: memory beyond the model states (§3.2, §6). So far activation checkpointing
(:mod:`.checkpointing`) and constant-size fused buffers (:mod:`.buffers`); partitioned
activations (P_a, P_a+cpu) need model parallelism first."""
from .checkpointing import block_runner, segments

__all__ = ["block_runner", "segments"]
