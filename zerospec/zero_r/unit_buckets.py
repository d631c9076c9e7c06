"""C_B's buckets under qgZ: units side by side, whole, each reduced on its own when the bucket is
full (spec/zeropp.md, "With C_B's buckets").

ZeRO-R's buckets (:mod:`.buffers`) fuse columns: one reduce-scatter carries pieces of several
units. qgZ cannot take a piece: its all-to-alls quantize a unit's gradient in groups inside each
destination's chunk (zero/zeropp.py), and a bucket of pieces would put other groups, under other
scales, on the wire. DeepSpeed does not fuse there either: stage 3 collects gradients in its ipg
bucket of ``reduce_bucket_size`` elements (``stage3.py: __reduce_independent_p_g_buckets_and_remove_grads``
reduces the bucket before a gradient that would overflow it is added) and hands the bucket's
gradients as a *list* to ``runtime/comm/coalesced_collectives.py: all_to_all_quant_reduce``, which
quantizes and all-to-alls each tensor on its own (its own groups and scales) and sends a tensor qgZ
cannot take through its own reduce-scatter (``reduce_scatter_coalesced([tensor])``). The bucket
fuses *when* the reductions run, not what they carry.

So here: a unit's fp16 gradient is copied whole into the open bucket (category ``bucket``, the
gradient's dtype: what the quantizer reads, as DeepSpeed's ipg buffer is in its communication
dtype; with ``bucket_elements="model"`` one bucket holds every unit). A unit that would overflow
the bucket first flushes it; a unit larger than B gets a bucket of its own size, full at once
(DeepSpeed's rule, ``bucket.elements + param.ds_numel > reduce_bucket_size``). The bucket is also
flushed as soon as it is full and when the stream's last unit arrives (every unit once per
micro-step, as in :mod:`.buffers`). A flush reduces each unit in it through the stage's hooks
(zero/hooks.py): ``reduce_unit`` for a mean, ``reduce_sum`` for exact fp64 sums (zero/exact.py)
— qgZ's all-to-alls, or the plain reduce-scatter of a unit qgZ falls back on — in unit order
(DeepSpeed sorts the bucket by ``ds_id`` first), then frees the bucket.

Same numbers: every unit is reduced exactly as without buckets, so C_B stays neutral under qgZ
(tests/unit/zero/test_zeropp_composed.py). Same wire: the same collectives, each unit's codes and
scales; what changes is when they run (after the bucket fills, not as each unit's backward ends)
and the bucket the gradients wait in: at most max(B, the largest unit's padded size) elements.
"""
from __future__ import annotations

import contextlib
import dataclasses

import torch


@dataclasses.dataclass
class _Held:
    """Unit ``unit``'s gradient, waiting at elements [at, at + n) of the bucket."""
    unit: int
    out: torch.Tensor
    at: int
    n: int
    op: str
    add: bool
    then: object


class UnitBuckets:
    """Buckets of at most ``elements`` elements that hold units whole (see the module doc); with
    :mod:`.buffers`' ``reduce_scatter`` signature plus ``unit``, the stage's index of the unit.
    ``stage``: whose hooks reduce a unit, set once the stage is built (training/compose.py)."""

    def __init__(self, ctx, units, elements: int | None):
        self.memory = ctx.memory
        self.total = sum(u.padded for u in units)     # one stream: every unit, once per micro-step
        self.elements = self.total if elements is None else elements   # None: the whole model
        self.stage = None
        self._left = self.total
        self._buf: torch.Tensor | None = None
        self._width = self._fill = 0
        self._held: list[_Held] = []

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, op: str = "sum", *,
                       accumulate: bool = False, then=None, unit: int | None = None) -> torch.Tensor:
        """Unit ``unit``'s full gradient ``input`` waits in the bucket; its shard ``output`` is
        written (added to, with ``accumulate``) when the bucket is flushed, then ``then()`` runs."""
        if unit is None:
            raise ValueError("a bucket of whole units needs the unit's index (unit=i)")
        n = input.numel()
        if n > self._left:
            raise RuntimeError(f"unit {unit} of {n} elements exceeds the {self._left} left in the "
                               f"stream: every unit once per stream")
        if self._buf is not None and self._fill + n > self._width:
            self._flush()                        # it would overflow: the bucket goes first
        if self._buf is None:
            self._open(n, input.dtype)
        self._buf[self._fill:self._fill + n].copy_(input.view(-1))
        self._held.append(_Held(unit, output, self._fill, n, op, accumulate, then))
        self._fill += n
        self._left -= n
        if self._fill == self._width or self._left == 0:
            self._flush()
        if self._left == 0:
            self._left = self.total
        return output

    @contextlib.contextmanager
    def batch(self):
        """Like the interconnect's batch: every result is delivered by the end of the block."""
        yield
        if self._buf is not None:
            raise RuntimeError(f"a bucket of {len(self._held)} units left unreduced: a unit was "
                               f"not handed to the buffers")

    def _open(self, n: int, dtype: torch.dtype) -> None:
        """A bucket of B elements, or what is left of the stream; a unit larger than B: its own."""
        self._width = max(n, min(self.elements, self._left))
        self._buf = self.memory.alloc("bucket", (self._width,), dtype, zero=False)
        self._fill = 0

    def _flush(self) -> None:
        """Each held unit reduced on its own, in unit order, through the stage's hooks."""
        stage = self.stage
        for h in sorted(self._held, key=lambda h: h.unit):
            x = self._buf[h.at:h.at + h.n]
            if h.op == "mean":
                stage.reduce_unit(h.unit, h.out, x)
            elif h.add:     # exact sums (zero/exact.py): the micro-batch's fp64 part, added
                part = self.memory.alloc("buffer", (h.out.numel(),), h.out.dtype, zero=False)
                stage.reduce_sum(h.unit, part, x)
                h.out.add_(part)               # exact
                self.memory.free(part)
            else:
                stage.reduce_sum(h.unit, h.out, x)
            if h.then is not None:
                h.then()
        self.memory.free(self._buf)
        self._buf, self._held = None, []
