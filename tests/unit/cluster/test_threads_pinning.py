"""VirtualCluster pins by default: every rank's thread on one CPU, the caller's or the process's own
(home_cpu), as the OS reports it."""
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


def test_a_home_cpu_takes_the_ranks_there_wherever_the_caller_runs(monkeypatch):
    """``home_cpu(c)``: every pinned cluster of the process runs its ranks on CPU c, not on the
    caller's; one this process may not use, or None, gives the caller's back."""
    from zerospec.cluster import threads
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("one CPU: the home and the caller's are the same")
    monkeypatch.setattr(threads, "_HOME", [None])
    monkeypatch.setattr(threads, "caller_cpu", lambda: allowed[0])   # the caller on the first CPU
    threads.home_cpu(allowed[-1])
    assert {c for _, c in VirtualCluster(3).run(_where)} == {allowed[-1]}
    threads.home_cpu(max(allowed) + 1)
    assert {c for _, c in VirtualCluster(3).run(_where)} == {allowed[0]}
    threads.home_cpu(None)
    assert {c for _, c in VirtualCluster(3).run(_where)} == {allowed[0]}


@pytest.mark.parametrize("cpu", [-1, 1.0, True, "0"])
def test_a_home_cpu_must_be_a_cpu_number(cpu):
    from zerospec.cluster import threads
    with pytest.raises(ValueError, match=f"cpu must be a CPU number >= 0 or None, got {cpu!r}"):
        threads.home_cpu(cpu)


def test_each_xdist_worker_runs_its_ranks_on_a_cpu_of_its_own(monkeypatch):
    """tests/support/scheduling.py: worker k's clusters pin to allowed CPU k (cyclically), so two
    workers' ranks never share a CPU while another idles."""
    from tests.support import scheduling
    from zerospec.cluster import threads
    monkeypatch.setattr(threads, "_HOME", [None])
    allowed = sorted(os.sched_getaffinity(0))
    homes = []
    for worker in range(len(allowed) + 1):
        scheduling._own_cpu(worker)
        homes.append(threads.ranks_cpu())
    assert homes == allowed + allowed[:1]
