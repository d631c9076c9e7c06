"""Stage 3's FSDP2 flavour (zerospec/zero/fsdp2.py): its bytes, from FSDP2's rules written here.

The model: a 3-block GPT-2 (V = 37, T = 12, C = 16, tied head) on N = 3 virtual GPUs, so every
unit pads. Each expected value is the rule's, from the model's shapes: a unit of ``numel``
elements pads to ``padded`` = N·⌈numel/N⌉ and each rank holds ``chunk`` = ⌈numel/N⌉ of it.
"""
from __future__ import annotations

import pytest

from zerospec.cluster.threads import VirtualCluster
from zerospec.model.gpt import GPTConfig
from zerospec.training.config import TrainConfig
from zerospec.training.run import train

N, V, T, C, L = 3, 37, 12, 16, 3
M = GPTConfig(vocab_size=V, block_size=T, n_layer=L, n_head=4, n_embd=C)
EMBED = V * C + T * C                                   # wte, wpe
BLOCK = 2 * 2 * C + (3 * C * C + 3 * C) + (C * C + C) + (4 * C * C + 4 * C) + (4 * C * C + C)
LN_F = 2 * C
ROOT = (EMBED, LN_F)                                    # the root group: embeddings, final norm


def chunk(n: int) -> int:
    return -(-n // N)


def padded(n: int) -> int:
    return N * chunk(n)


UNITS = (EMBED, *[BLOCK] * L, LN_F)
SHARDS = sum(chunk(n) for n in UNITS)                    # elements each rank holds


@pytest.fixture(scope="module")
def run():
    """One step of the flavour in bf16, rank 0's ledger traced."""
    cluster = VirtualCluster(N)
    cluster.memory[0].record_trace()
    return train(TrainConfig.of(stage=3, n_d=N, model=M, steps=1, precision="bf16",
                                flavour="fsdp2"), cluster=cluster)


def at(run, label: str) -> dict[str, int]:
    return run.memory[0].snapshots_by_label()[label][0].current


def test_setup_holds_fp32_parameters_and_adam_states_no_master(run):
    """(4 + 8)·Ψ/N after setup: fp32 shards Adam updates in place, exp_avg, exp_avg_sq."""
    held = {k: v for k, v in at(run, "setup@0").items() if v}
    assert held == {"param32": 4 * SHARDS, "exp_avg": 4 * SHARDS, "exp_avg_sq": 4 * SHARDS}


def test_after_backward_the_fp32_sharded_gradients_make_16_psi_over_n(run):
    """The reduce-scatter outputs stay as the fp32 sharded gradients: (4 + 4 + 8)·Ψ/N, and no
    transient buffer is left."""
    held = {k: v for k, v in at(run, "backward@1").items() if v}
    assert held == {"param32": 4 * SHARDS, "shard_grad32": 4 * SHARDS,
                    "exp_avg": 4 * SHARDS, "exp_avg_sq": 4 * SHARDS}
    assert sum(held.values()) == 16 * SHARDS


def test_forward_ends_with_the_root_and_the_last_block_gathered_in_bf16(run):
    """torchtitan's reshard_after_forward: every block but the last; FSDP2 never reshards the
    root after forward. Unsharded tensors are the parameters' own sizes (no padding), 2 bytes."""
    assert at(run, "forward@1")["gathered"] == 2 * (EMBED + LN_F + BLOCK)


def test_one_fp32_reduce_scatter_input_is_in_flight_at_a_time(run):
    """reduce_scatter_max_input_buffers = 1: the largest group's padded fp32 input, the root's
    units together or one block."""
    assert run.memory[0].peak["rs_buffer"] == 4 * max(sum(padded(n) for n in ROOT), padded(BLOCK))


def test_the_roots_unsharded_gradients_wait_for_the_end_of_backward(run):
    """The root reduce-scatters once, after the embedding's gradient: the final norm's bf16
    gradient is still held while each block's is written."""
    assert run.memory[0].peak["grad16"] == 2 * (BLOCK + LN_F)


def test_all_gather_buffers_follow_fsdp2s_implicit_forward_prefetch(run):
    """In forward a group's flat output is freed at the next group's copy-out: the copy-in (1/N)
    and output of block k beside block k-1's output; in backward one group ahead."""
    def group(*ns):
        return sum(chunk(n) for n in ns), sum(padded(n) for n in ns)
    root_in, root_out = group(*ROOT)
    blk_in, blk_out = group(BLOCK)
    forward = max(root_in + root_out, blk_in + blk_out + root_out, blk_in + 2 * blk_out)
    backward = blk_in + blk_out
    assert run.memory[0].peak["ag_buffer"] == 2 * max(forward, backward)


def test_the_flavour_needs_stage_3():
    """A way of running stage 3: any other stage is refused, naming the value."""
    with pytest.raises(ValueError, match="flavour='fsdp2'.*needs stage 3, got stage=2"):
        TrainConfig.of(stage=2, n_d=N, model=M, flavour="fsdp2")



def held_at_block_gradients(run, category: str) -> list[int]:
    """Rank 0's bytes of ``category`` live as each block's bf16 gradient is written (its trace)."""
    held, live, seen = 0, {}, []
    for e in run.memory[0].trace:
        if e.op == "alloc":
            live[e.key] = e
            held += e.nbytes if e.category == category else 0
            if e.category == "grad16" and e.nbytes == 2 * BLOCK:
                seen.append(held)
        elif e.op == "free":
            gone = live.pop(e.key)
            held -= gone.nbytes if gone.category == category else 0
    return seen


def test_backward_prefetches_the_next_blocks_all_gather(run):
    """_backward_prefetch: while block k's gradient is written, block k−1's flat output is
    already gathered — for every block re-gathered in backward (the last block, kept from
    forward, has no unshard of its own to prefetch from; block 0 has nothing before it)."""
    assert held_at_block_gradients(run, "ag_buffer") == [0] + [2 * padded(BLOCK)] * (L - 2) + [0]


def test_a_block_stays_unsharded_until_its_gradient_is_complete(run):
    """post_backward reshards: when each block's bf16 gradient is written, the block's own
    unsharded parameters are still held beside the root's (not freed at their last use)."""
    assert held_at_block_gradients(run, "gathered") == [2 * (EMBED + LN_F + BLOCK)] * L


@pytest.mark.slow
@pytest.mark.parametrize("kw", [{}, {"grad_accum_steps": 2}, {"gpus_per_node": 4, "hpz": 2},
                                {"offload_optimizer": "cpu", "grad_accum_steps": 2}],
                         ids=["G=1", "G=2", "hpZ h=2", "CPUOffloadPolicy G=2"])
def test_the_observer_sees_the_ledger_and_the_returned_losses_only(kw):
    """At every phase entry of 3 steps, on every rank, every storage the dispatch observer sees
    is the ledger's, or a loss the run returns: fp32, 4 bytes each, as the fp16 runs' (the loss
    is computed in fp32, zerospec/model/gpt.py; tests/support/observed.py counts those; stage 3
    keeps no compute copy)."""
    from tests.support.observed import observed, persistent_extras
    r, obs = observed(3, "odd", 3, precision="bf16", flavour="fsdp2", **kw)
    for rank, o in enumerate(obs):
        # the phases of 3 steps; under CPUOffloadPolicy the step runs on the host (no device op)
        assert len(o.entries) >= (3 if "offload_optimizer" in kw else 4) * 3
        for label, entry in o.entries.items():
            counted = sum(s.nbytes for s in entry.live if s.category is not None)
            assert counted == entry.ledger_bytes, f"rank {rank}: {entry.describe()}"
            assert entry.bytes == entry.ledger_bytes + persistent_extras(r, label), \
                f"rank {rank}: unexplained bytes at the entry of {entry.describe()}"


@pytest.mark.slow   # a traced meta step: ~3 s
def test_compute_reads_the_unsharded_parameters_with_no_copy():
    """FSDP2's autograd uses the unsharded parameters themselves: in the step's storage trace
    (every storage, counted or not) no temporary has a unit's size in bf16 — the paper's stage 3
    makes one, its compute copy, for every use."""
    from zerospec.training.scale import measure

    def copies(**kw):
        cfg = TrainConfig.of(stage=3, n_d=N, model=M, precision="bf16", **kw)
        trace = measure(cfg, trace=True).classes[0].allocations
        return sum(e.op == "alloc" and not e.category and e.nbytes in {2 * n for n in UNITS}
                   for e in trace)
    assert copies(flavour="fsdp2") == 0 < copies()


@pytest.mark.parametrize("k", [0, L], ids=["no checkpoints", "one segment of every block"])
def test_backward_gathers_each_block_it_needs_once(k):
    """Backward all-gathers every block but the last, which stays unsharded from forward (with a
    checkpointed segment of every block too: the recompute reads it), each once: a prefetch never
    gathers a block again that is already unsharded."""
    r = train(TrainConfig.of(stage=3, n_d=N, model=M, steps=1, precision="bf16", flavour="fsdp2",
                             checkpoint_activations=k))
    assert all(r.comm.count(rank, phase="backward", op="all_gather") == L - 1
               for rank in range(N))


def test_one_step_moves_fsdp2s_collectives_in_their_dtypes(run):
    """Forward gathers the root group, then each block, in bf16; backward re-gathers every block
    but the last and reduce-scatters each block's gradient in fp32 as it completes, the root's
    last: 3Ψ less the root and the last block's backward gathers."""
    got = [(x.phase, x.op, str(x.dtype).split(".")[1], x.numel) for x in run.comm.records(0)]
    root = [padded(n) for n in ROOT]                          # embeddings, final norm
    assert got == [*(("forward", "all_gather", "bfloat16", n) for n in root + [padded(BLOCK)] * L),
                   ("backward", "reduce_scatter", "float32", padded(BLOCK)),        # the last block
                   *[("backward", "all_gather", "bfloat16", padded(BLOCK))] * (L - 1),  # prefetched
                   *[("backward", "reduce_scatter", "float32", padded(BLOCK))] * (L - 1),
                   *(("backward", "reduce_scatter", "float32", n) for n in root)]


@pytest.fixture(scope="module")
def accum():
    """One step of G = 2 micro-steps, rank 0's ledger traced."""
    return train(TrainConfig.of(stage=3, n_d=N, model=M, steps=1, precision="bf16",
                                flavour="fsdp2", grad_accum_steps=2))


def test_micro_steps_add_into_one_fp32_sharded_gradient(accum):
    """foreach_reduce adds each later micro-step's output into the fp32 sharded gradient: after
    the second backward (4 + 4 + 8)·Ψ/N still, and at the peak one group's output beside it."""
    held = {k: v for k, v in accum.memory[0].snapshots_by_label()["backward@1"][-1].current.items()
            if v}
    assert held == {"param32": 4 * SHARDS, "shard_grad32": 4 * SHARDS,
                    "exp_avg": 4 * SHARDS, "exp_avg_sq": 4 * SHARDS}
    group = max(chunk(EMBED) + chunk(LN_F), chunk(BLOCK))
    assert accum.memory[0].peak["shard_grad32"] == 4 * (SHARDS + group)


def test_every_micro_step_reduce_scatters(accum):
    """No set_requires_gradient_sync(False) (torchtitan's accumulation): each of the G = 2
    backwards reduce-scatters every block and the root's two units, in fp32."""
    got = [str(x.dtype) for x in accum.comm.records(0) if x.op == "reduce_scatter"]
    assert got == ["torch.float32"] * 2 * (L + 2)


N4, H = 4, 2                                       # hpZ: h = 2 of N = 4 ranks, one node
P4 = N4 * -(-BLOCK // N4)                          # a block's padded unit on 4 ranks


@pytest.fixture(scope="module")
def hpz():
    """One step of the flavour with hpZ (h = 2, N = 4), rank 0's ledger traced."""
    cluster = VirtualCluster(N4, gpus_per_node=N4)
    cluster.memory[0].record_trace()
    return train(TrainConfig.of(stage=3, n_d=N4, model=M, steps=1, precision="bf16",
                                flavour="fsdp2", gpus_per_node=N4, hpz=H), cluster=cluster)


def test_with_hpz_each_resharded_block_keeps_one_hth_of_itself_after_forward(hpz):
    """reshard_after_forward = h: every block but the last keeps 1/h of its padded unit in bf16,
    2·padded/h bytes; the root and the last block stay unsharded as without hpZ."""
    assert at(hpz, "forward@1")["secondary16"] == (L - 1) * 2 * P4 // H
    assert at(hpz, "forward@1")["gathered"] == 2 * (EMBED + LN_F + BLOCK)
    assert at(hpz, "backward@1")["secondary16"] == 0


def test_with_hpz_backward_gathers_each_block_inside_its_h_ranks(hpz):
    """Backward's unshard all-gathers the post-forward shards over the h-rank mesh: one bf16
    gather of the padded block per block but the last."""
    got = [(x.group, str(x.dtype), x.numel) for x in hpz.comm.records(0)
           if x.phase == "backward" and x.op == "all_gather"]
    assert got == [("hpz", "torch.bfloat16", P4)] * (L - 1)


def test_with_hpz_a_post_forward_shard_goes_at_its_blocks_unshard(hpz):
    """to_unsharded frees the post-forward shard after the copy-out: when block k's bf16
    gradient is written the shards of blocks below k are held, its own is gone."""
    held, live, seen = 0, {}, []
    for e in hpz.memory[0].trace:
        if e.op == "alloc":
            live[e.key] = e
            held += e.nbytes if e.category == "secondary16" else 0
            if e.category == "grad16" and e.nbytes == 2 * BLOCK:
                seen.append(held // (2 * P4 // H))
        elif e.op == "free":
            gone = live.pop(e.key)
            held -= gone.nbytes if gone.category == "secondary16" else 0
    assert seen == [L - 1, *range(L - 2, -1, -1)]


def test_exact_sums_are_refused_with_the_flavour():
    """exact_grads asks for zero/exact.py's fp64 sums; the flavour sums in fp32 as FSDP2 does:
    refused, naming the value, before any rank starts."""
    with pytest.raises(ValueError, match="exact_grads=True .* flavour='fsdp2'"):
        TrainConfig.of(stage=3, n_d=N, model=M, precision="bf16", flavour="fsdp2",
                       exact_grads=True)


def test_hpz_over_every_rank_is_a_plain_reshard():
    """h = N: _get_post_forward_mesh_info turns reshard_after_forward = N into True, FSDP2's own
    mesh: no post-forward shard is kept and backward gathers over all N ranks."""
    r = train(TrainConfig.of(stage=3, n_d=2, model=M, steps=1, precision="bf16", flavour="fsdp2",
                             gpus_per_node=2, hpz=2))
    assert r.memory[0].peak.get("secondary16", 0) == 0
    assert {x.group for x in r.comm.records(0) if x.phase == "backward"
            and x.op == "all_gather"} == {"world"}


def test_with_mics_each_gradient_crosses_the_replicas_once_per_micro_step():
    """HSDP's replica all-reduce runs inside each reduce (foreach_reduce), every micro-step:
    with a partition group of 2 of 4 ranks and G = 2, one all-reduce per reduce-scatter — none
    added again at the step's boundary."""
    r = train(TrainConfig.of(stage=3, n_d=4, model=M, steps=1, precision="bf16", flavour="fsdp2",
                             shard_group=2, grad_accum_steps=2))
    ops = [x.op for x in r.comm.records(0) if x.op in ("reduce_scatter", "all_reduce")]
    assert ops.count("all_reduce") == ops.count("reduce_scatter") == 2 * (L + 2)
