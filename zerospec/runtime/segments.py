"""The pieces of the caching allocator model (zerospec/runtime/allocator.py): its constants and
size rules, blocks, pools and the out-of-memory error. Names and rules are those of
``c10/cuda/CUDACachingAllocator.cpp`` (pytorch/pytorch, commit 001074d2).
"""
from __future__ import annotations

import bisect
import sys

MiB = 1 << 20
MIN_BLOCK_SIZE = 512            # kMinBlockSize: all sizes are rounded to multiples of 512 B
SMALL_SIZE = 1 * MiB            # kSmallSize: the largest "small" request
SMALL_BUFFER = 2 * MiB          # kSmallBuffer: small requests are packed in 2 MiB segments
MIN_LARGE_ALLOC = 10 * MiB      # kMinLargeAlloc: requests of 1–10 MiB get a 20 MiB segment
LARGE_BUFFER = 20 * MiB         # kLargeBuffer
ROUND_LARGE = 2 * MiB           # kRoundLarge: larger segments are rounded up to 2 MiB
NO_LIMIT = sys.maxsize          # max_split_size's default (SIZE_MAX): every block may split
ADDRESS_SPACE = 1 << 48         # an expandable segment's reserve when the capacity is unbounded
DEFAULT_STREAM = "default"      # the stream a request is made on unless a trace says otherwise


def round_size(nbytes: int) -> int:
    """``round_size``: at least 512 B, else up to a multiple of 512 B (power-of-2 divisions off)."""
    return max(MIN_BLOCK_SIZE, -(-nbytes // MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE)


def allocation_size(size: int) -> int:
    """``get_allocation_size``: the cudaMalloc a request of ``size`` (rounded) bytes makes."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


class OutOfMemory(MemoryError):
    """A request the model cannot serve even after releasing every cached segment it could.

    As ``malloc``'s message: what was asked, what the program holds (``allocated``), what the
    allocator holds (``reserved``), and the cache left after the releases (``free_in_cache``,
    split segments only, its ``largest_free`` block); ``free`` = capacity − allocated."""

    def __init__(self, requested: int, size: int, alloc_size: int, allocated: int, reserved: int,
                 capacity: int, largest_free: int):
        self.requested, self.size, self.alloc_size = requested, size, alloc_size
        self.allocated, self.reserved, self.capacity = allocated, reserved, capacity
        self.largest_free = largest_free
        super().__init__(
            f"model CUDA out of memory: a request of {requested} B (rounded to {size} B, a new "
            f"segment of {alloc_size} B) on a device of {capacity} B: {allocated} B allocated, "
            f"{reserved} B reserved, {self.free_in_cache} B free in cache (largest free block "
            f"{largest_free} B), {self.device_free} B never reserved; {self.free} B free in all")

    @property
    def free_in_cache(self) -> int:
        return self.reserved - self.allocated

    @property
    def device_free(self) -> int:
        return self.capacity - self.reserved

    @property
    def free(self) -> int:
        """Bytes the program does not hold: the "free at OOM" of C30."""
        return self.capacity - self.allocated


class Segment:
    """One expandable segment's virtual reserve (``ExpandableSegment``): ``size`` bytes from
    ``base``, mapped in ``page``-byte pages, serving one ``stream``."""

    __slots__ = ("base", "size", "page", "stream")

    def __init__(self, base: int, size: int, page: int, stream: str = DEFAULT_STREAM):
        self.base, self.size, self.page, self.stream = base, size, page, stream


class Block:
    """``Block``: ``size`` bytes at ``ptr`` on ``stream`` (its segment's: every block a segment is
    split into keeps the stream the segment was allocated on); ``prev``/``next`` are its
    neighbours in its segment."""

    __slots__ = ("ptr", "size", "small", "allocated", "requested", "prev", "next", "mapped",
                 "segment", "stream")

    def __init__(self, ptr: int, size: int, small: bool, *, mapped: bool = True,
                 segment: Segment | None = None, stream: str = DEFAULT_STREAM):
        self.ptr, self.size, self.small, self.stream = ptr, size, small, stream
        self.allocated, self.requested = False, 0
        self.prev: Block | None = None
        self.next: Block | None = None
        self.mapped, self.segment = mapped, segment

    def splice(self, before: Block | None, after: Block | None) -> None:
        """``Block::splice``: put this block between ``before`` and ``after``."""
        if before is not None:
            before.next = self
        if after is not None:
            after.prev = self
        self.prev, self.next = before, after


class Pool:
    """``BlockPool``: the free mapped blocks ordered by (stream, size, address) as
    ``BlockComparatorSize`` orders them, and the unmapped blocks of expandable segments by
    address. One pool serves every stream; a lookup stays inside its stream's run of keys."""

    def __init__(self, small: bool):
        self.small = small
        self.keys: list[tuple[str, int, int]] = []  # sorted (stream, size, ptr) of the free blocks
        self.free: dict[int, Block] = {}           # ptr -> free block
        self.unmapped: dict[int, Block] = {}       # ptr -> unmapped block

    def insert(self, b: Block) -> None:
        bisect.insort(self.keys, (b.stream, b.size, b.ptr))
        self.free[b.ptr] = b

    def remove(self, b: Block) -> None:
        del self.keys[bisect.bisect_left(self.keys, (b.stream, b.size, b.ptr))]
        del self.free[b.ptr]

    def at(self, i: int) -> Block:
        return self.free[self.keys[i][2]]
