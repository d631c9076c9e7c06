"""The fused layout of a batch (zerospec/comm/coalesce.py), without processes: where each element
goes. That gloo then sums every element as it would alone is tests/engine/test_backend.py's."""
from __future__ import annotations

import pytest

from zerospec.comm.coalesce import ring_chunk, rows

CASES = [[20, 36, 4, 8], [139_264, 198_272, 198_272, 256], [7, 0, 5], [3 * 700_001, 12, 9], [1]]
# the 2.1M-element batch costs ~0.2 s a case: the default run tiles it at N = 3 only
LAYOUTS = [pytest.param(c, n, id=f"{'+'.join(map(str, c))}-{n}",
                        marks=[pytest.mark.slow] * (c == [3 * 700_001, 12, 9] and n != 3))
           for c in CASES for n in (2, 3, 4, 8)]


@pytest.mark.parametrize("lengths,n", LAYOUTS)
def test_every_element_lands_once_in_the_row_of_its_ring_chunk(n, lengths):
    """Each buffer's pieces tile it; piece c of a buffer sits in row c; no two pieces overlap."""
    lengths = [-(-x // n) * n for x in lengths]            # the backend pads to a multiple of N
    s, pieces = rows(lengths, n, 4)
    taken = set()
    for length, mine in zip(lengths, pieces):
        k = ring_chunk(length, n, 4)
        assert sum(size for _, _, size in mine) == length
        for a, f, size in mine:
            assert a % k == 0 and f // s == a // k == (f + size - 1) // s
            span = range(f, f + size)
            assert taken.isdisjoint(span)
            taken.update(span)


@pytest.mark.parametrize("n", [2, 3, 4, 8])
@pytest.mark.parametrize("lengths", CASES, ids=lambda c: "+".join(map(str, c)))
def test_gloo_cuts_the_fused_buffer_at_its_rows(n, lengths):
    """S is a row length gloo's ring cuts N·S elements at: one ring chunk per row."""
    s, _ = rows([-(-x // n) * n for x in lengths], n, 4)
    assert ring_chunk(n * s, n, 4) == s


def test_ring_chunks_follow_gloos_segments():
    """≥ 2 segments per rank of ≤ 1 MiB: a 20-element fp32 buffer over 4 ranks is cut every 6
    (not at its shards of 5); 12 MB over 4 ranks takes 3 segments per rank."""
    assert ring_chunk(20, 4, 4) == 6
    assert ring_chunk(24, 4, 4) == 6
    assert ring_chunk(3_000_000, 4, 4) == 750_000          # 12 segments of 250,000
    assert ring_chunk(3_000_001, 4, 4) == 750_003          # 12 of 250,001
