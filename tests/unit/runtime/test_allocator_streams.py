"""The caching allocator model's streams (zerospec/runtime/allocator.py): a freed block is reused
only on the stream it was allocated on, and an expandable segment grows for one stream. Each
expected byte count is worked out here from c10/cuda/CUDACachingAllocator.cpp's rules:
``get_free_block`` takes the lower bound of (stream, size, address) only if its stream is the
request's; ``get_allocation_size`` rounds a request of ≥ 10 MiB up to 2 MiB; expandable segments
map 20 MiB pages in the large pool, and ``find_expandable_block`` looks only at the request's
stream's unmapped blocks. MiB = 2^20 B.
"""
from __future__ import annotations

import pytest
import torch

from zerospec.runtime.allocator import CachingAllocator
from zerospec.runtime.context import RankContext
from zerospec.runtime.memory import MemoryLedger, TraceEvent
from zerospec.runtime.trace import StorageTrace, replay

MiB = 1 << 20

# a block freed on the default stream, then the same size on a side stream, then the default again
TWO_STREAMS = [TraceEvent("alloc", 1, 100 * MiB), TraceEvent("free", 1, 100 * MiB),
               TraceEvent("alloc", 2, 100 * MiB, stream="all_gather"),
               TraceEvent("alloc", 3, 100 * MiB)]


def test_a_block_freed_on_one_stream_is_not_reused_by_another():
    """100 MiB (a multiple of 2 MiB: one 100 MiB segment) freed on the default stream; 100 MiB on
    the all-gather stream cannot take it and cudaMallocs a second segment (200 MiB reserved);
    the default stream's next 100 MiB takes the cached one (still 200 MiB). On one stream the
    second request would have reused the first: 100 MiB reserved, 200 MiB at the end."""
    r = replay(TWO_STREAMS)
    assert (r.peak_allocated, r.peak_reserved) == (200 * MiB, 200 * MiB)
    one = replay([e._replace(stream="default") for e in TWO_STREAMS[:3]])
    assert one.peak_reserved == 100 * MiB
    two = replay(TWO_STREAMS[:3])
    assert two.peak_reserved == 200 * MiB


def test_with_expandable_segments_each_stream_grows_a_segment_of_its_own():
    """Expandable segments, large pool, 20 MiB pages: 30 MiB on the default stream maps two
    pages (40 MiB); freed, 30 MiB on the reduce-scatter stream cannot map into the default
    stream's segment and starts its own (two more pages: 80 MiB); on one stream the freed
    40 MiB would have served it (40 MiB)."""
    trace = [TraceEvent("alloc", 1, 30 * MiB), TraceEvent("free", 1, 30 * MiB),
             TraceEvent("alloc", 2, 30 * MiB, stream="reduce_scatter")]
    assert replay(trace, expandable_segments=True).peak_reserved == 80 * MiB
    same = [e._replace(stream="default") for e in trace]
    assert replay(same, expandable_segments=True).peak_reserved == 40 * MiB


def test_the_smallest_fitting_block_of_the_requests_stream_wins_over_a_smaller_one_elsewhere():
    """Cached: 20 MiB on the all-gather stream, 50 MiB on the default stream. A 20 MiB request
    on the default stream takes the 50 MiB block (split: 20 + 30), not the exact fit of the other
    stream: reserved stays 70 MiB and the all-gather block stays whole."""
    a = CachingAllocator()
    x, y = a.malloc(20 * MiB, "all_gather"), a.malloc(50 * MiB)
    a.free(x), a.free(y)
    a.malloc(20 * MiB)
    assert a.reserved == 70 * MiB
    assert sorted(a.segments()) == [[(20 * MiB, False)], [(20 * MiB, True), (30 * MiB, False)]]


def test_a_storage_made_on_a_side_stream_is_traced_on_it():
    """``RankContext.on_stream`` tags the storages made inside with that stream in the storage
    trace; outside it (and after it) they are on the default stream."""
    ctx = RankContext(0, 1, MemoryLedger(), None)
    with StorageTrace(ctx) as t:
        a = torch.empty(1024)
        with ctx.on_stream("all_gather"):
            b = torch.empty(1024)
        c = torch.empty(1024)
        del a, b, c
    assert [e.stream for e in t.trace if e.op == "alloc"] == ["default", "all_gather", "default"]


@pytest.mark.parametrize("bad", ["", None, 3])
def test_a_stream_is_a_non_empty_name(bad):
    """A stream that is not a non-empty string is refused, naming the value."""
    with pytest.raises(ValueError, match="stream"):
        CachingAllocator().malloc(512, bad)
    with pytest.raises(ValueError, match="stream"):
        with RankContext(0, 1, MemoryLedger(), None).on_stream(bad):
            pass


def test_the_fsdp2_flavour_makes_its_buffers_on_fsdp2s_streams():
    """Stage 3's FSDP2 flavour, one traced meta step: every flat all-gather buffer is made on the
    all-gather copy-in stream, every fp32 sharded gradient on the reduce-scatter stream, and all
    else (the reduce-scatter input, the unsharded parameters, activations) on the default stream,
    as foreach_all_gather and foreach_reduce make them."""
    from zerospec.model.presets import gpt
    from zerospec.training.config import TrainConfig
    from zerospec.training.scale import measure
    r = measure(TrainConfig.of(model=gpt(2, 64, 2), stage=3, n_d=2, flavour="fsdp2",
                               precision="bf16"), trace=True)
    where = {}
    for e in r.classes[0].allocations:
        if e.op == "alloc":
            where.setdefault(e.category, set()).add(e.stream)
    assert where.pop("ag_buffer") == {"all_gather_copy_in"}
    assert where.pop("shard_grad32") == {"reduce_scatter"}
    assert "rs_buffer" in where and set().union(*where.values()) == {"default"}
