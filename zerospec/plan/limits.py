"""The largest inputs the planner takes, each from the mechanism that bounds it, checked before
any work: a value past one is refused with one line naming the value and the limit.

- **Bytes** (:data:`MAX_BYTES`, 2^63 − 1): torch's sizes and strides, and so every tensor's byte
  count on meta, are signed 64-bit integers (c10's ``int64_t`` sizes; a larger storage fails
  torch's "Storage size calculation overflowed"), and the ledgers count in the same integers.
- **Ψ** (:data:`MAX_PARAMS`): the model states of mixed-precision Adam, 16 bytes per parameter
  (the paper's 2 + 2 + K, K = 12), must be such a byte count.
- **GPUs** (:data:`MAX_GPUS`, 2^31 − 1): torch.distributed's world size and ranks are C ``int``s
  (c10d's ``ProcessGroup::getSize()``), so no run has more.
- **A meta step's units** (:data:`MAX_META_UNITS`): a meta step runs every sharding unit's ops in
  Python (about 10 ms per block on this project's 2-core machines: Llama-3.1-405B's 126 blocks
  step in about a second), so 4,096 units, some 40 s, is the most a planner answer waits for.
"""
from __future__ import annotations

MAX_BYTES = 2**63 - 1
MAX_PARAMS = MAX_BYTES // 16
MAX_GPUS = 2**31 - 1
MAX_META_UNITS = 4096


def check_meta_step(model, micro_batch: int = 1, n_m: int = 1) -> None:
    """ValueError, before any tensor is made, unless one meta step of ``model`` (its block_size
    the sequence) has at most :data:`MAX_META_UNITS` units and every tensor it makes (a
    unit's flat parameter vector, an activation, the eager kernel's B·H·T² scores) fits :data:`MAX_BYTES` at 4 bytes
    an element (fp32, the widest compute dtype)."""
    units = model.n_layer + 3
    if units > MAX_META_UNITS:
        raise ValueError(f"num_hidden_layers {model.n_layer:,} makes {units:,} sharding units; a "
                         f"meta step takes at most {MAX_META_UNITS:,} (about 10 ms each in "
                         f"Python), so it is refused before any work")
    B, T, d = micro_batch, model.block_size, model.n_embd
    widest = max(d, model.ff, (model.n_head + 2 * model.kv_heads) * model.head_dim,
                 model.vocab_size)
    import math
    unit = max(sum(math.prod(shape) for _, shape in params)
               for _, params in model.unit_spec(n_m)[:3])    # embeddings, a block, the next
    biggest = {"the largest sharding unit (its parameters as one flat vector)": unit,
               "an activation (micro-batch × sequence × widest layer)": B * T * widest}
    if model.attention == "eager":
        biggest["the eager kernel's scores (micro-batch × heads × sequence²)"] = (
            B * (model.n_head // n_m) * T * T)
    for what, n in biggest.items():
        if 4 * n > MAX_BYTES:
            raise ValueError(f"{what} holds {n:,} elements, {4 * n:,} bytes in fp32: beyond "
                             f"2^63 − 1 bytes, the most a tensor can address (hidden_size "
                             f"{d:,}, sequence {T:,}, micro-batch {B})")


def check_count(value: int, text: str) -> int:
    if value > MAX_PARAMS:
        raise ValueError(f"parameter count {text!r} is beyond {MAX_PARAMS:,} (2^63 − 1 bytes / 16 "
                         f"bytes of model states per parameter: the most a 64-bit byte count holds)")
    return value


def check_bytes(value: int, text: str) -> int:
    if value > MAX_BYTES:
        raise ValueError(f"memory size {text!r} is beyond 2^63 − 1 bytes (9.2 EB), the most a "
                         f"64-bit byte count holds")
    return value


def check_gpus(value: int, text: str, what: str) -> int:
    if value > MAX_GPUS:
        raise ValueError(f"{what} {text!r} is beyond {MAX_GPUS:,} (2^31 − 1: torch.distributed's "
                         f"world size is a C int)")
    return value
