"""ZeRO-Offload composed with the other features (spec/offload.md, spec/combine.md): gradient
accumulation and exact sums, ZeRO-R's C_B buckets and contiguous gradients, hpZ, MiCS (the
replicas reduce each shard before it leaves the device), qwZ/qgZ, DeepSpeed's ZeRO-3 knobs. Each
run is the same arithmetic on the same values as the run without offload, so every loss and fp32
master weight equals that run's bit for bit (B6); what crosses PCIe is booked per micro-batch.

Runs: the ODD model (units divide by no N, so padding shows) on N = 4 virtual GPUs, 2 steps.
"""
from __future__ import annotations

import dataclasses
import functools

import pytest

from tests.support.runs import assert_same_training
from zerospec.model.gpt import ODD
from zerospec.testing.stale import train_stale
from zerospec.training.config import TrainConfig
from zerospec.training.run import train

N, STEPS = 4, 2
BUCKET = 1000           # elements: several buckets per stream, units split across them


def cfg(stage: int, **kw) -> TrainConfig:
    return TrainConfig.of(stage=stage, n_d=N, model=ODD, steps=kw.pop("steps", STEPS), **kw)


@functools.lru_cache(maxsize=None)
def run(stage: int, **kw):
    return train(cfg(stage, **kw))


# (stage, the feature's settings): the default run's cases; the rest of the grid in SLOW
CASES = [(3, {"grad_accum_steps": 2}), (2, {"bucket_elements": BUCKET}),
         (2, {"contiguous_gradients": True}), (3, {"hpz": 2, "gpus_per_node": 2}),
         (3, {"shard_group": 2, "gpus_per_node": 2})]
SLOW = [(s, kw) for s in (2, 3) for kw in (
    {"grad_accum_steps": 2}, {"exact_grads": True}, {"bucket_elements": BUCKET},
    {"bucket_elements": "model"}, {"grad_accum_steps": 2, "bucket_elements": BUCKET},
    {"contiguous_gradients": True}, {"contiguous_gradients": True, "bucket_elements": BUCKET})
    if (s, kw) not in CASES] + [(3, {"hpz": 2, "gpus_per_node": 2, "grad_accum_steps": 2}),
    (2, {"shard_group": 2, "grad_accum_steps": 2}), (3, {"qgz": True, "gpus_per_node": 2}),
    (3, {"qwz": True}), (3, {"stage3_persistence_threshold": 100,
                             "stage3_max_reuse_distance": 10 ** 6})]


def _id(case) -> str:
    stage, kw = case
    return f"stage{stage}-" + "-".join(f"{k}={v}" for k, v in kw.items())


@pytest.mark.parametrize("case", CASES + [pytest.param(c, marks=pytest.mark.slow) for c in SLOW],
                         ids=_id)
@pytest.mark.claim("B6")
def test_offload_with_a_feature_trains_bit_identically_to_the_feature_without_offload(case):
    """The host Adam reads the gradient the stage would (an exact fp64 sum under accumulation, a
    bucket's reduction, the contiguous slot's): every loss and master weight equals the run
    without offload bit for bit, in both of offload's modes."""
    stage, kw = case
    for mode in ("paper", "deepspeed"):
        assert_same_training(run(stage, offload_optimizer="cpu", offload_mode=mode, **kw),
                             run(stage, **kw))


@pytest.mark.parametrize("stage", [2, 3])
@pytest.mark.claim("B5")
def test_accumulation_sends_each_micro_batchs_fp64_shard_down_and_the_parameters_up_once(stage):
    """With G micro-batches the host keeps the step's exact sum (DeepSpeed keeps its accumulated
    gradients in host memory): each micro-batch's reduced shard crosses PCIe as fp64, 8 bytes per
    element (an fp64 partial sum of fp16 values is no fp16 value), G times; fp16 parameters go up
    once per step, 2 bytes per element."""
    g = 3
    r = run(stage, offload_optimizer="cpu", grad_accum_steps=g, global_batch=N * g)
    m = sum(u.chunk for u in r.units)
    for rank in range(N):
        down = r.comm.link_bytes(rank, step=2, op="to_host")
        up = r.comm.link_bytes(rank, step=2, op="from_host")
        assert (down, up) == (g * 8 * m, 2 * m)


@pytest.mark.claim("B8")
def test_dpu_with_accumulation_equals_its_stale_reference():
    """The delayed update reads the previous step's exact sum before the next step zeroes it:
    a DPU run with G = 2 has the losses of the stale-by-one reference, bit for bit."""
    base = cfg(3, steps=3, offload_optimizer="cpu", grad_accum_steps=2)
    dpu = train(base.replace(dpu=1))
    assert dpu.losses == train_stale(base, 1).losses


# DeepSpeed's stage-3 knobs with ZeRO-Infinity's parameter offload: ln_f (30 elements) persists
DS3 = {"stage3_persistence_threshold": 100, "stage3_max_reuse_distance": 10 ** 6}
PARAMS = [{"offload_params": "cpu"}, {"offload_params": "cpu", "offload_prefetch": True}] + [
    pytest.param(kw, marks=pytest.mark.slow) for kw in (
        {"offload_params": "nvme"}, {"offload_params": "cpu", "offload_partition": "owner"})]


@pytest.mark.parametrize("where", PARAMS, ids=["cpu", "cpu-prefetch", "nvme", "owner"])
@pytest.mark.claim("C-I8")
def test_deepspeeds_stage3_knobs_with_offloaded_parameters_train_as_without_offload(where):
    """A persistent unit stays whole on the device and a kept unit is not fetched again in
    backward, whatever tier holds the rest: every loss and master weight equals DeepSpeed's
    stage 3 without offload bit for bit (3 steps: the prefetcher follows its trace from step 2)."""
    assert_same_training(run(3, steps=3, offload_optimizer="cpu", **where, **DS3),
                         run(3, steps=3, **DS3))


@pytest.mark.claim("C-I8")
def test_a_persistent_unit_stays_on_the_device_and_the_rest_on_the_host():
    """DeepSpeed allocates a persistent parameter's partition on the local device and never
    releases it (``_partition_param``: ``if param.ds_persist: device = self.local_device``): the
    device ledger holds the persistent units whole, the host ledger every other unit's 1/N
    chunk; param_sync all-gathers only the persistent units, as without offload, and with the
    reuse distance past the model nothing is fetched again in backward."""
    r = run(3, offload_optimizer="cpu", offload_params="cpu", **DS3)
    without = run(3, **DS3)
    persistent = [u for u in r.units if u.numel <= DS3["stage3_persistence_threshold"]]
    assert [u.name for u in persistent] == ["ln_f"]
    for k in range(N):
        assert r.memory[k].current["param16"] == 2 * sum(u.padded for u in persistent)
        assert r.host[k].current["param16"] == 2 * sum(u.chunk for u in r.units
                                                        if u not in persistent)
        sync = [(x.op, x.numel) for x in r.comm.records(k, step=2, phase="param_sync")
                if x.op == "all_gather"]
        assert sync == [(x.op, x.numel) for x in without.comm.records(k, step=2, phase="param_sync")
                        if x.op == "all_gather"] == [("all_gather", u.padded) for u in persistent]
        assert not [x for x in r.comm.records(k, step=2, phase="backward")
                    if x.op in ("from_host", "all_gather")]


# hpZ with ZeRO-Infinity's parameter offload: the secondary shards on the host
HPZ = {"hpz": 2, "gpus_per_node": 2}


@pytest.mark.parametrize("prefetch", [False, True], ids=["fetch-on-use", "prefetch"])
@pytest.mark.claim("D6")
def test_hpz_with_offloaded_parameters_trains_as_hpz_without_offload(prefetch):
    """Backward gathers each unit from the secondary shards forward copied to the host: the bits
    forward gathered, so every loss and master weight equals hpZ's without offload bit for bit."""
    assert_same_training(run(3, steps=3, offload_optimizer="cpu", offload_params="cpu",
                             offload_prefetch=prefetch, **HPZ), run(3, steps=3, **HPZ))


@pytest.mark.claim("D6")
def test_hpzs_secondary_shards_live_on_the_host_with_offloaded_parameters():
    """DeepSpeed allocates ds_secondary_tensor on the offload device (``_partition_param_sec``:
    ``device=self.remote_device``) and moves it to the GPU for the gather: the host holds the
    2Ψ/h of secondary shards, the device one unit's shard at a time; forward copies each unit's
    1/h down once, backward copies it up before each gather inside the node, and nothing
    crosses nodes in backward."""
    r, h = run(3, offload_optimizer="cpu", offload_params="cpu", **HPZ), HPZ["hpz"]
    for k in range(N):
        assert r.host[k].peak["secondary16"] == 2 * r.psi_padded // h
        assert r.memory[k].peak["secondary16"] == 2 * max(u.padded for u in r.units) // h
        down = [x.bytes_sent for x in r.comm.records(k, step=2, phase="forward")
                if x.op == "to_host"]
        assert down == [2 * u.padded // h for u in r.units]
        back = r.comm.records(k, step=2, phase="backward")
        gathers = [x.numel for x in back if x.op == "all_gather"]
        assert gathers and [x.bytes_recv for x in back if x.op == "from_host"] == [
            2 * n // h for n in gathers]
    assert all(r.comm.crossing_bytes(node, phase="backward", op="all_gather") == 0
               for node in range(N // HPZ["gpus_per_node"]))


def test_hpz_with_parameters_on_nvme_is_one_clear_error():
    """DeepSpeed has no NVMe home for the secondary partition: the value is named."""
    with pytest.raises(ValueError, match="hpz=2 with offload_params='nvme'"):
        cfg(3, offload_optimizer="cpu", offload_params="nvme", **HPZ)
