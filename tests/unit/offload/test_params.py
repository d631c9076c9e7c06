"""ZeRO-Infinity's parameters (zerospec/offload/params.py): fetches through one host staging
buffer; checkpoints of parameters on NVMe or on their owners."""
from __future__ import annotations

import pytest
import torch

from tests.support.runs import assert_same_training
from zerospec.cluster.threads import VirtualCluster
from zerospec.model.gpt import ODD
from zerospec.runtime.observe import Observer
from zerospec.training import checkpoint
from zerospec.training.config import TrainConfig
from zerospec.training.run import initial_weights, make_batches, train
from zerospec.training.step import rank_main

N = 4


def _host_seen(c):
    """Each rank's host-side observation of a run of ``c`` (the storages made in host memory)."""
    units, seen = c.units(), {}

    def body(ctx, *args):
        with Observer(ctx, side="host") as o:
            out = rank_main(ctx, *args)
        seen[ctx.rank] = o.observation
        return out

    VirtualCluster(N).run(body, c, units, initial_weights(c, units), make_batches(c))
    return seen


@pytest.mark.slow
def test_nvme_parameter_reads_land_in_one_staging_buffer_of_the_largest_unit():
    """offload_buffer_elements = the largest chunk: every NVMe read of a parameter chunk lands in
    that one host buffer (the host ledger's "buffer", allocated once): the host observer sees no
    storage born in step 2's forward, where a buffer per fetch shows one; the run is stage 3's
    bit for bit, the bytes on the links unchanged."""
    base = TrainConfig(stage=3, n_d=N, model=ODD, steps=2)
    big = max(u.chunk for u in base.units())
    kw = dict(stage=3, n_d=N, model=ODD, steps=2, offload_optimizer="cpu", offload_params="nvme")
    plain, staged = TrainConfig.of(**kw), TrainConfig.of(**kw, offload_buffer_elements=big)
    r = train(staged)
    assert_same_training(r, train(base))
    assert [r.host[k].peak["buffer"] for k in range(N)] == [2 * big] * N
    for label, c in (("plain", plain), ("staged", staged)):
        for o in _host_seen(c).values():
            grew = o.peaks["forward@2"].bytes - o.entries["forward@2"].bytes
            assert (grew == 0) == (label == "staged"), (label, grew)
    p = train(plain)
    assert all(r.comm.link_bytes(k, step=2, link="nvme") == p.comm.link_bytes(k, step=2, link="nvme")
               for k in range(N))


@pytest.mark.parametrize("params, partition, buffer", [
    ("nvme", "owner", False),
    pytest.param("nvme", "bandwidth", False, marks=pytest.mark.slow),
    pytest.param("nvme", "bandwidth", True, marks=pytest.mark.slow),
    pytest.param("cpu", "owner", False, marks=pytest.mark.slow)],
    ids=["nvme-owner", "nvme-bandwidth", "nvme-staged", "cpu-owner"])
def test_a_checkpoint_of_offloaded_parameters_resumes_bit_identically(tmp_path, params, partition,
                                                                       buffer):
    """Parameters in swap files or whole on their owners: step 1's checkpoint holds what stage
    3's holds, tensor for tensor, and resuming from it gives the uninterrupted run's losses and
    masters bit for bit (save reads the fp16 chunks where they live, resume writes them back)."""
    kw = dict(stage=3, n_d=N, model=ODD, steps=3, offload_optimizer="cpu", offload_params=params,
              offload_partition=partition)
    if buffer:
        kw["offload_buffer_elements"] = max(u.chunk for u in TrainConfig.of(**kw).units())
    c = TrainConfig.of(**kw)
    whole = train(c)
    train(c, save={1: tmp_path / "ck"})
    train(TrainConfig(stage=3, n_d=N, model=ODD, steps=1), save={1: tmp_path / "ref"})
    got, ref = (checkpoint.load(tmp_path / d) for d in ("ck", "ref"))
    assert all(torch.equal(a, b) for k in checkpoint.KINDS
               for a, b in zip(got.tensors[k], ref.tensors[k]))
    resumed = train(c, resume=checkpoint.load(tmp_path / "ck", n_ranks=N))
    assert resumed.losses == whole.losses[1:]
    assert all(torch.equal(resumed.master[k], whole.master[k]) for k in whole.master)
