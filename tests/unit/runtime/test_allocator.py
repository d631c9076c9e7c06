"""The caching allocator model (zerospec/runtime/allocator.py) on traces worked out by hand.

Each docstring derives the expected bytes from the rules of c10/cuda/CUDACachingAllocator.cpp
(spec/allocator.md lists them). MiB = 2^20 B.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import strategies as st

from tests.support.examples import examples
from zerospec.cluster.threads import VirtualCluster
from zerospec.model.gpt import SMALL
from zerospec.runtime.allocator import CachingAllocator, OutOfMemory, allocation_size, round_size
from zerospec.runtime.memory import MemoryLedger, TraceEvent
from zerospec.runtime.trace import StorageTrace, replay
from zerospec.training.config import TrainConfig
from zerospec.training.sections import ZeroROptions
from zerospec.training.run import train
from zerospec.training.scale import measure

KiB, MiB = 1 << 10, 1 << 20


def fragmenting(allocator: CachingAllocator) -> list[int]:
    """Two 100 MiB tensors made and freed, then two of 60 MiB: each 60 reuses a cached 100 MiB
    segment split into 60 + 40 (best fit, ties by address). Returns the live ids."""
    a, b = allocator.malloc(100 * MiB), allocator.malloc(100 * MiB)
    allocator.free(a)
    allocator.free(b)
    return [allocator.malloc(60 * MiB), allocator.malloc(60 * MiB)]


def test_sizes_are_rounded_to_512_bytes_and_segments_to_the_pool_rules():
    """round_size: >= 512 B, multiples of 512. Segments: <= 1 MiB -> 2 MiB; < 10 MiB -> 20 MiB;
    else rounded up to 2 MiB (25 MiB -> 26 MiB)."""
    assert [round_size(n) for n in (1, 512, 513, 1000)] == [512, 512, 1024, 1024]
    assert [allocation_size(s) for s in (512, MiB, MiB + 512, 10 * MiB - 512, 10 * MiB,
                                         25 * MiB)] == [2 * MiB, 2 * MiB, 20 * MiB, 20 * MiB,
                                                        10 * MiB, 26 * MiB]


def test_three_small_requests_share_one_2mib_segment():
    """3 x 1 KiB are small (<= 1 MiB): the first cudaMallocs a 2 MiB segment and splits it
    (remainder >= 512 B); the next two split the remainder (best fit). Reserved 2 MiB,
    allocated 3 KiB, one free block of 2 MiB - 3 KiB."""
    a = CachingAllocator()
    for _ in range(3):
        a.malloc(KiB)
    assert (a.allocated, a.reserved, a.largest_free) == (3 * KiB, 2 * MiB, 2 * MiB - 3 * KiB)
    assert a.segments() == [[(KiB, True)] * 3 + [(2 * MiB - 3 * KiB, False)]]


def test_a_25mib_request_takes_a_whole_26mib_segment():
    """25 MiB >= 10 MiB: a segment rounded up to 2 MiB, 26 MiB. The 1 MiB left is not > 1 MiB,
    so the block is not split: memory_allocated counts the whole 26 MiB block."""
    a = CachingAllocator()
    a.malloc(25 * MiB)
    assert (a.requested, a.allocated, a.reserved) == (25 * MiB, 26 * MiB, 26 * MiB)
    assert a.segments() == [[(26 * MiB, True)]]


def test_a_freed_large_block_is_merged_back_and_split_again_for_the_next_request():
    """5 MiB (1-10 MiB) gets a 20 MiB segment, split 5 + 15. Freed, it merges back into 20 MiB;
    a 12 MiB request then reuses it (best fit), split 12 + 8 (8 > 1 MiB): reserved stays 20."""
    a = CachingAllocator()
    a.free(a.malloc(5 * MiB))
    assert a.segments() == [[(20 * MiB, False)]]
    a.malloc(12 * MiB)
    assert a.segments() == [[(12 * MiB, True), (8 * MiB, False)]]
    assert (a.allocated, a.reserved) == (12 * MiB, 20 * MiB)


def test_best_fit_takes_the_smallest_free_block_that_fits():
    """Cached segments of 16 and 12 MiB (made in that order): a 10 MiB request takes the 12
    (split 10 + 2, 2 > 1 MiB), then a 13 MiB one the 16 (split 13 + 3). Reserved stays 28."""
    a = CachingAllocator()
    big, small = a.malloc(16 * MiB), a.malloc(12 * MiB)
    a.free(big)
    a.free(small)
    a.malloc(10 * MiB)
    assert a.segments() == [[(16 * MiB, False)], [(10 * MiB, True), (2 * MiB, False)]]
    a.malloc(13 * MiB)
    assert a.segments() == [[(13 * MiB, True), (3 * MiB, False)],
                            [(10 * MiB, True), (2 * MiB, False)]]
    assert a.reserved == 28 * MiB


def test_free_neighbours_in_different_segments_never_merge():
    """Two 12 MiB segments, both freed, lie side by side but are two cudaMallocs: a 24 MiB
    request finds no 24 MiB block and makes a third segment. Reserved 12 + 12 + 24 = 48 MiB."""
    a = CachingAllocator()
    x, y = a.malloc(12 * MiB), a.malloc(12 * MiB)
    a.free(x)
    a.free(y)
    a.malloc(24 * MiB)
    assert (a.reserved, a.largest_free) == (48 * MiB, 12 * MiB)


def test_a_full_device_releases_cached_segments_and_retries():
    """The same on a 36 MiB device: the 24 MiB cudaMalloc fails (24 + 24 > 36), so malloc frees
    every unsplit cached segment (both 12s) before it retries: never more than 24 MiB reserved."""
    a = CachingAllocator(36 * MiB)
    x, y = a.malloc(12 * MiB), a.malloc(12 * MiB)
    a.free(x)
    a.free(y)
    a.malloc(24 * MiB)
    assert (a.reserved, a.peak_reserved, a.segments()) == (24 * MiB, 24 * MiB, [[(24 * MiB, True)]])


def test_fragmentation_runs_out_of_memory_with_40_percent_free():
    """On a 200 MiB device after fragmenting(): segments [60 used, 40 free] twice. 50 MiB: no
    free block fits, a new segment does not (200 + 50 > 200), and split segments cannot be
    released: OOM with 80 MiB free (40%), all of it in the cache, the largest block 40 MiB."""
    a = CachingAllocator(200 * MiB)
    fragmenting(a)
    with pytest.raises(OutOfMemory, match="a request of 52428800 B") as e:
        a.malloc(50 * MiB)
    err = e.value
    assert (err.allocated, err.reserved, err.largest_free) == (120 * MiB, 200 * MiB, 40 * MiB)
    assert (err.free, err.free_in_cache, err.device_free) == (80 * MiB, 80 * MiB, 0)


def test_max_split_size_keeps_oversize_blocks_whole_and_avoids_that_oom():
    """max_split_size 64 MiB: the cached 100 MiB blocks are oversize, never given to a smaller
    request. Each 60 MiB cudaMalloc fails (200 + 60 > 200), so one oversize block >= 64 MiB is
    released and the retry fits; 50 MiB then gets its own segment: 60 + 60 + 50 = 170 MiB."""
    a = CachingAllocator(200 * MiB, max_split_size=64 * MiB)
    fragmenting(a)
    a.malloc(50 * MiB)
    assert a.segments() == [[(60 * MiB, True)], [(60 * MiB, True)], [(50 * MiB, True)]]
    assert (a.reserved, a.peak_reserved) == (170 * MiB, 200 * MiB)


def test_an_oversize_block_serves_only_requests_within_20mib_of_its_size():
    """max_split_size 64 MiB, a cached 100 MiB block: 90 MiB >= 64 takes it whole (100 < 90 +
    20, not split: allocated 100 MiB); freed, 70 MiB may not (100 >= 70 + 20): new segment."""
    a = CachingAllocator(max_split_size=64 * MiB)
    a.free(a.malloc(100 * MiB))
    b = a.malloc(90 * MiB)
    assert (a.allocated, a.reserved) == (100 * MiB, 100 * MiB)
    a.free(b)
    a.malloc(70 * MiB)
    assert a.segments() == [[(100 * MiB, False)], [(70 * MiB, True)]]


def test_expandable_segments_avoid_the_fragmentation_oom():
    """Expandable: one large-pool segment, mapped in 20 MiB pages. 100 + 100 MiB map [0, 200);
    freed they merge into one 200 MiB block, and 60, 60, 50 MiB are carved from it in order:
    [60, 60, 50 used, 30 free], reserved 200 MiB, no OOM."""
    a = CachingAllocator(200 * MiB, expandable_segments=True)
    fragmenting(a)
    a.malloc(50 * MiB)
    assert a.segments() == [[(60 * MiB, True)] * 2 + [(50 * MiB, True), (30 * MiB, False)]]
    assert a.reserved == 200 * MiB


def test_expandable_segments_map_2mib_pages_small_and_20mib_pages_large():
    """5 MiB maps one 20 MiB large-pool page (split 5 + 15); 1 KiB maps one 2 MiB small-pool
    page: reserved 22 MiB, allocated 5 MiB + 1 KiB."""
    a = CachingAllocator(expandable_segments=True)
    a.malloc(5 * MiB)
    a.malloc(KiB)
    assert (a.allocated, a.reserved) == (5 * MiB + KiB, 22 * MiB)


def test_expandable_segments_unmap_free_pages_before_running_out():
    """60 MiB device, 3 x 20 MiB mapped, the middle one freed. 40 MiB: the segment's reserve
    (60 + 60/8 -> 80 MiB) has 20 MiB unmapped after the last block, too little; a new segment
    cannot map 40 (60 + 40 > 60). The free page is unmapped and the retry still fails: OOM
    with 40 MiB reserved. A 20 MiB request then maps the hole again: reserved 60 MiB."""
    a = CachingAllocator(60 * MiB, expandable_segments=True)
    ids = [a.malloc(20 * MiB) for _ in range(3)]
    a.free(ids[1])
    with pytest.raises(OutOfMemory) as e:
        a.malloc(40 * MiB)
    assert (e.value.reserved, e.value.allocated, a.reserved) == (40 * MiB, 40 * MiB, 40 * MiB)
    a.malloc(20 * MiB)
    assert a.reserved == 60 * MiB and a.segments() == [[(20 * MiB, True)] * 3]


def test_a_zero_byte_request_takes_no_block():
    """allocate() asks malloc only for size != 0: an empty tensor reserves nothing."""
    a = CachingAllocator()
    a.free(a.malloc(0))
    assert (a.allocated, a.reserved, a.segments()) == (0, 0, [])


def test_bad_options_and_frees_are_refused_with_what_is_accepted():
    """max_split_size below 20 MiB, a capacity < 1 or a free of an unknown id name the value."""
    with pytest.raises(ValueError, match=r"max_split_size must be a number of bytes >= 20971520"):
        CachingAllocator(max_split_size=MiB)
    with pytest.raises(ValueError, match=r"capacity must be a number of bytes >= 1 or None, got 0"):
        CachingAllocator(0)
    with pytest.raises(ValueError, match=r"free of block id 7, which is not allocated"):
        CachingAllocator().free(7)


# two 100 MiB blocks freed, then 60 + 60 MiB taken from their segments: 80 MiB free in two pieces
# of 40, and a 50 MiB request (event 8) that runs out on 200 MiB
FRAGMENTING = [TraceEvent("alloc", 1, 100 * MiB), TraceEvent("alloc", 2, 100 * MiB),
               TraceEvent("phase", label="setup"),
               TraceEvent("free", 1, 100 * MiB), TraceEvent("free", 2, 100 * MiB),
               TraceEvent("alloc", 1, 60 * MiB), TraceEvent("alloc", 3, 60 * MiB),
               TraceEvent("phase", label="forward"),
               TraceEvent("alloc", 4, 50 * MiB), TraceEvent("phase", label="backward")]

def test_replay_names_the_event_and_phase_that_run_out_and_what_was_free():
    """The fragmenting trace with phase markers on a 200 MiB device: the 50 MiB alloc (event 8)
    runs out inside phase "backward" with 80 MiB of 200 free; phases before it are reported."""
    trace = FRAGMENTING
    r = replay(trace, 200 * MiB)
    assert (r.oom.event, r.oom.phase, r.oom.free, r.oom.free_fraction) == (8, "backward",
                                                                           80 * MiB, 0.4)
    assert [(p.label, p.requested, p.reserved, p.largest_free) for p in r.phases] == [
        ("setup", 200 * MiB, 200 * MiB, 0), ("forward", 120 * MiB, 200 * MiB, 40 * MiB)]
    assert replay(trace, 200 * MiB, expandable_segments=True).oom is None


def test_a_replays_peaks_span_every_phase_even_after_an_oom_retry_released_the_cache():
    """100 + 60 MiB made and freed (160 MiB cached), then 150 MiB on a 200 MiB device: its new
    segment does not fit, both cached segments are released and it is retried (150 reserved);
    a marker follows. The replay's peaks are the run's (160 reserved, 160 allocated), not those
    since the last marker (150)."""
    trace = [TraceEvent("alloc", 1, 100 * MiB), TraceEvent("alloc", 2, 60 * MiB),
             TraceEvent("free", 1, 100 * MiB), TraceEvent("free", 2, 60 * MiB),
             TraceEvent("alloc", 3, 150 * MiB), TraceEvent("phase", label="end"),
             TraceEvent("free", 3, 150 * MiB)]
    r = replay(trace, 200 * MiB)
    assert r.oom is None and r.allocator.peak_reserved == r.allocator.reserved == 150 * MiB
    assert (r.peak_reserved, r.peak_allocated) == (160 * MiB, 160 * MiB)


def test_replay_refuses_a_trace_that_frees_what_is_not_live():
    """A free without its alloc is an error naming the event."""
    with pytest.raises(ValueError, match=r"trace event 0: free of storage 5, which is not live"):
        replay([TraceEvent("free", 5, 8)])


def test_a_ledger_records_no_trace_unless_asked():
    """Tracing is opt-in: a plain ledger keeps no events."""
    assert MemoryLedger().trace is None and MemoryLedger(trace=True).trace == []


def test_a_real_runs_trace_balances_and_replays_to_the_ledgers_bytes_at_every_phase():
    """Stage 3 on 2 virtual GPUs, 2 steps, every rank's ledger traced: allocs minus frees equal
    the ledger's bytes at the end, activations (saved-tensor hooks) are in the trace, and the
    replay's requested bytes equal the ledger's snapshot at every phase marker."""
    cluster = VirtualCluster(2)
    for ledger in cluster.memory:
        ledger.record_trace()
    result = train(TrainConfig(stage=3, n_d=2, model=SMALL, steps=2), cluster=cluster)
    for ledger in result.memory:
        trace = ledger.trace
        signed = {"alloc": 1, "free": -1, "phase": 0}
        assert sum(signed[e.op] * e.nbytes for e in trace) == ledger.total > 0
        assert {e.category for e in trace if e.op == "alloc"} >= {"activations", "gathered"}
        r = replay(trace)
        assert [(p.label, p.requested) for p in r.phases] == [
            (s.label, s.total) for s in ledger.snapshots]
        assert all(p.requested <= p.allocated <= p.reserved for p in r.phases)
        assert r.allocator.requested == ledger.total


def test_a_storage_trace_holds_the_ledgers_storages_and_every_temporary():
    """Stage 3, a checkpoint per block, on meta: the storage trace has the ledger's phase markers
    in the same places, holds at least the ledger's bytes at each (equal after setup, before any
    temporary), names the ledger's categories, and has temporaries the ledger never counts."""
    c = measure(TrainConfig(stage=3, n_d=4, model=SMALL,
                            zero_r=ZeroROptions(checkpoint_activations=1)), micro_batch=2,
                trace=True).classes[0]
    trace, snaps = c.allocations, c.memory.snapshots
    r = replay(trace)
    assert [p.label for p in r.phases] == [s.label for s in snaps]
    assert all(p.requested >= s.total for p, s in zip(r.phases, snaps))
    assert r.phases[0].requested == snaps[0].total > 0
    named = {e.category for e in trace if e.op == "alloc"}
    assert named >= {e.category for e in c.memory.trace} | {""}
    assert sum(e.nbytes for e in trace if e.category == "") > 0


class _Ctx:
    """What StorageTrace reads of a rank: its ledger, phase and step."""
    phase_name, step = "run", 0

    def __init__(self, trace: bool = False):
        self.memory = MemoryLedger(trace=trace)


def test_a_storage_resized_in_place_is_a_free_then_an_alloc():
    """``resize_`` is no aten op: 100 fp32 (400 B), resized to 0 (freed), to 50 fp32 (200 B,
    a new block), then the tensor dies (freed): alloc 400, free 400, alloc 200, free 200."""
    with StorageTrace(_Ctx()) as t:
        x = torch.empty(100)
        x.untyped_storage().resize_(0)
        x.untyped_storage().resize_(200)
        del x
    assert [(e.op, e.nbytes) for e in t.trace] == [("alloc", 400), ("free", 400),
                                                   ("alloc", 200), ("free", 200)]


def test_an_aten_resize_and_an_out_of_another_size_are_each_a_free_then_an_alloc():
    """Resizes through aten ops, which the trace sees among an op's arguments: ``Tensor.resize_``
    of 100 fp32 to 150 (400 B → 600 B; back to 0 elements keeps the storage), then
    ``torch.add(..., out=x)`` of 200 elements (600 B → 800 B): each time the old block freed and
    a new one taken; then both tensors die."""
    with StorageTrace(_Ctx()) as t:
        x = torch.zeros(100)
        x.resize_(150)
        x.resize_(0)
        y = torch.ones(200)
        torch.add(y, y, out=x)
        del x, y
    assert [(e.op, e.nbytes) for e in t.trace] == [
        ("alloc", 400), ("free", 400), ("alloc", 600), ("alloc", 800), ("free", 600),
        ("alloc", 800), ("free", 800), ("free", 800)]


@pytest.mark.parametrize("ledger_trace", [False, True], ids=["ledger", "ledger with its trace"])
def test_a_counted_storage_resized_back_up_keeps_its_category(ledger_trace):
    """The ledger counts a buffer as "gathered"; resized to 0 and back with no other count or
    free in between, its new block is still named "gathered" (the trace skips its rescan of
    unnamed storages only while the ledger is unchanged, and a block born already counted is a
    change of its own). A ledger that keeps its own trace tells the trace what it counted since
    its last look; the block born counted is not among that, and is named all the same."""
    ctx = _Ctx(ledger_trace)
    with StorageTrace(ctx) as t:
        x = ctx.memory.alloc("gathered", (100,), torch.float32)
        x.add_(1)                                  # an op: the trace names the first block
        x.untyped_storage().resize_(0)
        x.untyped_storage().resize_(400)
        x.add_(1)                                  # the next op names the new block
        ctx.memory.free(x)
        del x
    assert [(e.op, e.nbytes, e.category) for e in t.trace] == [
        ("alloc", 400, "gathered"), ("free", 400, "gathered"), ("alloc", 400, "gathered"),
        ("free", 400, "gathered")]


def test_a_failed_cudamalloc_frees_one_large_enough_oversize_block_before_everything():
    """max_split_size 20 MiB, capacity 100 MiB. 80 MiB and 1 KiB are made and freed: cached, an
    80 MiB oversize block (whole segment) and a 2 MiB small segment; 82 MiB reserved. 50 MiB
    then asked: the 80 MiB block may not serve it (oversize blocks serve only requests within
    20 MiB of their size: 80 ≥ 50 + 20), a new 50 MiB segment would make 132 > 100, so
    ``release_available_cached_blocks`` frees the one oversize block ≥ 50 MiB and the retry
    fits: 52 MiB reserved — the small segment is kept (release-everything would leave 50)."""
    a = CachingAllocator(100 * MiB, max_split_size=20 * MiB)
    x, s = a.malloc(80 * MiB), a.malloc(KiB)
    assert a.reserved == 82 * MiB
    a.free(x)
    a.free(s)
    a.malloc(50 * MiB)
    assert (a.reserved, a.allocated) == (52 * MiB, 50 * MiB)


def test_with_expandable_segments_best_fit_ranks_a_block_by_what_it_can_grow_to():
    """get_free_block with expandable segments: from the smallest block >= the request (order
    size, address), step to the next while it could grow to less (its size plus the unmapped
    range after it). Unbounded device, one large-pool segment in 20 MiB pages; allocations tile
    it in order: X 45 @0, 5, Y 40 @50, 5, W 60 @95, 15, Z 30 @170 (the mapped end: 200).
    X, Y, W, Z freed: Z grows to 30 + the unmapped reserve, X, Y, W to their own size. 30 MiB:
    candidates Z 30, Y 40, X 45, W 60; Y (40 < Z's) is taken, X (45 ≥ 40) is not: split 30 + 10
    at address 50. First fit by size would take Z @170, by address X @0, largest fit W @95;
    nothing is mapped (reserved stays 200 MiB)."""
    a = CachingAllocator(expandable_segments=True)
    x, _, y, _, w, _, z = (a.malloc(s * MiB) for s in (45, 5, 40, 5, 60, 15, 30))
    assert a.reserved == 200 * MiB and a.largest_free == 0
    for bid in (x, y, w, z):
        a.free(bid)
    a.malloc(30 * MiB)
    f, t = False, True
    assert a.segments() == [[(45 * MiB, f), (5 * MiB, t), (30 * MiB, t), (10 * MiB, f),
                             (5 * MiB, t), (60 * MiB, f), (15 * MiB, t), (30 * MiB, f)]]
    assert a.reserved == 200 * MiB


def test_with_expandable_segments_best_fit_stops_at_the_first_block_that_could_not_grow_less():
    """get_free_block's walk compares each block with the one before it and stops at the first
    that could not grow to less; a smaller grow-to further on is not seen. 120 MiB device (reserve
    135 -> 140 MiB), 20 MiB pages: A 50 @0, H 30 @50, K 20 @80, S 5 @100, T 15 @105 (mapped: 120).
    H freed, 40 MiB runs out (no free block fits, no mapping fits): H's whole page [60, 80) is
    unmapped, [50, 60) stays a 10 MiB free block J growing to 10 + 20 = 30. K, T freed: T grows to
    15 + 20 (the unmapped [120, 140)) = 35, K to 20. 10 MiB: candidates J, T, K; T (35 ≥ 30) stops
    the walk, so J is taken whole, K is not (a global minimum would split K at 80). Reserved 100."""
    a = CachingAllocator(120 * MiB, expandable_segments=True)
    _, h, k, _, t = (a.malloc(s * MiB) for s in (50, 30, 20, 5, 15))
    assert a.reserved == 120 * MiB
    a.free(h)
    with pytest.raises(OutOfMemory):
        a.malloc(40 * MiB)
    a.free(k)
    a.free(t)
    a.malloc(10 * MiB)
    f, u = False, True
    assert a.segments() == [[(50 * MiB, u), (10 * MiB, u)],
                            [(20 * MiB, f), (5 * MiB, u), (15 * MiB, f)]]
    assert a.reserved == 100 * MiB


@st.composite
def traces(draw) -> list[TraceEvent]:
    """Allocations of small, large and oversize requests, frees of live ones, phase markers."""
    events, live, key = [], [], 0
    for _ in range(draw(st.integers(1, 40))):
        op = draw(st.sampled_from(("alloc", "alloc", "free", "phase")))
        if op == "free" and live:
            events.append(TraceEvent("free", live.pop(draw(st.integers(0, len(live) - 1)))))
        elif op == "phase":
            events.append(TraceEvent("phase", label=f"p{len(events)}"))
        else:
            key += 1
            live.append(key)
            size = draw(st.sampled_from((512, 300 * KiB, 1 * MiB, 3 * MiB, 11 * MiB, 25 * MiB, 70 * MiB)))
            events.append(TraceEvent("alloc", key, size))
    return events


def _capacity_changes_nothing(trace, spare):
    """A device at least as large as what the replay without a limit reserved at its peak runs the
    same trace the same way, without running out (so cached.step_memory skips that replay)."""
    free = replay(trace)
    capped = replay(trace, max(free.peak_reserved, 1) + spare)
    assert capped.oom is None
    assert capped.phases == free.phases
    assert (capped.peak_allocated, capped.peak_reserved) == (free.peak_allocated, free.peak_reserved)


test_a_capacity_the_unlimited_replay_never_reserves_past_changes_nothing, \
    test_a_capacity_the_unlimited_replay_never_reserves_past_changes_nothing_more_examples = \
    examples(50, 200, traces(), st.integers(0, 4 * MiB))(_capacity_changes_nothing)
