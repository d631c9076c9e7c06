"""The torch.distributed backend: torch's collectives behind the unchanged Interconnect protocol."""
from __future__ import annotations

import pytest
import torch

from tests.engine import workers
from zerospec.cluster.threads import VirtualCluster
from zerospec.comm.torch_dist import check_torch_version
from zerospec.cluster.processes import launch


# the default run: one launch of each kind at one size (2 ranks here, 3 below: a size gloo's ring
# chunks do not divide); the slow cases add 4
@pytest.fixture(scope="module", params=[2, pytest.param(4, marks=pytest.mark.slow)],
                ids=lambda n: f"nd={n}")
def gloo(request):
    """(n, per-rank outputs of workers.collectives) on n gloo processes."""
    return request.param, launch(workers.collectives, request.param, timeout=30)


@pytest.mark.parametrize("version", ["2.8.1", "2.8.0+cpu", "1.13.1", "2.0.0a0+git1234"])
def test_torch_older_than_2_9_is_refused_with_the_reason(version):
    """Before 2.9 gloo's reduce_scatter_tensor ignored its op; the backend refuses and says why."""
    with pytest.raises(RuntimeError, match=r"needs torch >= 2\.9, found .*ignored its reduce op"):
        check_torch_version(version)


@pytest.mark.parametrize("version", ["2.9.0", "2.9.1+cu128", "2.13.0+cpu", "3.0.0"])
def test_torch_2_9_and_newer_is_accepted(version):
    """2.9 is the first version whose gloo reduce-scatter honours the op."""
    check_torch_version(version)


def test_each_collective_computes_what_torch_distributed_promises(gloo):
    """Sum, mean, max, reduce-scatter, all-gather (also into its own input), broadcast: by hand."""
    n, outs = gloo
    j = torch.arange(5, dtype=torch.float16)
    for r, o in enumerate(outs):
        # rank r holds 10r + j: the sum over ranks is 10·n(n−1)/2 + n·j
        assert torch.equal(o["all_reduce_sum"], 5 * n * (n - 1) + n * j)
        assert torch.equal(o["all_reduce_mean"], 5 * (n - 1) + j)
        assert torch.equal(o["all_reduce_max"], 10 * (n - 1) + j)
        assert torch.equal(o["reduce_scatter_mean"], torch.full((2,), (n + 1) / 2))  # mean of 1..n
        assert torch.equal(o["all_gather"], torch.arange(n, dtype=torch.float16).repeat_interleave(3))
        assert torch.equal(o["all_gather_aliased"], torch.arange(n, dtype=torch.float32).repeat_interleave(2))
        assert torch.equal(o["broadcast"], torch.full((4,), float(n - 1)))


def test_fp16_reductions_round_once_in_fp32():
    """2048 + 2048 + 0.5 + 2050 = 6148.5 rounds once to 6148; gloo's fp16 sum says 6144."""
    outs = launch(workers.fp16_sums, 4, timeout=30)
    assert all(o["backend"] == 6148.0 for o in outs)
    assert all(o["raw"] == 6144.0 for o in outs)   # why the backend reduces in an fp32 buffer


def test_ledger_books_the_simulators_logical_numbers(gloo):
    """Same calls, same records (op, size, elements, bytes, phase) as on the virtual cluster."""
    n, outs = gloo
    sim = VirtualCluster(n).run(workers.collectives)
    key = lambda x: (x.op, x.numel, x.dtype, x.elements_sent, x.elements_recv, x.bytes_sent, x.phase)
    for r in range(n):
        assert [key(x) for x in outs[r]["records"]] == [key(x) for x in sim[r]["records"]]


def test_wire_figure_doubles_gloo_reduce_scatter_only(gloo):
    """gloo reduce-scatters by all-reducing: 2× the ring model's elements on the wire; nothing else."""
    n, outs = gloo
    for rec in outs[0]["records"]:
        assert rec.wire_elements_sent == rec.elements_sent * (2 if rec.op == "reduce_scatter" else 1)


def test_results_equal_the_simulators(gloo):
    """Every collective's output equals the simulator's, bit for bit (integers: no order effects)."""
    n, outs = gloo
    sim = VirtualCluster(n).run(workers.collectives)
    for r in range(n):
        for k, v in outs[r].items():
            if k != "records":
                assert torch.equal(v, sim[r][k]), k


@pytest.mark.parametrize("n", [3, pytest.param(4, marks=pytest.mark.slow)])
def test_gloo_reduce_scatter_is_the_slice_of_its_all_reduce(n):
    """The measured fact stage parity rests on, raw and through the backend's padded buffers."""
    outs = launch(workers.gloo_orders, n, timeout=30)
    assert all(o["raw_equal"] for o in outs)
    assert all(o["backend_equal"] for o in outs)


@pytest.mark.parametrize("n", [3, pytest.param(4, marks=pytest.mark.slow)])
def test_a_batch_goes_to_gloo_fused_with_the_bits_of_separate_calls(n):
    """Inside a batch, runs of reductions and of all-gathers each go as one gloo call, laid out
    by gloo's ring chunks: every output equals the one of the same call sent alone, bit for bit.
    (That torch sees one c10d call per ``sent_as``: test_peers, through CommDebugMode.)"""
    outs = launch(workers.batched_calls, n, timeout=60)
    for o in outs:
        assert o["differ"] == []
        # what carried each collective: 8 sent alone, then the same 8 in a batch, where the fp32
        # means, the sum, the gather and the fp64 means each go as one call
        assert o["sent_as"] == ["all_reduce", "all_reduce", "reduce_scatter", "all_reduce", "all_gather",
                                "all_reduce", "reduce_scatter", "reduce_scatter",
                                "all_reduce", "", "", "all_reduce", "all_gather", "all_reduce", "", ""]


def test_a_fused_call_gloo_refuses_is_named_and_ends_the_batch():
    """The error names the fused all-reduce (not the gather whose arrival sent it), as a peer
    failure; afterwards no batch is left open: the next reduction is sent and reduced at once."""
    outs = launch(workers.fused_send_fails, 2, timeout=30)
    total = [3.0, 3.0, 3.0]                                        # ranks hold 1 and 2
    for r, o in enumerate(outs):
        for case in ("flushed by the gather", "at the end of the batch"):
            assert o[case].startswith(f"rank {r}: all_reduce((6,), float32, op=mean) on gloo failed")
            assert "injected: gloo refused the call" in o[case]
            assert o[case + ", then"] == total


def test_model_parallel_on_gloo_subgroups_equals_the_simulator():
    """``--ranks 4 --mp 2`` on real processes: the grid's DP and MP groups are gloo subgroups
    (new_group, made in the same order on every process); the same stage code gives the
    simulator's losses and weights bit for bit and books the same ledger, group by group. (At
    N_m = 2: two partials add the same in any order; from 3 on gloo's ring order rounds apart.)"""
    from tests.support.runs import assert_same_training
    from zerospec.cluster.threads import VirtualCluster
    from zerospec.training.config import TrainConfig
    from zerospec.training.sections import MeshOptions, ZeroROptions
    from zerospec.training.run import train, train_processes
    cfg = TrainConfig(stage=3, n_d=2, steps=3, timeout=60,
                      zero_r=ZeroROptions(checkpoint_activations=1, partition_activations=True),
                      mesh=MeshOptions(n_m=2))
    real = train_processes(cfg)
    sim = train(cfg, cluster=VirtualCluster(4, torch_threads=1))
    assert_same_training(sim, real)
    for r in range(4):
        assert [(x.op, x.group, x.numel, x.elements_sent) for x in real.comm.records(r)] == \
               [(x.op, x.group, x.numel, x.elements_sent) for x in sim.comm.records(r)]


def test_rank_processes_import_nothing_while_they_train():
    """The forkserver imports what a rank's step needs (processes.PRELOAD) before it forks, so
    no rank process pays an import of its own: training each stage with activation checkpoints
    (their recompute calls autograd with gradients) imports no module."""
    from zerospec.training.config import TrainConfig
    from zerospec.training.sections import MeshOptions, ZeroROptions
    from zerospec.model.gpt import ODD
    cfgs = [TrainConfig(stage=s, n_d=2, model=ODD, steps=2, timeout=30,
                        zero_r=ZeroROptions(checkpoint_activations=1))
            for s in range(4)]
    assert launch(workers.imports_while_training, 2, cfgs, timeout=30) == [[], []]


def test_the_peers_modules_are_on_the_preload_list_and_exist():
    """Importing the oracles puts the peers' modules on the forkserver's list; every name on it is
    an importable module (the forkserver skips one it cannot import without a word)."""
    import importlib.util

    from zerospec.cluster import processes
    from zerospec.testing.oracles import PEER_MODULES
    assert set(PEER_MODULES) <= set(processes.PRELOAD)
    assert [m for m in processes.PRELOAD if importlib.util.find_spec(m) is None] == []


def test_preload_refuses_what_is_not_a_module_name():
    """processes.preload names the bad entry instead of breaking the forkserver's start later."""
    from zerospec.cluster import processes
    with pytest.raises(ValueError, match=r"non-empty module names, got \[''\]"):
        processes.preload("torch", "")
