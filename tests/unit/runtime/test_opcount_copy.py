"""The op counter's bytes for the ops that overwrite their ``self`` (zerospec/runtime/opcount.py,
OVERWRITES): ``copy_`` reads its source and writes its destination, never reads it."""
from __future__ import annotations

from collections import Counter

import torch

from zerospec.runtime.opcount import Op, OpCounter


def only(ops: Counter) -> Op:
    (op, n), = ops.items()
    assert n == 1
    return op


def test_a_copy_reads_only_its_source_and_writes_its_destination():
    """dst.copy_(src), 1000 fp16 elements into 1000 fp32 (meta): 2000 bytes read (the source),
    4000 written (the destination), no FLOPs — the destination's old 4000 bytes are not read."""
    dst = torch.empty(1000, dtype=torch.float32, device="meta")
    src = torch.empty(1000, dtype=torch.float16, device="meta")
    with OpCounter() as c:
        dst.copy_(src)
    assert only(c.ops) == Op("aten.copy_.default", 0, 2000, 4000)


def test_zero_and_fill_write_their_self_and_read_nothing():
    """x.zero_() and x.fill_(1) on 1000 fp32 elements: a memset each, 0 bytes read, 4000 written."""
    x = torch.empty(1000, dtype=torch.float32, device="meta")
    with OpCounter() as c:
        x.zero_()
        x.fill_(1.0)
    assert {op.name: (op.read, op.written) for op in c.ops} == {
        "aten.zero_.default": (0, 4000), "aten.fill_.Scalar": (0, 4000)}
