"""The N_d × N_m grid (comm/groups.py) and collectives over its groups on every backend."""
from __future__ import annotations

import pytest
import torch

from zerospec.cluster.threads import VirtualCluster
from zerospec.comm.groups import Grid, Group
from zerospec.runtime.errors import CollectiveError
from zerospec.training.config import TrainConfig
from zerospec.training.sections import MeshOptions, OptimOptions
from zerospec.training.scale import measure
from zerospec.model.gpt import GPTConfig

TINY = GPTConfig(vocab_size=37, block_size=12, n_layer=2, n_head=4, n_embd=20)


def test_mp_groups_are_neighbours_and_dp_groups_stride_by_n_m():
    """rank = dp_index·N_m + mp_index: MP ranks inside a node, DP across (C11's layout)."""
    g = Grid(3, 4)
    assert g.n_ranks == 12
    assert g.mp_group(5) == Group("mp", (4, 5, 6, 7))
    assert g.dp_group(5) == Group("dp", (1, 5, 9))
    assert (g.dp_index(5), g.mp_index(5)) == (1, 1)
    assert [x.ranks for x in g.groups()] == [(0, 4, 8), (1, 5, 9), (2, 6, 10), (3, 7, 11),
                                             (0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11)]


@pytest.mark.parametrize("bad,match", [(dict(n_d=0), "n_d must be an integer >= 1, got 0"),
                                       (dict(n_d=2, n_m=1.5), "n_m must be an integer >= 1, got 1.5")])
def test_a_bad_grid_is_refused_naming_the_value(bad, match):
    with pytest.raises(ValueError, match=match):
        Grid(**bad)


def test_a_rank_outside_the_grid_or_the_group_is_refused():
    with pytest.raises(ValueError, match=r"rank must be in 0..5 \(N_d=3 × N_m=2\), got 6"):
        Grid(3, 2).mp_group(6)
    with pytest.raises(ValueError, match="rank 2 is not in group 'mp'"):
        Group("mp", (0, 1)).index(2)


def _both_groups(ctx):
    dp, mp = ctx.comm.split(Grid(2, 2))
    x = torch.full((4,), float(ctx.rank))
    mp.all_reduce(x)                        # ranks {0,1} and {2,3}
    y = torch.full((4,), float(ctx.rank))
    dp.all_reduce(y)                        # ranks {0,2} and {1,3}
    return x, y, (dp.rank, dp.n_ranks, mp.rank, mp.n_ranks)


@pytest.mark.parametrize("transport", ["direct", "ring"])
def test_collectives_over_groups_reduce_within_the_group_and_are_booked_with_it(transport):
    """Each group sums its own members; the ledger books each with its group and ring size, and
    the ring transport passes chunks only between the group's neighbours."""
    cluster = VirtualCluster(4, transport=transport)
    out = cluster.run(_both_groups)
    for r, (x, y, where) in enumerate(out):
        assert torch.equal(x, torch.full((4,), float(2 * (r // 2) + 2 * (r // 2) + 1)))
        assert torch.equal(y, torch.full((4,), float(r % 2 + r % 2 + 2)))
        assert where == (r // 2, 2, r % 2, 2)
        recs = cluster.comm_ledger.records(r)
        assert [(c.group, c.group_size, c.elements_sent) for c in recs] == [("mp", 2, 4), ("dp", 2, 4)]
    if transport == "ring":
        links = set().union(*(set(w.elements) for w in cluster.wire.records))
        assert links == {(0, 1), (1, 0), (2, 3), (3, 2), (0, 2), (2, 0), (1, 3), (3, 1)}


def test_ranks_waiting_in_collectives_that_cannot_complete_fail_as_a_deadlock_not_a_hang():
    """Ranks 0, 3 enter their MP groups, ranks 1, 2 their DP groups: each waits for a peer that
    waits elsewhere (0→1→3→2→0), so the cluster raises at once naming them, not at the timeout."""
    def body(ctx):
        dp, mp = ctx.comm.split(Grid(2, 2))
        t = torch.zeros(2)
        (mp if ctx.rank in (0, 3) else dp).all_reduce(t)
    with pytest.raises(CollectiveError, match="deadlock"):
        VirtualCluster(4, timeout=30).run(body)


def test_a_rank_that_returns_fails_only_the_groups_it_belongs_to():
    """Ranks 2, 3 finish at once; ranks 0, 1 then all-reduce in their own MP group: no error."""
    def body(ctx):
        _, mp = ctx.comm.split(Grid(2, 2))
        if ctx.rank < 2:
            mp.all_reduce(torch.ones(3))
        return ctx.rank
    assert VirtualCluster(4).run(body) == [0, 1, 2, 3]


@pytest.mark.parametrize("kw,match", [
    (dict(n_m=3), "n_m=3 must divide n_head=4"),
    (dict(n_m=2, partition_activations=True), "partition_activations=True: P_a splits .*needs "
     "checkpoint_activations >= 1 or an activation_checkpointing mode, got checkpoint_activations=0"),
    (dict(cpu_checkpointing=True), "cpu_checkpointing=True: P_a\\+cpu keeps .*got "
     "checkpoint_activations=0"),
])
def test_model_parallel_configs_that_cannot_run_are_refused_naming_the_values(kw, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig.of(model=TINY, n_d=2, **kw)


@pytest.mark.parametrize("stage", [0, 3])
def test_meta_representatives_give_every_rank_s_ledgers_of_the_thread_grid(stage):
    """On the 3 × 2 grid with P_a+cpu, MP index 0 of each DP class stands for its MP peers:
    every rank's comm records (groups, host link) and memory snapshots equal the threads'."""
    from zerospec.training.run import train
    kw = dict(checkpoint_activations=1, partition_activations=True, cpu_checkpointing=True)
    full = train(TrainConfig.of(stage=stage, n_d=3, n_m=2, model=TINY, steps=1, global_batch=3,
                                device="meta", **kw))
    scaled = measure(TrainConfig.of(stage=stage, n_d=3, model=TINY, n_m=2, **kw))
    comm = scaled.comm_ledger()
    for r in range(6):
        assert full.comm.records(r) == comm.records(r), r
        assert scaled.memory(r).snapshots == full.memory[r].snapshots, r
    assert {c.group for c in comm.records()} == {"dp", "mp", "host"}


@pytest.mark.parametrize("argv,named", [
    (["--ranks", "4", "--mp", "3"], "--ranks 4 must be a multiple of --mp 3"),
    (["--ranks", "4", "--mp", "0"], "'0'"),
    (["--ranks", "4", "--partition-activations"], "got checkpoint_activations=0"),
    (["--ranks", "4", "--mp", "2", "--cpu-checkpointing"], "cpu_checkpointing=True")])
def test_zerospec_train_refuses_a_grid_or_p_a_it_cannot_run_in_one_line(capsys, argv, named):
    from tests.support.cli import assert_usage_error
    assert_usage_error(capsys, "train", "--steps", "1", *argv, named=named)


def test_zerospec_train_mp_flags_reach_the_run_and_its_table(capsys):
    """`--ranks 4 --mp 2 … --cpu-checkpointing`: N_d = 2 × N_m = 2, the MP and host-link columns,
    and no checkpoint bytes left on the device."""
    from tests.support.cli import run_cli
    rc, out, _ = run_cli(capsys, "train", "--ranks", "4", "--mp", "2", "--steps", "1",
                         "--model", "small", "--checkpoint-activations", "1",
                         "--partition-activations", "--cpu-checkpointing")
    assert rc == 0 and "N_d = 2 × N_m = 2" in out and "P_a+cpu" in out
    assert "| MP elements | host link bytes |" in out and "checkpoints: 0 B on the device" in out


def test_zerospec_train_mp_with_loss_scaling_and_clipping_runs_and_prints_their_columns(capsys):
    """`--ranks 4 --mp 2 --loss-scale 1024 --clip-grad-norm 0.5`: train()'s run on the 2 × 2
    grid, with the scale, skipped and norm columns; a bad combination is one line, exit 2."""
    from tests.support.cli import assert_usage_error, run_cli
    from zerospec.optim.loss_scale import LossScale
    from zerospec.training.run import train
    rc, out, _ = run_cli(capsys, "train", "--ranks", "4", "--mp", "2", "--steps", "1", "--model",
                         "small", "--loss-scale", "1024", "--clip-grad-norm", "0.5")
    assert rc == 0 and "N_d = 2 × N_m = 2" in out and "| loss scale | skipped | grad norm |" in out
    r = train(TrainConfig(stage=3, n_d=2, steps=1,
                          optim=OptimOptions(loss_scale=LossScale(1024.0), clip_grad_norm=0.5),
                          mesh=MeshOptions(n_m=2)))
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| 1 ")]
    assert len(rows) == 1 and [float(x[-1]) for x in rows] == [float(f"{n:.6g}") for n in r.grad_norms]
    assert_usage_error(capsys, "train", "--ranks", "4", "--mp", "2", "--grad-accum", "2",
                       "--precision", "bf16", "--clip-grad-norm", "0.5", named="need precision='fp16', got 'bf16'")


def test_zerospec_train_md_flags_reach_the_run(capsys):
    """`--contiguous-checkpoints --contiguous-gradients` reach the config (stage 2): the run
    prints its table; on stage 1 the gradient slot is refused in one line."""
    from tests.support.cli import assert_usage_error, run_cli
    rc, out, _ = run_cli(capsys, "train", "--ranks", "2", "--stage", "2", "--steps", "1",
                         "--model", "odd", "--checkpoint-activations", "1",
                         "--contiguous-checkpoints", "--contiguous-gradients")
    assert rc == 0 and "checkpoints: 2,880 B on the device" in out   # 2 blocks × 2·12·15 fp32
    assert_usage_error(capsys, "train", "--stage", "1", "--contiguous-gradients",
                       named="needs stage 2 or 3, got stage=1")


def test_zerospec_scale_measures_a_grid_with_p_a_per_group(capsys):
    """`scale --gpus 8 --mp 2 --checkpoint-activations 1 --partition-activations`: the table
    shows DP and MP traffic and the checkpoints per GPU; --gpus not a multiple of --mp is refused."""
    from tests.support.cli import assert_usage_error, run_cli
    rc, out, _ = run_cli(capsys, "scale", "--layers", "2", "--hidden", "256", "--heads", "2",
                         "--vocab", "64", "--seq", "16", "--gpus", "8", "--mp", "2", "--stages", "3",
                         "--checkpoint-activations", "1", "--partition-activations")
    assert rc == 0 and "N_d = 4 × N_m = 2" in out and "| MP elements /step /GPU |" in out
    row = out.strip().splitlines()[-1].split("|")
    assert row[8].strip() == f"{2 * 16 * 256 * 2 // 2:,}"      # 2 blocks × b·s·d fp16 / N_m
    assert_usage_error(capsys, "scale", "--gpus", "10", "--mp", "3", named="--gpus 10 must be a multiple of --mp 3")
