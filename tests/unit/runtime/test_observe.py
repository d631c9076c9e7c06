"""The memory observer (zerospec/runtime/observe.py): every storage a thread makes, at birth and
death, per phase, attributed to the rank whose thread made it."""
from __future__ import annotations

import threading

import pytest
import torch

from zerospec.cluster.threads import VirtualCluster
from zerospec.runtime.context import RankContext
from zerospec.runtime.memory import MemoryLedger
from zerospec.runtime.observe import Observer


def test_a_storage_counts_from_the_op_that_makes_it_until_it_dies():
    """Peak = the most bytes live at once; a freed tensor stops counting at once."""
    with Observer() as obs:
        a = torch.zeros(100)            # 400 B
        b = torch.zeros(50)             # 200 B: peak 600
        del a
        c = torch.zeros(10)             # 40 B
        assert obs.current == 240
    assert obs.observation.peaks["run"].bytes == 600
    del b, c
    assert obs.current == 0


def test_views_in_place_ops_and_storages_made_before_are_not_new_bytes():
    """Only storages born inside count: a view or an in-place write makes none."""
    x = torch.ones(64)
    with Observer() as obs:
        v = x.view(8, 8)
        v.add_(1)
        x[:4].mul_(2)
    assert obs.current == 0 and obs.observation.peaks["run"].live == ()


def test_another_threads_storages_are_not_seen():
    """Dispatch modes are per thread: an observer sees only its own thread's ops."""
    made = []
    with Observer() as obs:
        t = threading.Thread(target=lambda: made.append(torch.zeros(1000)))
        t.start()
        t.join()
        mine = torch.zeros(10)
    assert obs.observation.peaks["run"].bytes == 40 and made[0].numel() == 1000 and mine.numel()


def test_resizing_a_storage_directly_is_seen_and_torch_is_restored_after():
    """``untyped_storage().resize_(0)`` (no aten op; how stage 3 drops its casts) frees the bytes;
    the observer's patch of it is gone once the last observer leaves."""
    original = torch.UntypedStorage.resize_
    with Observer() as obs:
        a = torch.zeros(100)
        a.untyped_storage().resize_(0)
        assert obs.current == 0
        b = torch.zeros(10)
    assert obs.observation.peaks["run"].bytes == 400 and b.numel() == 10
    assert torch.UntypedStorage.resize_ is original


def test_without_peaks_it_still_follows_every_birth_resize_and_death():
    """``record_peaks=False`` (what a storage trace uses) keeps ``current`` exact through births,
    direct resizes and deaths, and refuses to report peaks it never recorded."""
    with Observer(record_peaks=False) as obs:
        a = torch.zeros(100)            # 400 B
        b = torch.zeros(50)             # 200 B
        assert obs.current == 600
        a.untyped_storage().resize_(0)
        assert obs.current == 200
        a.untyped_storage().resize_(40)
        assert obs.current == 240
        del a
        assert obs.current == 200
    del b
    assert obs.current == 0
    with pytest.raises(RuntimeError, match="record_peaks=False"):
        obs.observation


def test_meta_tensors_are_counted_by_their_size():
    """Meta storages have no memory but a size: paper-scale runs are observed without allocating."""
    with Observer() as obs:
        t = torch.empty(1000, 1000, device="meta", dtype=torch.float16)
    assert obs.observation.peaks["run"].bytes == 2_000_000 and t.is_meta


def test_paused_hides_what_is_made_inside():
    """What the simulator makes while moving every rank's data is nobody's."""
    with Observer() as obs:
        with obs.paused():
            a = torch.zeros(100)
        b = torch.zeros(1)
    assert obs.observation.peaks["run"].bytes == 4 and a.numel() == 100 and b.numel() == 1


def test_in_place_and_out_writes_are_counted_per_ledger_category():
    """Elements written per phase and category: an in-place op and an ``out=`` argument each count
    the elements of the tensor written."""
    ctx = RankContext(0, 1, MemoryLedger(), None)
    with Observer(ctx) as obs:
        with ctx.phase("step"):
            m = ctx.memory.alloc("master32", (10,), torch.float32)
            m[:4].sub_(1.0)
            torch.mul(m, 2.0, out=m)
            tmp = torch.ones(3)
            tmp.mul_(3)
    assert obs.observation.written["step@0"] == {"master32": 4 + 10, None: 3}


def test_peaks_carry_the_ledgers_category_of_each_live_storage_and_phase_entries():
    """Phase labels are the ledger's (``forward@0``); a storage the ledger allocates counts under
    its category even at the instant it is made (the ledger takes it right after)."""
    ctx = RankContext(0, 1, MemoryLedger(), None)
    with Observer(ctx) as obs:
        with ctx.phase("setup"):
            p = ctx.memory.alloc("param16", (10,), torch.float16)       # 20 B
        with ctx.phase("forward"):
            t = torch.ones(5)                                            # 20 B, not in the ledger
    o = obs.observation
    assert o.peaks["setup@0"].ledger_bytes == o.peaks["setup@0"].bytes == 20
    assert {(s.category, s.nbytes) for s in o.peaks["forward@0"].live} == {("param16", 20), (None, 20)}
    assert o.entries["forward@0"].bytes == 20 and o.peaks["forward@0"].extras()[0].born == "forward@0"
    assert "NOT IN LEDGER aten.ones.default -> float32[5]" in o.peaks["forward@0"].describe()
    assert p.numel() == 10 and t.numel() == 5


def test_the_virtual_cluster_attributes_each_storage_to_the_rank_that_made_it():
    """``VirtualCluster(n, observe=True)``: rank r's bytes are rank r's; the simulator's reduction
    accumulator, made by whichever rank completes the collective, is no rank's."""
    def fn(ctx):
        with ctx.phase("work"):
            t = torch.ones(100 * (ctx.rank + 1))
            ctx.comm.all_reduce(t[:100], "sum")
        return t.numel()

    cluster = VirtualCluster(3, observe=True)
    cluster.run(fn)
    assert [o.peaks["work@0"].bytes for o in cluster.observed] == [400, 800, 1200]
