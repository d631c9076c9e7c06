"""The caching allocator model's pool boundary (zerospec/runtime/allocator.py): which pool a
request of about 1 MiB is served from, worked out by hand from c10/cuda/CUDACachingAllocator.cpp.

``get_pool`` sends a request to the small pool when ``size <= kSmallSize`` (1 MiB): the boundary
itself is small. MiB = 2^20 B.
"""
from __future__ import annotations

from zerospec.runtime.allocator import CachingAllocator

KiB, MiB = 1 << 10, 1 << 20


def test_a_request_of_exactly_1mib_is_small_and_two_of_them_share_one_2mib_segment():
    """1 MiB <= kSmallSize: the small pool, whose segment is 2 MiB, split 1 + 1 (a small block
    keeps any remainder >= 512 B); a second 1 MiB takes the free half. One 2 MiB segment holds
    both. (From the large pool, the 1 MiB remainder is not > 1 MiB: no split, 2 MiB allocated.)"""
    a = CachingAllocator()
    a.malloc(MiB)
    assert a.segments() == [[(MiB, True), (MiB, False)]]
    a.malloc(MiB)
    assert (a.allocated, a.reserved) == (2 * MiB, 2 * MiB)
    assert a.segments() == [[(MiB, True), (MiB, True)]]


def test_a_request_512_bytes_past_1mib_is_large_and_its_remainder_serves_no_small_request():
    """1 MiB + 512 B > kSmallSize: the large pool, a 20 MiB segment (requests of 1–10 MiB), split
    as the remainder (19 MiB − 512 B) is > 1 MiB. That remainder is the large pool's: a 1 KiB
    request (small) cannot use it and cudaMallocs a 2 MiB small segment of its own."""
    a = CachingAllocator()
    a.malloc(MiB + 512)
    assert a.segments() == [[(MiB + 512, True), (19 * MiB - 512, False)]]
    a.malloc(KiB)
    assert a.segments() == [[(MiB + 512, True), (19 * MiB - 512, False)],
                            [(KiB, True), (2 * MiB - KiB, False)]]
    assert (a.allocated, a.reserved) == (MiB + 512 + KiB, 22 * MiB)
