"""MemoryLedger: byte-exact current and peak per category, errors for misuse."""
from __future__ import annotations

import pytest
import torch

from zerospec.runtime.memory import MemoryLedger


def test_alloc_counts_numel_times_element_size_and_free_returns_it():
    """A buffer of n fp16 elements is 2n bytes until freed; the peak remembers it."""
    m = MemoryLedger()
    a = m.alloc("param16", (10, 3), torch.float16)
    b = m.alloc("master32", (7,), torch.float32)
    assert (m.current["param16"], m.current["master32"], m.total) == (60, 28, 88)
    m.free(a)
    assert m.current["param16"] == 0 and m.peak["param16"] == 60 and m.peak_total == 88
    assert m.model_states() == 28 and b.dtype == torch.float32


def test_views_share_their_storage_and_are_not_counted_twice():
    """Counting is by storage: a view of a counted tensor cannot be counted again."""
    m = MemoryLedger()
    a = m.alloc("buffer", (8,), torch.float32)
    with pytest.raises(ValueError, match="already counted under 'buffer'"):
        m.track("activations", a[2:])
    m.free(a[2:])           # freeing through a view frees the storage
    assert m.total == 0


def test_unknown_category_is_refused_with_the_accepted_list():
    """Allocating under a category the ledger does not know names the accepted ones."""
    with pytest.raises(ValueError, match=r"unknown memory category 'weights'; accepted: param16"):
        MemoryLedger().alloc("weights", (1,), torch.float16)


def test_freeing_what_was_never_allocated_is_an_error():
    """Nothing is lost silently: a free without an alloc is reported with the tensor's shape."""
    with pytest.raises(ValueError, match=r"never allocated \(shape \(3,\)"):
        MemoryLedger().free(torch.zeros(3))


def test_meta_tensors_are_counted_without_storage():
    """On the meta device bytes are counted from shapes alone (paper-scale models)."""
    m = MemoryLedger("meta")
    m.alloc("grad16", (1 << 30,), torch.float16)
    assert m.current["grad16"] == 2 << 30


def test_snapshots_record_the_state_at_each_marker():
    """snapshot(label) freezes current bytes per category and the running peak."""
    m = MemoryLedger()
    a = m.alloc("gathered", (4,), torch.float16)
    m.snapshot("forward@1")
    m.free(a)
    m.snapshot("backward@1")
    assert [(s.label, s.total, s.peak_total) for s in m.snapshots] == [("forward@1", 8, 8),
                                                                        ("backward@1", 0, 8)]
