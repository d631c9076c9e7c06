"""Deterministic synthetic data: token sequences from a fixed random bigram chain.

A bigram chain has structure a tiny GPT can learn, so losses fall during the few steps the tests
run, and it needs no download. Batch ``step`` is the same whatever N is; rank r reads rows
``[r·mb, (r+1)·mb)`` of it (mb = global batch / N).

Sampling a batch costs more than training it at the tests' sizes (0.1 s for the small model's
64 × 64 tokens: one ``multinomial`` per position, an ``exponential_`` draw over batch × vocab each),
and every run of a given model, seed and batch reads the same batches. So the token matrices are
memoised per process when small (the test and report sizes; a paper-size vocabulary's transition
matrix alone would be gigabytes): a pure function of their arguments, never handed out (each call
slices a fresh copy, as the unmemoised code sliced its own), so two clusters sharing the memo
cannot see each other's writes.
"""
from __future__ import annotations

import functools

import torch


MEMO_BYTES = 1 << 22   # memoise a matrix of at most 4 MiB: the small model's 1024² transitions


def _memoised(nbytes, entries: int):
    """The decorated function memoised (``entries`` results at most) for arguments whose result
    is no larger than MEMO_BYTES (``nbytes(*args)``), computed afresh for larger ones."""
    def wrap(fn):
        memo = functools.lru_cache(maxsize=entries)(fn)

        @functools.wraps(fn)
        def call(*args):
            return memo(*args) if nbytes(*args) <= MEMO_BYTES else fn(*args)
        call.cache_info = memo.cache_info
        return call
    return wrap


@_memoised(lambda vocab_size, seed: 4 * vocab_size * vocab_size, entries=4)
def _transitions(vocab_size: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    # a peaked transition matrix: a few likely successors per token
    return torch.softmax(torch.randn(vocab_size, vocab_size, generator=g) * 3.0, dim=-1)


@_memoised(lambda vocab_size, seq_len, seed, step, global_batch: 8 * global_batch * (seq_len + 1),
           entries=64)
def _tokens(vocab_size: int, seq_len: int, seed: int, step: int, global_batch: int) -> torch.Tensor:
    probs = _transitions(vocab_size, seed)
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    tokens = torch.empty(global_batch, seq_len + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(vocab_size, (global_batch,), generator=g)
    for t in range(seq_len):
        tokens[:, t + 1] = torch.multinomial(probs[tokens[:, t]], 1, generator=g).squeeze(1)
    return tokens


class BigramData:
    def __init__(self, vocab_size: int, seq_len: int, seed: int):
        self.vocab_size = vocab_size
        self.seq_len = seq_len
        self.seed = seed

    @property
    def probs(self) -> torch.Tensor:
        """The chain's transition matrix (vocab × vocab), row t: the next token's distribution."""
        return _transitions(self.vocab_size, self.seed).clone()

    def batch(self, step: int, global_batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets), each (global_batch, seq_len) int64, for training step ``step``;
        fresh tensors on every call."""
        tokens = _tokens(self.vocab_size, self.seq_len, self.seed, step, global_batch).clone()
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    @staticmethod
    def shard(batch: torch.Tensor, rank: int, n_d: int) -> torch.Tensor:
        mb = batch.shape[0] // n_d
        return batch[rank * mb:(rank + 1) * mb]
