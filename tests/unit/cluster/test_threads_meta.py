"""A meta thread cluster answers repeated kernels from the process's meta kernel cache
(zerospec/cluster/threads.py, ``cache_kernels``) and nothing observable changes."""
from __future__ import annotations

import pytest

from zerospec.cluster.threads import VirtualCluster
from zerospec.model.gpt import GPTConfig
from zerospec.runtime import metacache
from zerospec.training.config import TrainConfig
from zerospec.training.run import train

TINY = GPTConfig(vocab_size=37, block_size=12, n_layer=2, n_head=4, n_embd=20)


def _run(cache_kernels: bool):
    cfg = TrainConfig.of(stage=3, n_d=2, model=TINY, steps=1, device="meta", count_flops=True,
                         checkpoint_activations=1)
    cluster = VirtualCluster(2, device="meta", observe=True, cache_kernels=cache_kernels)
    return train(cfg, cluster=cluster), cluster.observed


def test_a_meta_cluster_books_observes_and_counts_the_same_with_the_kernel_cache(monkeypatch):
    """Stage 3 on two meta ranks, one step: memory and communication ledgers, FLOPs, op counts
    and every observer's peaks, entries and writes equal an uncached run's, and the ranks did
    fill the process's table."""
    monkeypatch.setattr(metacache, "KERNELS", {})     # a table this run starts empty
    plain, plain_seen = _run(False)
    assert metacache.KERNELS == {}
    cached, cached_seen = _run(True)
    assert len(metacache.KERNELS) > 0
    for r in range(2):
        assert cached.memory[r].snapshots == plain.memory[r].snapshots, r
        assert cached.comm.records(r) == plain.comm.records(r), r
        assert cached.ranks[r].flops == plain.ranks[r].flops, r
        assert cached.ranks[r].ops == plain.ranks[r].ops, r
    assert cached_seen == plain_seen


def test_meta_is_the_default_and_the_only_device_whose_kernels_are_cached():
    """``cache_kernels=None`` turns the cache on exactly for meta; asking for it on the CPU,
    where kernels compute values no key holds, is refused naming the device."""
    assert VirtualCluster(1, device="meta").cache_kernels is True
    assert VirtualCluster(1).cache_kernels is False
    with pytest.raises(ValueError, match="device must be meta, got 'cpu'"):
        VirtualCluster(1, cache_kernels=True)
    with pytest.raises(ValueError, match="cache_kernels must be True, False or None, got 1"):
        VirtualCluster(1, device="meta", cache_kernels=1)
