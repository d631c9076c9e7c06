"""The caching allocator model's expandable segments (``expandable_segments:True``), a part of
:class:`zerospec.runtime.allocator.CachingAllocator`: one segment per stream and pool reserves
address space and maps it in pages (``ExpandableSegment`` and ``find_expandable_block``,
``map_block``, ``unmap_block`` in ``c10/cuda/CUDACachingAllocator.cpp``, commit 001074d2).
"""
from __future__ import annotations

from .segments import ADDRESS_SPACE, LARGE_BUFFER, SMALL_BUFFER, Block, Pool, Segment


class ExpandableSegments:
    """The methods of the allocator that map and unmap the pages of expandable segments; they
    read the allocator's ``capacity``, ``reserved``, ``_stream`` and ``_next_ptr``."""

    def _try_allocate_expandable_block(self, pool: Pool, size: int) -> Block | None:
        """``try_allocate_expandable_block``: map pages until a free run of ``size`` bytes exists
        (a free block, then the unmapped space after it); mapping past the capacity fails."""
        block = self._find_expandable_block(pool, size)
        if not block.mapped and not self._map_block(block, min(block.size, size), pool):
            return None
        while block.size < size:     # free -> unmapped: map some of the next, which absorbs it
            after = block.next
            if not self._map_block(after, min(size - block.size, after.size), pool):
                return None
            block = after
        pool.remove(block)
        return block

    def _find_expandable_block(self, pool: Pool, size: int) -> Block:
        """``find_expandable_block``: the lowest unmapped range (with the free block before it)
        whose run of unallocated blocks holds ``size``; else a new segment's whole reserve
        (1 1/8 of the device's memory, in 2 MiB (small) or 20 MiB (large) pages)."""
        def room(b: Block | None) -> int:
            total = 0
            while total < size and b is not None and not b.allocated:
                total, b = total + b.size, b.next
            return total
        for ptr in sorted(p for p, b in pool.unmapped.items() if b.stream == self._stream):
            b = pool.unmapped[ptr]
            if b.prev is not None and not b.prev.allocated:
                b = b.prev
            if room(b) >= size:
                return b
        page = SMALL_BUFFER if pool.small else LARGE_BUFFER
        reserve = ADDRESS_SPACE if self.capacity is None else self.capacity + self.capacity // 8
        segment = Segment(self._next_ptr, -(-reserve // page) * page, page, self._stream)
        self._next_ptr += segment.size
        block = Block(segment.base, segment.size, pool.small, mapped=False, segment=segment,
                      stream=self._stream)
        pool.unmapped[block.ptr] = block
        return block

    def _map_block(self, block: Block, size: int, pool: Pool) -> bool:
        """``map_block`` / ``ExpandableSegment::map``: back the first ``size`` bytes (whole pages)
        of an unmapped block; the rest stays unmapped. All or nothing, like cuMemCreate's OOM."""
        seg = block.segment
        mapped = -(-size // seg.page) * seg.page
        if self.capacity is not None and self.reserved + mapped > self.capacity:
            return False
        del pool.unmapped[block.ptr]
        block.mapped = True
        if mapped < block.size:
            rest = Block(block.ptr + mapped, block.size - mapped, block.small, mapped=False,
                         segment=seg, stream=seg.stream)
            rest.splice(block, block.next)
            pool.unmapped[rest.ptr] = rest
            block.size = mapped
        self._try_merge(block, block.prev, pool)
        self._try_merge(block, block.next, pool)
        pool.insert(block)
        self._reserve(mapped)
        return True

    def _unmap_block(self, block: Block, pool: Pool) -> None:
        """``unmap_block``: unmap the whole pages inside a free block; the partial pages at
        either end stay mapped as free blocks of their own."""
        seg = block.segment
        begin = -(-(block.ptr - seg.base) // seg.page) * seg.page + seg.base
        end = (block.ptr + block.size - seg.base) // seg.page * seg.page + seg.base
        if begin >= end:
            return
        pool.remove(block)
        if begin > block.ptr:
            before = Block(block.ptr, begin - block.ptr, block.small, segment=seg,
                           stream=seg.stream)
            before.splice(block.prev, block)
            pool.insert(before)
        if end < block.ptr + block.size:
            after = Block(end, block.ptr + block.size - end, block.small, segment=seg,
                          stream=seg.stream)
            after.splice(block, block.next)
            pool.insert(after)
        block.ptr, block.size, block.mapped = begin, end - begin, False
        self._try_merge(block, block.prev, pool)
        self._try_merge(block, block.next, pool)
        pool.unmapped[block.ptr] = block
        self.reserved -= end - begin
