"""ZeRO-R's constant-size buffers (C_B, C36): gradients reduced, and parameters gathered, through a
fused buffer of at most B elements, bucket after bucket — and the naive buffer the paper criticises.

**The problem (C29).** Fusing tensors into one flat buffer before a collective makes it efficient,
but a buffer over *all* gradients grows with the model: in fp32 (as gradient all-reduce and norm code
often keeps it) it is 4Ψ bytes, 6 GB at 1.5B and 12 GB at 3B. ``bucket_elements="model"`` builds that
buffer, so it can be measured: :class:`FusedBuffers` with no size limit, in fp32 (or the gradient's
own dtype if wider: the exact fp64 sums of zerospec/zero/exact.py must stay exact).

**C_B.** ``bucket_elements=B`` fuses into buckets of at most B elements, DeepSpeed's
``reduce_bucket_size`` / ``allgather_bucket_size`` (elements, not bytes; torch DDP's
``bucket_cap_mb`` is the same idea in MB). The buffer has the dtype the collective carries (fp16
for fp16 gradients, fp64 for exact sums), so its peak is B × element size whatever the model size.
Unlike DDP, which gives a parameter larger than the cap a bucket of its own, a unit larger than B is
split across buckets: the bound holds for every model.

**Layout.** A reduce-scatter or all-gather over N ranks treats a unit's padded flat vector as an
N × chunk matrix whose row r is rank r's shard. A bucket is N × w, w = ⌊B/N⌋ columns: pieces of
units' columns side by side, so row r of the bucket is rank r's part of every piece in it (FSDP's
reduce-scatter input is arranged the same way). The reduce-scatter's output is the bucket's own row
``rank``; the all-gather's input is that row. An all-reduce is the one-row case (w = B).

**Same numbers.** Each element is still reduced exactly once, over the ranks in rank order: the
simulator reduces elementwise, so where an element sits in a buffer does not change its sum. Stages
stay bit-identical to per-unit reduction (tests/unit/zero_r/test_buffers.py checks torch.equal, every stage).
gloo's ring sums in an order that depends on the buffer, so on the real engine they do not yet
(spec/engine.md, "Buckets on gloo").
Reduce-scatter and all-gather bytes are unchanged for every rank; an all-reduce's ring chunks move
with the bucket boundaries, so one rank may send a few elements more or less, the cluster's total is
unchanged (spec/buffers.md).

**Collectives.** A stream is the reductions (or gathers) of every unit in one micro-step: T columns,
T = Σ padded for an all-reduce and Σ chunk for a reduce-scatter or all-gather. It is cut into
⌈T / w⌉ buckets, the last one short; every bucket is one collective, issued as soon as it is full (in
stages 2 and 3, inside backward, as DeepSpeed's ipg bucket is), and the last one as the stream's last
unit arrives. A bucket is allocated (category ``bucket``) when its first piece arrives and freed
when its results are delivered, so at most one exists at a time. One bucket at a time also means
no overlap of a bucket's collective with filling the next (DeepSpeed double-buffers): the bytes and
the counts are the paper's subject here, not the time.

Under qgZ a bucket cannot fuse columns (its quantization groups lie inside a unit's chunks): the
buckets then hold units whole, each reduced on its own (:mod:`.unit_buckets`).

Stage 3's just-in-time parameter gathers are not bucketed: a bucket over several units would gather
units before their use (DeepSpeed stage 3's prefetch), a different memory schedule; stages 1 and 2
gather their updated parameters after the step through the bucket.
"""
from __future__ import annotations

import contextlib
import dataclasses

import torch

from .unit_buckets import UnitBuckets

MODEL = "model"   # bucket_elements="model": one fused buffer of the whole model (C29's naive buffer)


def check(bucket_elements, stage: int, n_d: int) -> None:
    """TrainConfig.bucket_elements: ValueError naming the value and what is accepted."""
    b = bucket_elements
    if b is None or b == MODEL:
        return
    if not isinstance(b, int) or isinstance(b, bool) or b < 1:
        raise ValueError(f"bucket_elements must be an integer >= 1 (a constant-size buffer, C_B), "
                         f"{MODEL!r} (one fused fp32 buffer of the whole model, C29) or None "
                         f"(one collective per unit), got {b!r}")
    if stage >= 1 and b < n_d:
        raise ValueError(f"bucket_elements={b} is smaller than n_d={n_d}: a reduce-scatter or "
                         f"all-gather bucket holds at least one element per rank (stage {stage})")


def for_rank(ctx, units, bucket_elements, whole_units: bool = False):
    """The buffers a stage reduces and gathers through: None (one collective per unit, the
    interconnect itself), :class:`Buckets` (C_B) or :class:`FusedBuffers` (C29); with
    ``whole_units`` (qgZ), buckets that hold units whole (:mod:`.unit_buckets`)."""
    if bucket_elements is None:
        return None
    if whole_units:
        return UnitBuckets(ctx, units, None if bucket_elements == MODEL else bucket_elements)
    if bucket_elements == MODEL:
        return FusedBuffers(ctx, units)
    return Buckets(ctx, units, bucket_elements)


@dataclasses.dataclass
class _Piece:
    """Columns [a, a + w) of one unit, at columns [at, at + w) of the bucket."""
    out: torch.Tensor          # where the result goes (rows × cols view)
    a: int
    at: int
    w: int
    add: bool                  # accumulate into ``out`` instead of copying
    then: object = None        # called once this piece, the output's last, is delivered


class Buckets:
    """Reduce and gather through buckets of at most ``elements`` elements (see the module doc).

    Has the interconnect's all_reduce / reduce_scatter / all_gather signatures (plus
    ``accumulate``), so stage code calls it where it would call ``ctx.comm``; results are valid
    once the stream is complete, at the latest at the end of a :meth:`batch` block."""

    def __init__(self, ctx, units, elements: int):
        self.ctx, self.memory, self.comm = ctx, ctx.memory, ctx.comm
        self.elements = elements
        n = ctx.n_ranks
        self.totals = {"all_reduce": sum(u.padded for u in units),             # columns, 1 row
                       "reduce_scatter": sum(u.padded // n for u in units),    # columns, N rows
                       "all_gather": sum(u.padded // n for u in units)}
        self._stream = None        # (op, reduce op, dtype) while a stream is open
        self._left = 0             # columns of the stream not yet in a bucket
        self._buf: torch.Tensor | None = None
        self._width = self._fill = 0   # the open bucket's columns, and how many are filled
        self._pieces: list[_Piece] = []

    # -- the interconnect's signatures --------------------------------------------------------------
    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        self._add("all_reduce", op, tensor.dtype, tensor.view(1, -1), tensor.view(1, -1), False)
        return tensor

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, op: str = "sum", *,
                       accumulate: bool = False, then=None, unit: int | None = None) -> torch.Tensor:
        """``input`` (a full unit, any dtype) is cast to ``output``'s dtype in the bucket;
        ``then()``, if given, runs once ``output`` is whole (ZeRO-Offload copies it down then).
        ``unit``: the stage's index of the unit, which columns do not need (whole units do:
        :mod:`.unit_buckets`)."""
        n = self.ctx.n_ranks
        self._add("reduce_scatter", op, output.dtype, input.view(n, -1), output.view(1, -1),
                  accumulate, then)
        return output

    def all_gather(self, output: torch.Tensor, input: torch.Tensor) -> torch.Tensor:
        n = self.ctx.n_ranks
        self._add("all_gather", None, output.dtype, input.view(1, -1), output.view(n, -1), False)
        return output

    @contextlib.contextmanager
    def batch(self):
        """Like the interconnect's batch: every result is delivered by the end of the block."""
        yield
        if self._stream is not None:
            raise RuntimeError(f"{self._stream[0]} stream left open with {self._left} columns "
                               f"not reduced: a unit was not handed to the buffers")

    # -- buckets ----------------------------------------------------------------------------------
    def width(self, op: str) -> int:
        """Columns per bucket: B for an all-reduce (one row), ⌊B/N⌋ with N rows."""
        return self.elements if op == "all_reduce" else self.elements // self.ctx.n_ranks

    def buffer_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return dtype

    def _add(self, op, reduce_op, dtype, src, out, add, then=None) -> None:
        """Copy ``src``'s columns into buckets; each full bucket is reduced (or gathered) at once."""
        key = (op, reduce_op, self.buffer_dtype(dtype))
        if self._stream is None:
            self._stream, self._left = key, self.totals[op]
        elif self._stream != key:
            raise RuntimeError(f"{op} ({reduce_op}, {dtype}) issued while a {self._stream[0]} "
                               f"stream is open: one stream at a time")
        cols, a = src.shape[1], 0
        if cols > self._left:
            raise RuntimeError(f"{op} of {cols} columns exceeds the {self._left} left in the "
                               f"stream: every unit once per stream")
        while a < cols:
            if self._buf is None:
                self._open(op)
            w = min(cols - a, self._width - self._fill)
            at = slice(self._fill, self._fill + w)
            if op == "all_gather":   # my shard goes into my row of the bucket
                self._grid()[self.ctx.rank, at].copy_(src[0, a:a + w])
            else:                    # every row: the whole unit piece (cast to the bucket's dtype)
                self._grid()[:, at].copy_(src[:, a:a + w])
            # buckets flush in order, so the output is whole once its last piece is delivered
            self._pieces.append(_Piece(out, a, self._fill, w, add, then if a + w == cols else None))
            self._fill, self._left, a = self._fill + w, self._left - w, a + w
            if self._fill == self._width:
                self._flush()
        if self._left == 0:
            self._stream = None

    def _rows(self) -> int:
        return 1 if self._stream[0] == "all_reduce" else self.ctx.n_ranks

    def _grid(self) -> torch.Tensor:
        return self._buf.view(self._rows(), self._width)

    def _open(self, op: str) -> None:
        """A new bucket: the stream's next w columns, or what is left of it (no padding sent)."""
        self._width = min(self.width(op), self._left)
        self._buf = self.memory.alloc("bucket", (self._rows() * self._width,), self._stream[2],
                                      zero=False)    # rows·w ≤ B elements
        self._fill = 0

    def _flush(self) -> None:
        """One collective over the full bucket, its results delivered, the bucket freed."""
        op, reduce_op, _ = self._stream
        grid = self._grid()
        if op == "all_reduce":
            self.comm.all_reduce(self._buf, reduce_op)
            result = grid
        elif op == "reduce_scatter":   # my row of the reduction lands in my row of the bucket
            mine = grid[self.ctx.rank]
            self.comm.reduce_scatter(mine, self._buf, reduce_op)
            result = mine.view(1, -1)
        else:
            self.comm.all_gather(self._buf, grid[self.ctx.rank])
            result = grid
        for p in self._pieces:
            dst = p.out[:, p.a:p.a + p.w]
            got = result[:, p.at:p.at + p.w]
            if p.add:
                dst.add_(got)
            else:
                dst.copy_(got)
        self.memory.free(self._buf)
        done = [p.then for p in self._pieces if p.then is not None]
        self._buf, self._pieces = None, []
        for then in done:
            then()


class FusedBuffers(Buckets):
    """C29's naive buffer: all of a stream's gradients fused into one fp32 buffer (4Ψ bytes for
    fp16 gradients), reduced by one collective. Parameter gathers go to the interconnect directly:
    the naive buffer is the gradients' (C29: "gradient all-reduce and gradient norm")."""

    def __init__(self, ctx, units):
        super().__init__(ctx, units, elements=0)

    def width(self, op: str) -> int:
        return self.totals[op]

    def buffer_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return torch.promote_types(dtype, torch.float32)   # fp16/bf16 → fp32; fp64 stays exact

    def all_gather(self, output: torch.Tensor, input: torch.Tensor) -> torch.Tensor:
        return self.comm.all_gather(output, input)
