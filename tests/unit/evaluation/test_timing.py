"""The hardware model (zerospec/paper/hardware.py) and the step-time model (zerospec/evaluation/timing.py).

Expected values are the module doc's formulas written out by hand with the spec-sheet numbers.
"""
from __future__ import annotations

import dataclasses
import functools
from collections import Counter
from fractions import Fraction

import pytest
import torch

from zerospec.model.gpt import ODD
from zerospec.model.presets import gpt
from zerospec.paper.hardware import DGX2, GB, H200_NODE, Machine
from zerospec.evaluation import configs
from zerospec.cluster import threads
from zerospec.evaluation.timing import OPTIM_BYTES_PER_PARAM, collective_seconds, group_bandwidth, op_seconds, ops_seconds, step_time
from zerospec.runtime.observe import Observer, written_arguments
from zerospec.runtime.opcount import Op, is_view, unread
from zerospec.training.config import TrainConfig
from zerospec.training.sections import MeshOptions, ZeroROptions
from zerospec.training.run import train
from zerospec.training.scale import measure


# -- where a group sits --------------------------------------------------------------------------------
def test_an_mp_group_inside_a_dgx2_node_runs_at_nvswitch_speed():
    """MP 16 fills one DGX-2 node: every ring link is NVSwitch, 150 GB/s each way."""
    assert group_bandwidth(DGX2, 16, 1) == (150 * GB, False)


def test_an_mp_group_over_two_nodes_is_paced_by_the_node_infiniband():
    """MP 32 (the 40B baseline, C38): the ring leaves the node once, through its 8 × 100 Gbps."""
    assert group_bandwidth(DGX2, 32, 1) == (100 * GB, True)


@pytest.mark.parametrize("n_m,per_gpu", [(1, 100 * GB), (4, 25 * GB), (16, 6.25 * GB)],
                         ids=["MP1", "MP4", "MP16"])
def test_dp_rings_across_nodes_share_the_node_infiniband(n_m, per_gpu):
    """25 DP ranks, one per node at MP 16: the node's 16 GPUs each run a DP ring through the same
    100 GB/s, so each gets 100/16; at MP 4, 4 rings share it; at MP 1 one ring has it all."""
    assert group_bandwidth(DGX2, 400 // n_m, n_m) == (per_gpu, True)


@pytest.mark.parametrize("n,stride,per_ring", [(32, 1, 12.5 * GB), (100, 4, 12.5 * GB),
                                               (25, 16, 6.25 * GB), (16, 1, 150 * GB)],
                         ids=["MP32", "DP100-MP4", "DP25-MP16", "MP16-inside"])
def test_read_as_one_infiniband_link_a_ring_leaving_the_node_gets_12_5_gb_s_at_most(n, stride,
                                                                                 per_ring):
    """inter="link" (C42's "12.5 GB/s per link"): a ring that leaves the node runs over one
    100 Gbps NIC at most; rings already sharing the node below that keep their share; a ring
    inside the node keeps NVSwitch."""
    assert group_bandwidth(DGX2, n, stride, "link")[0] == per_ring


def test_an_unknown_infiniband_reading_is_refused_naming_the_accepted_ones():
    """inter is "node" or "link"; anything else is an error naming both."""
    with pytest.raises(ValueError, match=r"inter must be one of \('node', 'link'\), got 'nic'"):
        group_bandwidth(DGX2, 32, 1, "nic")


# -- per collective ------------------------------------------------------------------------------------
def test_an_all_reduce_costs_its_ring_steps_and_its_bytes_over_the_bandwidth():
    """All-reduce of S = 10^9 fp16 elements over MP 16 in a node: 2·15 steps of 5.7 µs after
    8.4 µs, and 2·15/16·2·10^9 bytes at 150 GB/s."""
    sent = 2 * 15 * 10**9 * 2 // 16
    assert collective_seconds(DGX2, "all_reduce", 16, 1, sent) == pytest.approx(
        8.4e-6 + 30 * 5.7e-6 + 3.75e9 / 150e9, rel=1e-12)


def test_a_reduce_scatter_across_nodes_pays_the_network_latency_per_step():
    """Reduce-scatter over 25 DP ranks at MP 16: 24 steps at 6.6 µs, bytes at 6.25 GB/s."""
    assert collective_seconds(DGX2, "reduce_scatter", 25, 16, 10**9) == pytest.approx(
        8.4e-6 + 24 * 6.6e-6 + 1e9 / 6.25e9, rel=1e-12)


def test_a_collective_over_one_rank_costs_nothing_and_a_host_copy_runs_at_pcie_speed():
    """N = 1 moves nothing; P_a+cpu's copies go over the rank's own PCIe Gen3 x16 link."""
    assert collective_seconds(DGX2, "all_reduce", 1, 1, 0) == 0.0
    assert collective_seconds(DGX2, "to_host", 1, 1, 15_750_000_000) == 1.0
    assert collective_seconds(DGX2, "from_host", 1, 1, 0, 31_500_000_000) == 2.0


def test_an_unknown_collective_is_refused_by_name():
    """A collective the model has no formula for is an error naming it and the accepted ones."""
    with pytest.raises(ValueError, match=r"'all_to_all'.*all_reduce"):
        collective_seconds(DGX2, "all_to_all", 4, 1, 10)


# -- the machine ---------------------------------------------------------------------------------------
def test_a_machine_refuses_a_nonpositive_constant_or_an_efficiency_above_one():
    """A Machine is checked when made: the bad field and value are named."""
    with pytest.raises(ValueError, match=r"inter_bytes_per_s must be > 0, got 0"):
        dataclasses.replace(DGX2, inter_bytes_per_s=0)
    with pytest.raises(ValueError, match=r"gemm_efficiency must be in \(0, 1\], got 3/2"):
        dataclasses.replace(DGX2, gemm_efficiency=Fraction(3, 2))


def test_the_dgx2_is_the_papers_cluster_node():
    """C40/C42: 16 GPUs of 32 GB, 125 TFLOPS fp16, 8 × 100 Gbps per node, NVSwitch 300 GB/s
    both ways; and the published GEMM efficiency 83/125."""
    assert (DGX2.gpus_per_node, DGX2.memory_bytes, DGX2.peak_flops) == (16, 32 * GB, 125 * 10**12)
    assert DGX2.inter_bytes_per_s * 8 == 800 * 10**9 and DGX2.intra_bytes_per_s * 2 == 300 * GB
    assert DGX2.gemm_efficiency * 125 == 83 and isinstance(H200_NODE, Machine)


# -- a step --------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def small_step(stage: int = 2, n_m: int = 2, flops: bool = True):
    """4 blocks of 256 on a 2 × 2 grid (N_d × N_m), a checkpoint per block, 2 sequences."""
    return measure(TrainConfig(stage=stage, n_d=2, model=gpt(4, 256, 4), count_flops=flops,
                               zero_r=ZeroROptions(checkpoint_activations=1),
                               mesh=MeshOptions(n_m=n_m)), micro_batch=2)


def ledgers(r) -> list[tuple]:
    """Per rank class: its ranks, model states, device and host peaks and snapshots, and its
    collective trace."""
    return [(c.ranks, c.model_states, c.memory.peak, c.memory.peak_total, c.memory.snapshots,
             c.host.peak, c.host.snapshots, c.trace) for c in r.classes]


def test_counting_flops_changes_no_byte_of_the_step():
    """The op counter only watches: a step measured with count_flops holds, per rank class, the
    same memory, host and collective ledgers as without it, so one counted step answers for its
    bytes too (C49's 170B peaks read Figure 2's counted C5 step)."""
    counted, plain = small_step(), small_step(flops=False)
    assert counted.classes[0].output.flops[0]["forward"] > 0 == plain.classes[0].output.flops[0][
        "forward"]
    assert counted.classes[0].memory.snapshots and counted.classes[0].trace
    assert ledgers(counted) == ledgers(plain)


GEMM_RATE = 83e12                                   # DGX-2: 125 TFLOPS · 83/125


def test_a_gemm_bound_op_runs_at_83_tflops_and_a_memory_bound_one_at_900_gb_s():
    """The roofline by hand on the DGX-2: an fp16 GEMM of 4096³ (2·4096³ FLOPs, 3·2·4096²
    bytes) takes its FLOPs at 83 TFLOPS, its bytes alone would take 0.11 ms of 1.66 ms; an
    elementwise add of 2^24 fp16 elements (3·2^25 bytes, no FLOPs) takes its bytes at 900 GB/s.
    Three GEMMs and two adds: 3·t_gemm + 2·t_add, of which 2·t_add is memory-bound."""
    gemm = Op("aten.mm.default", 2 * 4096**3, 2 * 2 * 4096**2, 2 * 4096**2)
    add = Op("aten.add.Tensor", 0, 2 * 2 * 2**24, 2 * 2**24)
    t_gemm, t_add = 2 * 4096**3 / GEMM_RATE, 3 * 2**25 / 900e9
    assert op_seconds(DGX2, gemm) == (t_gemm, False) and op_seconds(DGX2, add) == (t_add, True)
    total, bound = ops_seconds(DGX2, Counter({gemm: 3, add: 2}))
    assert total == pytest.approx(3 * t_gemm + 2 * t_add, rel=1e-15)
    assert bound == pytest.approx(2 * t_add, rel=1e-15)


def test_compute_time_is_the_roofline_over_the_steps_ops_and_exceeds_the_gemm_only_time():
    """Forward and backward: Σ count · max(FLOPs / 83 TFLOPS, bytes / 900 GB/s) over the ops
    observed; that is the GEMM-only time (all FLOPs at 83 TFLOPS) plus, for every memory-bound
    op, what its bytes take beyond its FLOPs — softmax, layer norm, GELU, casts are not free."""
    r = small_step()
    t, f, ops = step_time(r, DGX2), r.classes[0].output.flops[0], r.classes[0].output.ops[0]
    for phase in ("forward", "backward"):
        extra = sum(n * (op.bytes / 900e9 - op.flops / GEMM_RATE) for op, n in ops[phase].items()
                    if op.bytes / 900e9 > op.flops / GEMM_RATE)
        assert t.compute_s[phase] == pytest.approx(f[phase] / GEMM_RATE + extra, rel=1e-12)
        assert 0 < t.memory_bound_s[phase] < t.compute_s[phase] and extra > 0
    assert t.flops == f["forward"] + f["backward"] and t.tflops_per_gpu == t.flops / t.step_s / 1e12
    assert t.memory_bound_s["step"] == t.compute_s["step"]        # the optimizer: all bytes
    assert 0 < t.memory_bound_share < 1


def test_optim_bytes_per_param_are_what_the_stages_adam_step_touches_once_each(monkeypatch):
    """28 bytes per owned parameter (OPTIM_BYTES_PER_PARAM) is the fused kernel's traffic: each
    model-state buffer the step and the parameter sync read or write, once per element at its
    dtype — observed on a stage-2 run (ledger categories and dtypes of the tensors the ops
    touched), not assumed: read fp16 gradient, fp32 master, m, v; write master, m, v, fp16 param."""
    touched: dict[tuple[str, str], int] = {}          # (category, "read"/"write") -> bytes/element

    class Touches(Observer):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if self.ctx.phase_name in ("step", "param_sync") and not self._paused:
                written = {name for _, name, _ in written_arguments(func)}
                for k, a in enumerate(func._schema.arguments):
                    t = args[k] if k < len(args) else kwargs.get(a.name)
                    cat = self._category(t.untyped_storage()) if isinstance(t, torch.Tensor) else None
                    if cat is None or is_view(func, args, kwargs, None):
                        continue
                    for how in ("write",) * (a.name in written) + ("read",) * (a.name not in
                                                                             unread(func)):
                        touched[cat, how] = t.element_size()
            return super().__torch_dispatch__(func, types, args, kwargs)

    monkeypatch.setattr(threads, "Observer", Touches)
    train(TrainConfig(stage=2, n_d=2, model=ODD, steps=1),
          cluster=threads.VirtualCluster(2, observe=True))
    assert touched == {("grad16", "read"): 2, ("master32", "read"): 4, ("master32", "write"): 4,
                       ("exp_avg", "read"): 4, ("exp_avg", "write"): 4, ("exp_avg_sq", "read"): 4,
                       ("exp_avg_sq", "write"): 4, ("param16", "write"): 2}
    assert sum(touched.values()) == OPTIM_BYTES_PER_PARAM == 28


def test_communication_per_group_is_the_sum_over_the_ledger_records():
    """Each group's seconds are its records' α–β times, DP at stride N_m, MP at stride 1 — on
    nodes of 2 GPUs, so that the 2 × 2 grid's DP rings leave the node and the stride matters."""
    r, m = small_step(), dataclasses.replace(DGX2, gpus_per_node=2)
    t = step_time(r, m)
    recs = r.comm_ledger([0]).records(0)
    for group, stride in (("dp", 2), ("mp", 1)):
        assert t.comm_s[group] == pytest.approx(sum(
            collective_seconds(m, x.op, x.group_size, stride, x.bytes_sent, x.bytes_recv)
            for x in recs if x.group == group), rel=1e-12)
    assert group_bandwidth(m, 2, 2) == (50 * GB, True)
    assert t.step_s == pytest.approx(sum(t.compute_s.values()) + sum(t.comm_s.values()), rel=1e-12)


def test_backward_overlap_hides_only_the_dp_traffic_of_backward():
    """With overlap, P_os+g's gradient reduce-scatters (issued in backward) run beside backward
    compute; MP all-reduces stay on the critical path; the hidden seconds are reported."""
    r = small_step()
    none, over = step_time(r, DGX2, "none"), step_time(r, DGX2, "backward")
    dp_backward = sum(collective_seconds(DGX2, x.op, x.group_size, 2, x.bytes_sent)
                      for x in r.comm_ledger([0]).records(0, phase="backward", group="dp"))
    assert dp_backward > 0 and none.hidden_s == 0
    assert over.hidden_s == pytest.approx(min(dp_backward, over.compute_s["backward"]), rel=1e-12)
    assert none.step_s - over.step_s == pytest.approx(over.hidden_s, rel=1e-9)
    assert over.comm_s == none.comm_s and over.exposed_comm_s < none.exposed_comm_s


def test_step_time_needs_a_step_measured_with_flops_and_a_known_overlap():
    """Without count_flops there is nothing to time; an unknown overlap names the accepted ones."""
    with pytest.raises(ValueError, match="count_flops=True"):
        step_time(small_step(flops=False), DGX2)
    with pytest.raises(ValueError, match=r"overlap must be one of \('none', 'backward'\), got 'all'"):
        step_time(small_step(), DGX2, "all")


def test_the_same_step_is_faster_on_an_h200_node():
    """Another Machine is a constructor call: the H200 node's compute and step are shorter."""
    r = small_step()
    v, h = step_time(r, DGX2), step_time(r, H200_NODE)
    assert h.compute_s["backward"] < v.compute_s["backward"] and h.step_s < v.step_s


# -- the fit search of Figure 6 (evaluation/configs.py, by training/fit.py) ---------------------------
@pytest.mark.parametrize("bump,answer", [(50, 25), (-50, 35)], ids=["guess-too-high", "guess-too-low"])
def test_the_fit_search_ends_on_a_measured_boundary_from_a_wrong_linear_guess(monkeypatch, bump,
                                                                              answer):
    """Peaks 10·L bytes, plus ``bump`` beyond 20 layers: the probes at 8 and 16 guess 30 for a
    300-byte device; the search ends on the L that fits with L + 1 measured not to, in a few
    steps (the line through its last two points, not one layer at a time)."""
    measured = []
    monkeypatch.setattr(configs, "peak_bytes",
                        lambda c, L, **kw: measured.append(L) or 10 * L + (bump if L > 20 else 0))
    L, steps = configs.max_layers(configs.CONFIGS["C1"], 300)
    assert L == answer and {answer, answer + 1} <= set(measured)
    assert steps == len(measured) <= 6          # walking one layer at a time took 8 and 9


@pytest.mark.parametrize("peaks,capacity,answer", [
    ([10 * L for L in range(60)], 300, 30),                          # a line: found exactly
    ([10 * L + 400 * (L > 40) for L in range(60)], 550, 40),          # a jump: the bracket holds
    ([5 * L * L for L in range(60)], 2000, 20),                       # convex
    ([1000 + L for L in range(60)], 10, 0),                           # nothing fits
    ([L for L in range(300)], 250, 250),                              # far beyond the probes
])
def test_the_boundary_search_returns_the_last_l_that_fits(peaks, capacity, answer):
    """For peaks that grow with L, the fit search from Figure 6's probes (training/fit.py)
    returns the most L that fits, having measured L + 1 not to (or 1 not to, for 0), never
    measuring an L twice."""
    from zerospec.training.fit import largest
    measured = []
    L = largest(lambda L: measured.append(L) or peaks[L], capacity, probes=(8, 16)).value or 0
    assert L == answer and answer + 1 in measured and len(measured) == len(set(measured))


def test_dp_rings_wider_apart_than_a_node_still_share_it_sixteen_ways():
    """MP 32 (the 40B baseline's DP groups: 12 ranks, stride 32): each node holds 16 GPUs of
    16 different DP rings, so k = min(stride, 16) = 16 share its InfiniBand, not 32."""
    assert group_bandwidth(DGX2, 12, 32) == (6.25 * GB, True)
