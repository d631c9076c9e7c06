"""P_a and P_a+cpu without model parallelism, as DeepSpeed runs them (zerospec/zero_r/partition.py):
P_a over a group of one keeps the whole checkpoint on the device and sends nothing; P_a+cpu, and
cpu_checkpointing without P_a (DeepSpeed's ``elif CPU_CHECKPOINT`` branch, at any N_m), keep the
whole checkpoint on the host and none on the device. Values only move: every bit equals the run
without them. The expected bytes come from the run without the feature, and from b·s·d.
"""
from __future__ import annotations

import pytest

from tests.support.runs import assert_same_training, cached, stage_id
from zerospec.model.gpt import GPTConfig
from zerospec.training.config import TrainConfig
from zerospec.training.run import train
from zerospec.training.scale import measure

M = GPTConfig(vocab_size=37, block_size=12, n_layer=2, n_head=4, n_embd=20, vocab_divisor=1)
STEPS = 2
VARIANTS = {"P_a": {"partition_activations": True},
            "P_a+cpu": {"partition_activations": True, "cpu_checkpointing": True},
            "cpu_checkpointing": {"cpu_checkpointing": True}}


def run(stage: int = 0, n_d: int = 2, n_m: int = 1, **kw):
    cfg = TrainConfig.of(stage=stage, n_d=n_d, n_m=n_m, model=M, steps=STEPS,
                         checkpoint_activations=1, **kw)
    return cached(("threads", cfg, None), lambda: train(cfg))


def collectives(r, rank: int) -> list:
    """The rank's collectives in order, less their sequence numbers (host copies take some)."""
    return [(x.op, x.numel, x.group, x.phase, x.step) for x in r.comm.records(rank)
            if x.group != "host"]


def checkpoint_bytes(r) -> int:
    """A rank's checkpoints at the end of forward: one b·s·d fp32 block input per block."""
    return M.n_layer * r.config.batch // r.config.n_d * M.block_size * M.n_embd * 4


def _grid():
    """Every stage with P_a+cpu, and stage 0 (whose runs the ledger tests read) with each variant,
    in the default run; the other variants at stages 1-3 in the slow set."""
    for stage in range(4):
        for name in VARIANTS:
            slow = stage > 0 and name != "P_a+cpu"
            yield pytest.param(stage, name, id=f"{stage_id(stage)}-{name}",
                               marks=[pytest.mark.slow] if slow else [])


@pytest.mark.claim("P11")
@pytest.mark.parametrize("stage,variant", _grid())
def test_p_a_and_cpu_checkpointing_without_mp_change_no_bit(stage, variant):
    """At N_m = 1, P_a, P_a+cpu and cpu_checkpointing alone recompute from the same values: every
    loss and fp32 master weight equals the checkpointed run without them, at every stage."""
    assert_same_training(run(stage), run(stage, **VARIANTS[variant]))


@pytest.mark.claim("C32")
def test_p_a_at_n_m_1_keeps_the_whole_checkpoint_on_the_device_and_sends_nothing():
    """A partition over a group of one is the whole checkpoint (DeepSpeed's mp_size 1): the
    device's checkpoint peak is the run's without P_a, b·s·d per block; no collective is added,
    no byte crosses the host link."""
    plain, pa = run(), run(partition_activations=True)
    for rank in range(2):
        assert pa.memory[rank].peak["checkpoints"] == plain.memory[rank].peak["checkpoints"] \
            == checkpoint_bytes(plain)
        assert pa.host[rank].peak.get("checkpoints", 0) == 0
    assert pa.comm.records(0) == plain.comm.records(0)


@pytest.mark.claim("C35")
@pytest.mark.parametrize("variant", ["P_a+cpu", "cpu_checkpointing"])
def test_checkpoints_on_the_host_without_mp_leave_none_on_the_device(variant):
    """P_a+cpu at N_m = 1, and cpu_checkpointing alone: 0 checkpoint bytes on the device, the
    whole checkpoints on the host (what the device holds without them), freed by the step's end;
    the rank's host link carries each out and back once per step, and nothing else is sent."""
    plain, cpu = run(), run(**VARIANTS[variant])
    for rank in range(2):
        whole = plain.memory[rank].peak["checkpoints"]
        assert whole == checkpoint_bytes(plain)
        assert cpu.memory[rank].peak["checkpoints"] == 0
        assert cpu.host[rank].peak["checkpoints"] == whole
        assert cpu.host[rank].current["checkpoints"] == 0
        for step in range(1, STEPS + 1):
            link = cpu.comm.records(rank, group="host", step=step)
            assert sum(x.bytes_sent + x.bytes_recv for x in link) == 2 * whole
        assert collectives(cpu, rank) == collectives(plain, rank)


@pytest.mark.claim("C35")
def test_cpu_checkpointing_without_p_a_under_mp_moves_whole_checkpoints_and_gathers_nothing():
    """cpu_checkpointing without P_a on a 2 × 2 grid (DeepSpeed's elif CPU_CHECKPOINT branch):
    each MP rank's host holds the whole checkpoints, not 1/N_m of them, the device none, and no
    all-gather rebuilds them; with P_a too, the host holds 1/N_m. Every bit equals the plain run."""
    plain = run(n_d=2, n_m=2)
    whole_cpu = run(n_d=2, n_m=2, cpu_checkpointing=True)
    part_cpu = run(n_d=2, n_m=2, partition_activations=True, cpu_checkpointing=True)
    assert_same_training(plain, whole_cpu)
    for rank in range(4):
        whole = plain.memory[rank].peak["checkpoints"]
        assert whole == checkpoint_bytes(plain) and whole_cpu.memory[rank].peak["checkpoints"] == 0
        assert whole_cpu.host[rank].peak["checkpoints"] == whole
        assert part_cpu.host[rank].peak["checkpoints"] * 2 == whole
        assert whole_cpu.comm.records(rank, op="all_gather", group="mp") == []
        assert len(part_cpu.comm.records(rank, op="all_gather", group="mp")) == M.n_layer * STEPS


@pytest.mark.parametrize("variant", ["P_a", "P_a+cpu"])
def test_a_meta_step_books_what_the_threads_book(variant):
    """measure() runs the same keeper on meta tensors: at N_m = 1 its rank's device and host
    ledgers hold, snapshot for snapshot, what the thread run's rank 0 holds."""
    cfg = TrainConfig.of(stage=2, n_d=2, model=M, steps=1, checkpoint_activations=1,
                         **VARIANTS[variant])
    threads = train(cfg.replace(device="meta", global_batch=2))   # measure: 1 sequence a rank
    meta = measure(cfg)
    assert meta.memory(0).snapshots == threads.memory[0].snapshots
    assert meta.host(0).peak.get("checkpoints", 0) == threads.host[0].peak.get("checkpoints", 0)
    assert meta.comm_ledger().records(0) == threads.comm.records(0)
    if variant == "P_a+cpu":
        assert meta.memory(0).peak["checkpoints"] == 0 < meta.host(0).peak["checkpoints"]


def test_zerospec_train_takes_p_a_and_cpu_checkpointing_without_mp(capsys):
    """`zerospec train --ranks 2 --checkpoint-activations 1 --partition-activations
    --cpu-checkpointing` runs (no MP needed), and so does --cpu-checkpointing alone; the header
    names each."""
    from tests.support.cli import run_cli
    rc, out, err = run_cli(capsys, "train", "--steps", "1", "--ranks", "2",
                           "--checkpoint-activations", "1", "--partition-activations",
                           "--cpu-checkpointing")
    assert rc == 0 and "P_a+cpu" in out, err
    rc, out, err = run_cli(capsys, "train", "--steps", "1", "--ranks", "2",
                           "--checkpoint-activations", "1", "--cpu-checkpointing")
    assert rc == 0 and "checkpoints on the host" in out, err
