"""A model of PyTorch's CUDA caching allocator, to measure fragmentation (C30, C37) on any device.

Built from ``c10/cuda/CUDACachingAllocator.cpp`` (pytorch/pytorch, read at commit 001074d2);
every rule names the C++ function it comes from (``DeviceCachingAllocator::<name>`` unless said).
spec/allocator.md lists the rules with a worked example.

Modelled: 512-byte rounding (``round_size``); a small pool (requests ≤ 1 MiB) and a large pool
(``get_pool``); segment sizes (``get_allocation_size``: 2 MiB small, 20 MiB for 1–10 MiB, else
rounded up to 2 MiB); best fit = the smallest free block ≥ the request, ties by address
(``get_free_block``, ``BlockComparatorSize``); splitting (``should_split``) and merging of free
neighbours, which exist only inside one segment (``free_block``, ``try_merge_blocks``);
``max_split_size`` (``get_free_block``'s oversize rules, ``release_available_cached_blocks``); on a
failed cudaMalloc: release oversize cached blocks, then every unsplit cached segment, then retry,
then OutOfMemory (``malloc``); ``expandable_segments`` (one growing segment per pool, mapped in
pages of 2 MiB (small pool) or 20 MiB (large pool), as ``ExpandableSegment`` and
``find_expandable_block`` do; free pages are unmapped before an OOM).

Streams: each request is made on a stream (``malloc(nbytes, stream)``; default the one stream,
``"default"``), and a block is reused only on the stream it was allocated on: the pool orders
free blocks by (stream, size, address) (``BlockComparatorSize``) and ``get_free_block`` takes the
lower bound only if its stream is the request's; an expandable segment serves one stream
(``find_expandable_block`` walks only the request's stream's unmapped blocks), so each stream
grows a segment of its own per pool. Left out: ``record_stream``, events and ``process_events``
(a freed block is reusable on its stream at once), CUDA graph private pools, ``garbage_collection_threshold`` and
``set_per_process_memory_fraction``, ``roundup_power2_divisions`` (off by default),
free-memory callbacks, IPC. With expandable segments, ``release_available_cached_blocks`` is
skipped (the real one would reach ``release_block``'s assert on an expandable block). The
capacity is all the allocator may reserve: the CUDA context, library workspaces and other
processes take none of it. Addresses are virtual (segments are laid out one after another);
a real cudaMalloc's addresses only change which of two equal-size free blocks best fit takes.
"""
from __future__ import annotations

import bisect

from .expandable import ExpandableSegments
from .segments import (DEFAULT_STREAM, LARGE_BUFFER, MIN_BLOCK_SIZE, NO_LIMIT, SMALL_SIZE, Block,
                       OutOfMemory, Pool, allocation_size, round_size)

__all__ = ["CachingAllocator", "DEFAULT_STREAM", "OutOfMemory", "allocation_size", "round_size"]


class CachingAllocator(ExpandableSegments):
    """One device's caching allocator: ``malloc(nbytes) -> id``, ``free(id)``, and the bytes it
    holds. ``capacity``: the device's bytes (None: unbounded); ``max_split_size``: bytes, ≥ 20 MiB
    (PYTORCH_CUDA_ALLOC_CONF's max_split_size_mb × 2^20); ``expandable_segments``: as that option."""

    def __init__(self, capacity: int | None = None, *, max_split_size: int | None = None,
                 expandable_segments: bool = False):
        if capacity is not None and (not isinstance(capacity, int) or capacity < 1):
            raise ValueError(f"capacity must be a number of bytes >= 1 or None, got {capacity!r}")
        if max_split_size is not None and (not isinstance(max_split_size, int)
                                           or max_split_size < LARGE_BUFFER):
            # CUDAAllocatorConfig::parseMaxSplitSize: "max_split_size_mb too small, must be >= 20"
            raise ValueError(f"max_split_size must be a number of bytes >= {LARGE_BUFFER} "
                             f"(20 MiB) or None, got {max_split_size!r}")
        self.capacity = capacity
        self.max_split = NO_LIMIT if max_split_size is None else max_split_size
        self.expandable = bool(expandable_segments)
        self.pools = {True: Pool(small=True), False: Pool(small=False)}
        self.active: dict[int, Block | None] = {}    # id -> its block (None: a 0-byte request)
        self.allocated = 0        # bytes of allocated blocks: torch.cuda.memory_allocated()
        self.requested = 0        # bytes the program asked for (before rounding)
        self.reserved = 0         # bytes of segments (mapped pages): torch.cuda.memory_reserved()
        self.peak_allocated = self.peak_reserved = 0
        self._next_id = 0
        self._next_ptr = 0
        self._stream = DEFAULT_STREAM   # the request being served's stream (AllocParams::stream)

    # -- the program's side ---------------------------------------------------------------------
    def malloc(self, nbytes: int, stream: str = DEFAULT_STREAM) -> int:
        """``malloc``: a block of at least ``nbytes`` on ``stream``; raises OutOfMemory when none
        can be had."""
        if not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"nbytes must be an integer >= 0, got {nbytes!r}")
        if not isinstance(stream, str) or not stream:
            raise ValueError(f"stream must be a non-empty name, got {stream!r}")
        self._stream = stream
        bid, self._next_id = self._next_id, self._next_id + 1
        if nbytes == 0:              # CUDACachingAllocator::allocate asks malloc only if size != 0
            self.active[bid] = None
            return bid
        size = round_size(nbytes)
        pool = self.pools[size <= SMALL_SIZE]
        block = (self._get_free_block(pool, size)
                 or self._alloc_block(pool, size)
                 or (self._release_available_cached_blocks(pool, size)
                     and self._alloc_block(pool, size))
                 or (self._release_cached_blocks() and self._alloc_block(pool, size)))
        if not block:
            raise OutOfMemory(nbytes, size, allocation_size(size), self.allocated, self.reserved,
                              self.capacity, self.largest_free)
        block = self._alloc_found_block(pool, block, size, self._should_split(block, size))
        block.allocated, block.requested = True, nbytes
        self.allocated += block.size
        self.requested += nbytes
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.active[bid] = block
        return bid

    def free(self, bid: int) -> None:
        """``free``: the block goes back to its pool, merged with its free neighbours."""
        if bid not in self.active:
            raise ValueError(f"free of block id {bid!r}, which is not allocated "
                             f"({len(self.active)} blocks are)")
        block = self.active.pop(bid)
        if block is None:
            return
        block.allocated = False
        self.allocated -= block.size
        self.requested -= block.requested
        pool = self.pools[block.small]
        for neighbour in (block.prev, block.next):          # free_block
            self._try_merge(block, neighbour, pool)
        pool.insert(block)

    def reset_peaks(self) -> None:
        self.peak_allocated, self.peak_reserved = self.allocated, self.reserved

    @property
    def largest_free(self) -> int:
        """``cacheInfo``: the largest free block in the cache (0 if none)."""
        return max((k[1] for p in self.pools.values() for k in p.keys), default=0)

    def segments(self) -> list[list[tuple[int, bool]]]:
        """Each mapped range's blocks in address order, (size, allocated), as
        ``torch.cuda.memory_snapshot()`` lists segments; ordered by address."""
        blocks = [b for b in self.active.values() if b is not None]
        blocks += [b for p in self.pools.values() for b in p.free.values()]
        heads = sorted((b for b in blocks if b.prev is None or not b.prev.mapped),
                       key=lambda b: b.ptr)
        out = []
        for b in heads:
            seg = []
            while b is not None and b.mapped:
                seg.append((b.size, b.allocated))
                b = b.next
            out.append(seg)
        return out

    # -- finding a block ------------------------------------------------------------------------
    def _get_free_block(self, pool: Pool, size: int) -> Block | None:
        """``get_free_block``: the smallest free block >= size on the request's stream
        (lower_bound on (stream, size, address); a block of another stream is never taken)."""
        stream = self._stream
        i = bisect.bisect_left(pool.keys, (stream, size, -1))
        if i == len(pool.keys) or pool.keys[i][0] != stream:
            return None
        if self.expandable:
            # best fit counts an expandable block at what it can grow to (the unmapped rest of
            # its segment after it): take a later block while it could grow less
            def grows_to(b: Block) -> int:
                return b.size + (b.next.size if b.next is not None and not b.next.mapped else 0)
            while (i + 1 < len(pool.keys) and pool.keys[i + 1][0] == stream
                   and grows_to(pool.at(i + 1)) < grows_to(pool.at(i))):
                i += 1
        block = pool.at(i)
        if size < self.max_split <= block.size:        # no oversize block for a smaller request
            return None
        if size >= self.max_split and block.size >= size + LARGE_BUFFER:
            return None                                # an oversize block only within 20 MiB
        pool.remove(block)
        return block

    def _should_split(self, block: Block, size: int) -> bool:
        """``should_split``: small (or expandable) blocks keep a remainder of >= 512 B; large
        ones only a remainder > 1 MiB, and only below max_split_size."""
        remaining = block.size - size
        if block.small or self.expandable:
            return remaining >= MIN_BLOCK_SIZE
        return size < self.max_split and remaining > SMALL_SIZE

    def _alloc_found_block(self, pool: Pool, block: Block, size: int, split: bool) -> Block:
        """``alloc_found_block``: the first ``size`` bytes become the block handed out; the rest
        stays free in the pool, its neighbour in the segment."""
        if not split:
            return block
        rest = block
        block = Block(rest.ptr, size, rest.small, segment=rest.segment, stream=rest.stream)
        block.splice(rest.prev, rest)
        rest.ptr += size
        rest.size -= size
        pool.insert(rest)
        return block

    def _try_merge(self, dst: Block, src: Block | None, pool: Pool) -> int:
        """``try_merge_blocks``: absorb a free neighbour (same mapped state) into ``dst``.
        Neighbours exist only inside a segment: two segments never merge."""
        if src is None or src.allocated or src.mapped != dst.mapped:
            return 0
        if src.mapped:
            pool.remove(src)
        else:
            del pool.unmapped[src.ptr]
        if dst.prev is src:          # [src dst]
            dst.ptr = src.ptr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:                        # [dst src]
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        return src.size

    # -- getting and giving back device memory --------------------------------------------------
    def _alloc_block(self, pool: Pool, size: int) -> Block | None:
        """``alloc_block``: a new segment from cudaMalloc, which fails past the capacity."""
        if self.expandable:
            return self._try_allocate_expandable_block(pool, size)
        alloc_size = allocation_size(size)
        if self.capacity is not None and self.reserved + alloc_size > self.capacity:
            return None
        block = Block(self._next_ptr, alloc_size, pool.small, stream=self._stream)
        self._next_ptr += alloc_size
        self._reserve(alloc_size)
        return block

    def _reserve(self, nbytes: int) -> None:
        self.reserved += nbytes
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def _release_block(self, block: Block, pool: Pool) -> None:
        """``release_block``: cudaFree a whole cached segment."""
        pool.remove(block)
        self.reserved -= block.size

    def _release_available_cached_blocks(self, pool: Pool, size: int) -> bool:
        """``release_available_cached_blocks``: with max_split_size set, cudaFree one oversize
        cached block >= the request, or else the largest oversize ones until as much is freed."""
        if self.max_split == NO_LIMIT or self.expandable:
            return False
        key, stream = max(size, self.max_split), self._stream
        i = bisect.bisect_left(pool.keys, (stream, key, -1))
        if i < len(pool.keys) and pool.keys[i][0] == stream:
            self._release_block(pool.at(i), pool)
            return True
        released, i = 0, i - 1
        while (released < key and i >= 0 and pool.keys[i][0] == stream
               and pool.keys[i][1] >= self.max_split):
            released += pool.keys[i][1]
            self._release_block(pool.at(i), pool)
            i -= 1
        return released >= key

    def _release_cached_blocks(self) -> bool:
        """``release_cached_blocks`` → ``release_blocks``, large pool then small: cudaFree every
        cached block that is a whole segment; unmap the free pages of expandable segments."""
        for pool in (self.pools[False], self.pools[True]):
            for block in [pool.at(i) for i in range(len(pool.keys))]:
                if self.expandable:
                    self._unmap_block(block, pool)
                    if block.prev is None and block.next is None:   # all unmapped: drop it
                        del pool.unmapped[block.ptr]                # release_expandable_segment
                elif block.prev is None and block.next is None:
                    self._release_block(block, pool)
        return True
