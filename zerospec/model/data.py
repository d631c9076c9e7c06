"""Deterministic synthetic data: token sequences from a fixed random bigram chain.

A bigram chain has structure a tiny GPT can learn, so losses fall during the few steps the tests
run, and it needs no download. Batch ``step`` is the same whatever N is; rank r reads rows
``[r·mb, (r+1)·mb)`` of it (mb = global batch / N).
"""
from __future__ import annotations

import torch


class BigramData:
    def __init__(self, vocab_size: int, seq_len: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        # a peaked transition matrix: a few likely successors per token
        self.probs = torch.softmax(torch.randn(vocab_size, vocab_size, generator=g) * 3.0, dim=-1)
        self.vocab_size = vocab_size
        self.seq_len = seq_len
        self.seed = seed

    def batch(self, step: int, global_batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets), each (global_batch, seq_len) int64, for training step ``step``."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        tokens = torch.empty(global_batch, self.seq_len + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(self.vocab_size, (global_batch,), generator=g)
        for t in range(self.seq_len):
            tokens[:, t + 1] = torch.multinomial(self.probs[tokens[:, t]], 1, generator=g).squeeze(1)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    @staticmethod
    def shard(batch: torch.Tensor, rank: int, n_d: int) -> torch.Tensor:
        mb = batch.shape[0] // n_d
        return batch[rank * mb:(rank + 1) * mb]
