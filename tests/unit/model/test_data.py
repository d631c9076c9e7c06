"""The synthetic data's memo, and the observer's argument walk: fast paths that change nothing."""
from __future__ import annotations

import torch
from torch.utils._pytree import tree_leaves

from zerospec.model import data
from zerospec.model.data import BigramData
from zerospec.runtime.observe import tensors_in


def test_a_memoised_batch_equals_a_fresh_sampling_and_no_caller_can_change_it():
    """Every call returns the uncached sampler's tokens, in tensors of its own."""
    d = BigramData(37, 12, 3)
    tokens = data._tokens.__wrapped__(37, 12, 3, 2, 8)        # sampled anew, no memo
    d.probs.fill_(0)
    first = d.batch(2, 8)
    for t in first:
        t.fill_(0)                                            # a caller writing into its batch
    idx, tgt = d.batch(2, 8)
    assert torch.equal(idx, tokens[:, :-1]) and torch.equal(tgt, tokens[:, 1:])
    assert idx.is_contiguous() and tgt.is_contiguous()
    assert torch.equal(BigramData(37, 12, 3).probs, data._transitions.__wrapped__(37, 3))


def test_a_one_token_batch_is_a_view_of_a_copy_made_for_the_call():
    """Shape (1, 1): inputs and targets are views of one storage, as without the memo (the bytes
    a ledger counts do not change), but of a copy made for this call, not of the memo."""
    d = BigramData(5, 1, 0)
    idx, tgt = d.batch(0, 1)
    assert idx.untyped_storage().data_ptr() == tgt.untyped_storage().data_ptr()
    assert idx.untyped_storage().nbytes() == 2 * 8
    idx.fill_(-1)
    assert d.batch(0, 1)[0].item() >= 0


def test_a_large_matrix_is_not_kept():
    """Above MEMO_BYTES nothing is memoised: a 1100-token vocabulary's transitions (4.8 MB)."""
    before = data._transitions.cache_info().currsize
    BigramData(1100, 2, 0).batch(0, 1)
    assert data._transitions.cache_info().currsize == before


def test_tensors_in_finds_what_pytree_finds_in_an_aten_call():
    """Nested lists and tuples, keyword arguments, None and structseq returns alike."""
    a, b, c, d = (torch.zeros(i + 1) for i in range(4))
    args = (a, [b, None, (c, 2)], 1.5, torch.Size([2, 3]))
    kwargs = {"out": d, "dim": 0}
    want = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    got = tensors_in(args, kwargs)
    assert len(got) == len(want) == 4 and all(x is y for x, y in zip(got, want))
    ret = torch.max(torch.ones(2, 3), dim=1)                  # torch.return_types.max
    assert [x is y for x, y in zip(tensors_in(ret), tree_leaves(ret))] == [True, True]
