"""The FSDP2 flavour with CPUOffloadPolicy (zerospec/zero/fsdp2_offload.py): its bytes on the host
and the device and its copies across PCIe, from FSDP2's rules written here.

The model and rank count are tests/unit/zero/test_fsdp2.py's (a 3-block GPT-2 on N = 3, every
unit padded); its shapes give each expected value: a unit of ``numel`` elements pads to
``padded`` = N·⌈numel/N⌉, each rank holds ``chunk`` = ⌈numel/N⌉ of it.
"""
from __future__ import annotations

import pytest

from tests.support.runs import assert_same_training
from tests.unit.zero.test_fsdp2 import BLOCK, EMBED, LN_F, L, M, N, ROOT, SHARDS, chunk, padded
from zerospec.cluster.threads import VirtualCluster
from zerospec.model.gpt import ODD
from zerospec.training.config import TrainConfig
from zerospec.training.run import train

OFF = dict(stage=3, precision="bf16", flavour="fsdp2", offload_optimizer="cpu")


@pytest.fixture(scope="module")
def run():
    """One step of the flavour under CPUOffloadPolicy, rank 0's device ledger traced."""
    cluster = VirtualCluster(N)
    cluster.memory[0].record_trace()
    return train(TrainConfig.of(n_d=N, model=M, steps=1, **OFF), cluster=cluster)


def at(ledger, label: str) -> dict[str, int]:
    return {k: v for k, v in ledger.snapshots_by_label()[label][-1].current.items() if v}


def test_the_host_holds_the_fp32_shards_their_gradients_and_adams_states(run):
    """(4 + 4 + 8)·Ψ/N on the host once a backward has run (at its peak too: nothing else is
    kept there); the device holds no model state after setup nor after backward."""
    states = {"param32": 4 * SHARDS, "shard_grad32": 4 * SHARDS, "exp_avg": 4 * SHARDS,
              "exp_avg_sq": 4 * SHARDS}
    assert {k: v for k, v in run.host[0].current.items() if v} == states
    assert {k: v for k, v in run.host[0].peak.items() if v} == states
    assert at(run.memory[0], "setup@0") == at(run.memory[0], "backward@1") == {}


def test_the_device_holds_only_gathered_parameters_buffers_and_activations(run):
    """Over the step the device's categories are the unsharded parameters, their bf16 gradients,
    the all-gather and reduce-scatter buffers and activations: no shard, no gradient shard, no
    optimizer state ever."""
    assert {k for k, v in run.memory[0].peak.items() if v} == {
        "gathered", "grad16", "ag_buffer", "rs_buffer", "activations"}


def test_each_unshard_copies_the_fp32_shards_up_before_the_gather(run):
    """all_gather_inputs: each unshard copies its units' fp32 shards host→device (forward: every
    unit; backward: every block but the last, kept from forward), 4 bytes per element."""
    up = [(x.phase, x.numel) for x in run.comm.records(0, op="from_host")]
    assert up == [("forward", chunk(n)) for n in (EMBED, LN_F, *[BLOCK] * L)] + \
        [("backward", chunk(BLOCK))] * (L - 1)
    assert {str(x.dtype) for x in run.comm.records(0, op="from_host")} == {"torch.float32"}


def test_each_reduce_scatter_output_goes_down_once_in_fp32(run):
    """foreach_reduce copies each unit's fp32 reduce-scatter output device→host: every shard
    once per step, blocks last to first, the root's at the end."""
    down = [(str(x.dtype), x.numel) for x in run.comm.records(0, op="to_host")]
    assert down == [("torch.float32", chunk(n)) for n in (*[BLOCK] * L, EMBED, LN_F)]


def test_a_groups_copy_in_is_its_bf16_input_then_each_units_fp32_copy_then_its_output(run):
    """The all-gather's buffers in the order they are made: the group's bf16 input (1/N), each
    unit's fp32 shard copied up (freed once cast), the bf16 output of the padded group; the root
    group's, then the first block's."""
    allocs = [e.nbytes for e in run.memory[0].trace if e.op == "alloc" and e.category == "ag_buffer"]
    root_in = sum(chunk(n) for n in ROOT)
    assert allocs[:7] == [2 * root_in, 4 * chunk(EMBED), 4 * chunk(LN_F),
                          2 * sum(padded(n) for n in ROOT),
                          2 * chunk(BLOCK), 4 * chunk(BLOCK), 2 * padded(BLOCK)]


def test_the_reduce_scatter_output_is_a_device_transient_beside_its_input(run):
    """The fp32 output of the largest group lives on the device beside its fp32 input until its
    parts are down: the rs_buffer peak is 4·(padded + chunk) of a block."""
    assert run.memory[0].peak["rs_buffer"] == 4 * (padded(BLOCK) + chunk(BLOCK))


def test_a_later_micro_steps_gradient_is_added_on_the_host():
    """G = 2: the second micro-step's part is copied down and added into the host's sharded
    gradient, one unit's part at a time: the host's shard_grad32 peaks at 4·(Ψ/N + a block's
    chunk), and the step still copies every shard down per micro-step."""
    r = train(TrainConfig.of(n_d=N, model=M, steps=1, grad_accum_steps=2, **OFF))
    assert r.host[0].peak["shard_grad32"] == 4 * (SHARDS + chunk(BLOCK))
    assert len(r.comm.records(0, op="to_host")) == 2 * (L + 2)


@pytest.mark.parametrize("kw", [{}, {"grad_accum_steps": 2}], ids=["G=1", "G=2"])
def test_offload_moves_bytes_never_values(kw):
    """The flavour with CPUOffloadPolicy trains bit for bit as without it: every loss and fp32
    weight (N = 2, 2 steps; G = 2 adds on the host)."""
    cfg = TrainConfig.of(n_d=2, model=ODD, steps=2, **{**OFF, "offload_optimizer": None}, **kw)
    assert_same_training(train(cfg.replace(offload_optimizer="cpu")), train(cfg))


@pytest.mark.parametrize("kw, match", [
    ({"offload_mode": "deepspeed"}, "offload_mode='deepspeed'.*flavour='fsdp2'"),
    ({"offload_params": "nvme"}, "offload_params='nvme'.*no NVMe tier"),
    ({"offload_params": "cpu", "offload_partition": "owner"}, "offload_partition='owner'"),
], ids=["mode", "nvme params", "owner"])
def test_settings_with_no_meaning_under_cpu_offload_policy_are_refused(kw, match):
    """ZeRO-Offload's and ZeRO-Infinity's choices that CPUOffloadPolicy does not have: refused,
    naming the value, before any rank starts."""
    with pytest.raises(ValueError, match=match):
        TrainConfig.of(n_d=N, model=M, **OFF, **kw)


def test_offloaded_parameters_are_the_same_run():
    """--offload-params cpu under the flavour: CPUOffloadPolicy already keeps the parameters on
    the host, so the run's bytes and copies are those of --offload-optimizer cpu alone."""
    a = train(TrainConfig.of(n_d=N, model=M, steps=1, **OFF))
    b = train(TrainConfig.of(n_d=N, model=M, steps=1, offload_params="cpu", **OFF))
    assert a.memory[0].peak == b.memory[0].peak and a.host[0].peak == b.host[0].peak
    assert [(x.op, x.numel) for x in a.comm.records(0)] == [(x.op, x.numel) for x in b.comm.records(0)]


def test_with_mics_each_all_reduced_output_stays_on_the_device_to_the_end_of_backward():
    """HSDP (MiCS, partition groups of p = 2 of 4 ranks): each group's all-reduced fp32 output
    is held by its group (_all_reduce_state) until the final callback, after its part went down:
    rs_buffer peaks at a group's padded input beside every output reduced so far (blocks last to
    first, the root's last), and nothing is left after backward."""
    p = 2
    c = lambda n: -(-n // p)                                     # noqa: E731  (a chunk over p)
    groups = [[BLOCK]] * L + [list(ROOT)]                        # in backward's order
    held, peaks = 0, []
    for g in groups:
        held += sum(c(n) for n in g)
        peaks.append(sum(p * c(n) for n in g) + held)
    r = train(TrainConfig.of(n_d=4, model=M, steps=1, shard_group=p, **OFF))
    assert r.memory[0].peak["rs_buffer"] == 4 * max(peaks)
    assert at(r.memory[0], "backward@1") == {}


@pytest.fixture(scope="module")
def prefetched():
    """The step of ``run`` with offloaded parameters and --offload-prefetch: FSDP2's explicit
    forward prefetch, each block its next (rank 0's device ledger traced)."""
    cluster = VirtualCluster(N)
    cluster.memory[0].record_trace()
    return train(TrainConfig.of(n_d=N, model=M, steps=1, offload_params="cpu",
                                offload_prefetch=True, **OFF), cluster=cluster)


def at_forward_reshards(ledger) -> list[tuple[int, int]]:
    """(all-gather buffers, everything) held on rank 0's device as forward reshards each block,
    once it has run (its trace, up to the end of forward)."""
    live, ag, total, seen = {}, 0, 0, []
    for e in ledger.trace:
        if e.op == "phase" and e.label.startswith("forward"):
            return seen
        if e.op == "alloc":
            live[e.key] = e
            ag, total = ag + e.nbytes * (e.category == "ag_buffer"), total + e.nbytes
        elif e.op == "free" and e.key in live:
            gone = live.pop(e.key)
            if gone.category == "gathered" and gone.nbytes == 2 * BLOCK:
                seen.append((ag, total))
            ag, total = ag - gone.nbytes * (gone.category == "ag_buffer"), total - gone.nbytes
    return seen


def test_prefetch_holds_the_next_blocks_gather_while_each_block_runs_forward(run, prefetched):
    """set_modules_to_forward_prefetch([next block]): the next block's flat bf16 output (its
    fp32 copy up inside it) is gathered before this block computes, so while every resharded
    block runs forward the device holds exactly one more block output, 2·padded(BLOCK) bytes,
    than with FSDP2's implicit prefetch (its own output, freed at the next copy-out)."""
    plain, early = at_forward_reshards(run.memory[0]), at_forward_reshards(prefetched.memory[0])
    assert [a for a, _ in plain] == [2 * padded(BLOCK)] * (L - 1)
    assert [a for a, _ in early] == [4 * padded(BLOCK)] * (L - 1)
    assert [t - s for (_, s), (_, t) in zip(plain, early)] == [2 * padded(BLOCK)] * (L - 1)


def test_prefetch_moves_the_copies_up_and_the_gathers_earlier_never_their_bytes_or_values(
        run, prefetched):
    """The same copies up, gathers and reduces, in the same order, and the same step bit for
    bit; the forward peak is at its end, after the last block, which prefetches nothing."""
    ops = lambda r: [(x.phase, x.op, x.numel) for x in r.comm.records(0)]
    assert ops(prefetched) == ops(run)
    assert prefetched.memory[0].peak == run.memory[0].peak
    assert prefetched.losses == run.losses      # one step here; two in tests/claims/test_combine
    assert all(prefetched.master[k].equal(run.master[k]) for k in run.master)
