"""VirtualCluster pins by default: every rank's thread on the caller's CPU, as the OS reports it."""
from __future__ import annotations

import ctypes
import os

import pytest
import torch

from zerospec import VirtualCluster

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"),
                                reason="the OS has no per-thread CPU affinity")


def _where(ctx) -> tuple[set[int], int]:
    """The kernel's mask for this thread, and the CPU it ran a collective and a matmul on."""
    ctx.comm.all_reduce(torch.ones(1024))
    torch.randn(256, 256) @ torch.randn(256, 256)
    return os.sched_getaffinity(0), ctypes.CDLL(None).sched_getcpu()


def test_every_rank_runs_on_one_cpu_and_the_caller_keeps_its_own():
    """By default each rank's thread is confined to one CPU, the same for all ranks and one the
    caller may use, and it ran there; the caller's own mask is left as it was."""
    before = os.sched_getaffinity(0)
    seen = VirtualCluster(8).run(_where)
    masks, cpus = [m for m, _ in seen], {c for _, c in seen}
    assert len(masks[0]) == 1 and all(m == masks[0] for m in masks), masks
    assert masks[0] <= before and cpus == masks[0]
    assert os.sched_getaffinity(0) == before


def test_pin_false_leaves_the_ranks_where_the_caller_may_run():
    """pin=False: each rank's thread keeps the caller's mask (the OS places it)."""
    before = os.sched_getaffinity(0)
    assert all(m == before for m, _ in VirtualCluster(4, pin=False).run(_where))


@pytest.mark.parametrize("kwargs, match", [
    ({"pin": 1}, "pin must be True, False or None, got 1"),
    ({"pin": True, "torch_threads": 2}, "needs torch_threads=1, got torch_threads=2; pass pin=False"),
    ({"pin": True, "torch_threads": None}, "needs torch_threads=1, got torch_threads=None")])
def test_pinning_needs_a_bool_and_one_torch_thread(kwargs, match):
    """A non-bool pin, or pinning with more than one intra-op thread per rank, is refused by name."""
    with pytest.raises(ValueError, match=match):
        VirtualCluster(2, **kwargs)


@pytest.mark.parametrize("pin", [None, False])
def test_more_torch_threads_run_unpinned(pin):
    """With torch_threads=2 the default, like pin=False, leaves the ranks' masks as the caller's
    (their OpenMP teams are not confined to one CPU)."""
    before = os.sched_getaffinity(0)
    seen = VirtualCluster(2, torch_threads=2, pin=pin).run(lambda ctx: os.sched_getaffinity(0))
    assert seen == [before, before]
