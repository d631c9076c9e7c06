"""offload/prefetch.py: the prefetcher follows the first step's fetch order, and a fetch that
departs from it is never served another unit's bytes."""
from __future__ import annotations

import types

import pytest
import torch

from zerospec.offload.prefetch import Prefetching

N, CHUNK = 4, 2


class Hops:
    """What Prefetching stands in front of (HostParams' hops), on plain tensors: unit i's chunk
    on the host is filled with i, so every tensor served says which unit it is."""

    def __init__(self, ctx, n_units: int = 5):
        self.ctx, self.dtype = ctx, torch.float32
        self.units = [types.SimpleNamespace(chunk=CHUNK, padded=N * CHUNK)] * n_units
        self.memory = types.SimpleNamespace(
            alloc=lambda cat, shape, dtype, zero: torch.empty(shape), free=lambda t: None)
        self.comm = types.SimpleNamespace(copy_from_host=lambda dst, src: dst.copy_(src),
                                          all_gather=lambda full, c: full.copy_(c.repeat(N)))

    def is_resident(self, i):        # the stage's hook: no unit persists here
        return False

    def gather_unit(self, i, full, chunk):   # the stage's gather hook (zero/hooks.py)
        return self.comm.all_gather(full, chunk)

    def acquire(self, i):            # a fetch on use, no prefetch
        return torch.full((N * CHUNK,), float(i))

    def _to_host(self, i):
        return torch.full((CHUNK,), float(i))

    def _done_host(self, h):
        pass


class Prefetched(Prefetching, Hops):
    pass


def _traced(order=(0, 1, 2, 3, 4)):
    """A prefetcher whose first step fetched ``order``; now at step 2."""
    ctx = types.SimpleNamespace(step=1)
    p = Prefetched(ctx, offload_prefetch=True)
    for i in order:
        p.acquire(i)
    ctx.step = 2
    return p


def _served_or_refused(p, i):
    """Unit i's fetch: either its own bytes or a RuntimeError naming it — never another unit's."""
    try:
        got = p.acquire(i)
    except RuntimeError as e:
        assert f"unit {i}" in str(e)
        return None
    assert torch.equal(got, torch.full((N * CHUNK,), float(i))), got
    return got


def test_a_step_in_the_traced_order_gets_each_unit_it_asks_for():
    """Step 2 fetches in the first step's order: each fetch is served its own unit's bytes."""
    p = _traced()
    assert all(_served_or_refused(p, i) is not None for i in (0, 1, 2, 3, 4))


@pytest.mark.parametrize("order", [(0, 2), (0, 1, 2, 3, 4, 0)],
                         ids=["skips a unit", "one fetch more"])
def test_a_fetch_that_departs_from_the_trace_is_detected(order):
    """A fetch order that changed after the first step (a unit skipped, a fetch past the trace's
    end) is refused, naming the unit, or served that unit — never the traced one's bytes."""
    p = _traced()
    for i in order[:-1]:
        _served_or_refused(p, i)
    _served_or_refused(p, order[-1])
