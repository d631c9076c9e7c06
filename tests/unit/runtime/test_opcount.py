"""The op observer (zerospec/runtime/opcount.py): each aten op's FLOPs, from torch's own registry,
and the bytes it reads and writes, derived by hand for a few ops and summed over real steps."""
from __future__ import annotations

import contextlib
import functools
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from zerospec.cluster.threads import VirtualCluster
from zerospec.model.gpt import ODD
from zerospec.model.presets import gpt
from zerospec.runtime.observe import Observer
from zerospec.runtime.opcount import Op, OpCounter, total_bytes, total_flops
from zerospec.testing.flops import flop_counter_mode_alongside
from zerospec.training.config import TrainConfig
from zerospec.training.sections import MeshOptions, ZeroROptions
from zerospec.training.sections import ZeroROptions
from zerospec.training.run import train
from zerospec.training.scale import measure


def counted(fn, *args) -> Counter:
    with OpCounter() as c:
        fn(*args)
    return c.ops


def only(ops: Counter) -> Op:
    (op, n), = ops.items()
    assert n == 1
    return op


# -- bytes, by hand --------------------------------------------------------------------------------------
def test_an_fp16_matmul_reads_both_operands_and_writes_its_product():
    """(m, k) @ (k, n) in fp16: 2mkn FLOPs, 2(mk + kn) bytes read, 2mn written — on meta tensors."""
    m, k, n = 64, 128, 32
    a = torch.empty(m, k, dtype=torch.float16, device="meta")
    b = torch.empty(k, n, dtype=torch.float16, device="meta")
    assert only(counted(torch.mm, a, b)) == Op("aten.mm.default", 2 * m * k * n,
                                                2 * (m * k + k * n), 2 * m * n)


def test_views_move_no_bytes_whatever_their_size():
    """view, t, transpose, expand, slice, detach and _unsafe_view (a view its schema does not
    call one) alias their input: 0 bytes each."""
    x = torch.empty(256, 512, dtype=torch.float16, device="meta")
    ops = counted(lambda: (x.view(512, 256), x.t(), x.transpose(0, 1), x[:, :1].expand(256, 7),
                           x[10:20], x.detach(), torch.ops.aten._unsafe_view(x, [512, 256])))
    assert len(ops) == 7 and all(op.bytes == 0 for op in ops)


def test_an_allocation_moves_no_bytes_its_first_writer_pays():
    """torch.empty reserves memory without touching it: 0 bytes; a zeros is a write."""
    ops = counted(lambda: (torch.empty(1000), torch.zeros(1000)))
    assert {op.name: op.bytes for op in ops} == {"aten.empty.memory_format": 0,
                                                 "aten.zeros.default": 4000}


def test_a_cast_from_fp16_to_fp32_reads_2_and_writes_4_bytes_per_element():
    """x.float() of 1000 fp16 elements: 2000 bytes in, 4000 out, no FLOPs."""
    x = torch.empty(1000, dtype=torch.float16, device="meta")
    assert only(counted(x.float)) == Op("aten._to_copy.default", 0, 2000, 4000)


def test_an_in_place_add_reads_both_operands_and_writes_its_self():
    """a.add_(b) on 100 fp32 elements reads a and b (800 bytes) and writes a (400)."""
    a, b = torch.zeros(100), torch.ones(100)
    assert only(counted(a.add_, b)) == Op("aten.add_.Tensor", 0, 800, 400)


def test_an_out_argument_is_written_not_read():
    """torch.mul(a, b, out=c): reads a and b, writes c; the tensor as passed, not its storage."""
    base = torch.zeros(1000)
    a, b, c = base[:10], torch.ones(10), torch.empty(10)
    assert only(counted(lambda: torch.mul(a, b, out=c))) == Op("aten.mul.out", 0, 80, 40)


# -- nesting -----------------------------------------------------------------------------------------------
def block(x, w):
    return F.gelu(F.linear(F.layer_norm(x, (x.shape[-1],)), w)).sum()


@pytest.mark.parametrize("inner", ["OpCounter", "FlopCounterMode"])
def test_nested_with_flop_counter_mode_either_way_the_flops_are_its_total(inner):
    """Forward and backward of a linear block with batched inputs, the modes entered in either
    order: Σ count × FLOPs equals FlopCounterMode's total, and the gradient is unchanged."""
    x, w = torch.randn(2, 8, 16), torch.randn(32, 16, requires_grad=True)
    block(x, w).backward()
    expected, w.grad = w.grad.clone(), None
    oc, fc = OpCounter(), FlopCounterMode(display=False)
    outer, last = (fc, oc) if inner == "OpCounter" else (oc, fc)
    with outer, last:
        block(x, w).backward()
    assert fc.get_total_flops() > 0 and oc.flops == fc.get_total_flops()
    assert torch.equal(w.grad, expected)


def test_under_inference_mode_composite_ops_are_decomposed_as_flop_counter_mode_does():
    """In inference mode aten.linear reaches the modes whole (no autograd layer decomposed it);
    FlopCounterMode counts the mm inside it, so an OpCounter on top must decompose it too."""
    x, w = torch.randn(2, 8, 16), torch.randn(32, 16)
    fc, oc = FlopCounterMode(display=False), OpCounter()
    with torch.inference_mode(), fc, oc:
        F.linear(x, w)
    assert oc.flops == fc.get_total_flops() == 2 * 16 * 16 * 32
    assert {op.name for op in oc.ops} >= {"aten.mm.default"}


def test_inside_the_memory_observer_nothing_it_sees_changes():
    """The memory observer's peak and written elements are the same with an OpCounter inside."""
    def run(with_counter: bool):
        x, w = torch.randn(4, 8, 64), torch.randn(64, 64, requires_grad=True)
        with Observer() as obs:
            with OpCounter() if with_counter else contextlib.nullcontext():
                block(x, w).backward()
                w.grad.mul_(2)
        return obs.observation
    plain, nested = run(False), run(True)
    assert nested.peaks["run"].bytes == plain.peaks["run"].bytes > 0
    assert nested.written == plain.written


# -- on real steps: training counts FLOPs with the counter; FlopCounterMode is the oracle ----------
PHASES = ("forward", "backward")


@functools.lru_cache(maxsize=None)
def meta_step():
    """4 blocks of 256, N_d × N_m = 2 × 2, a checkpoint per block: backward recomputes. With
    FlopCounterMode beneath every counted phase: (each rank class's output, the totals' pairs)."""
    with flop_counter_mode_alongside() as totals:
        res = measure(TrainConfig(stage=2, n_d=2, model=gpt(4, 256, 4), count_flops=True,
                                  zero_r=ZeroROptions(checkpoint_activations=1),
                                  mesh=MeshOptions(n_m=2)), micro_batch=2)
    return [c.output for c in res.classes], totals


@functools.lru_cache(maxsize=None)
def thread_step(stage: int):
    """``stage`` on 2 virtual GPUs, 2 steps of the ODD model, CPU threads (fp32 compute), a
    checkpoint per block, FlopCounterMode beneath: (per-rank outputs, the totals' pairs)."""
    cfg = TrainConfig(stage=stage, n_d=2, model=ODD, steps=2, count_flops=True,
                      zero_r=ZeroROptions(checkpoint_activations=1))
    with flop_counter_mode_alongside() as totals:
        ranks = train(cfg, cluster=VirtualCluster(2)).ranks
    return ranks, totals


def reported(outputs) -> list[int]:
    """Every FLOP count the outputs report: per output, step and phase (one micro-batch each)."""
    return sorted(f[p] for out in outputs for f in out.flops for p in PHASES)


def test_on_a_meta_step_the_reported_flops_are_flop_counter_modes_totals():
    """Each FLOP count a meta step reports (per rank class and phase, recompute included) is
    FlopCounterMode's total over the same phase, counted beneath the counter: exact integers."""
    outs, totals = meta_step()
    assert totals and all(fc == oc > 0 for fc, oc in totals), totals
    assert reported(outs) == sorted(fc for fc, _ in totals)
    assert all(total_flops(o.ops[0][p]) == o.flops[0][p] for o in outs for p in PHASES)


@pytest.mark.parametrize("stage", [0, 3])
def test_on_threads_every_rank_step_and_phase_reports_flop_counter_modes_total(stage):
    """On CPU threads (DP and P_os+g+p, 2 ranks, 2 steps): the 8 FLOP counts the ranks report
    are FlopCounterMode's totals over those phases, and each rank's per-op record sums to its."""
    ranks, totals = thread_step(stage)
    assert len(totals) == 2 * 2 * 2 and all(fc == oc > 0 for fc, oc in totals), totals
    assert reported(ranks) == sorted(fc for fc, _ in totals)
    for out in ranks:
        assert len(out.ops) == 2
        for ops, flops in zip(out.ops, out.flops):
            assert all(total_flops(ops[p]) == flops[p] for p in PHASES)


def test_backward_holds_the_recompute_of_every_checkpointed_block():
    """With a checkpoint per block, backward reruns each block's forward: its GELUs and
    attention softmaxes appear in backward as often as in forward, and its bytes exceed
    forward's."""
    out = meta_step()[0][0]
    fwd, bwd = out.ops[0]["forward"], out.ops[0]["backward"]

    def calls(ops, name):
        return sum(n for op, n in ops.items() if op.name == name)
    for name in ("aten.gelu.default", "aten._softmax.default"):
        assert calls(bwd, name) == calls(fwd, name) == 4
    assert total_bytes(bwd) > total_bytes(fwd) > 0


def test_a_step_is_a_few_dozen_distinct_ops_however_many_calls():
    """Identical ops aggregate: the meta step makes hundreds of calls but few distinct tuples."""
    ops = meta_step()[0][0].ops[0]["backward"]
    assert sum(ops.values()) > 10 * len(ops) // 2 and len(ops) < 100


def test_ops_remembered_per_argument_metadata_are_the_ops_counted_afresh(monkeypatch):
    """An op the kernel cache answers is counted once per cache key, and an op with a FLOP
    formula once per key of its arguments' and outputs' metadata (opcount._op): a meta step
    counted from warm tables holds, per rank class, step and phase, the Counter of Ops counted
    afresh at every call with every kernel run."""
    from zerospec.runtime import opcount
    cfg = TrainConfig(stage=3, n_d=2, model=gpt(2, 64, 4), count_flops=True,
                      zero_r=ZeroROptions(checkpoint_activations=1))
    monkeypatch.setattr(opcount, "_OPS", {})
    monkeypatch.setattr(opcount, "_ANSWERED", {})
    for cache_kernels in (True, False):      # the tables hold every key of the step after this
        measure(cfg, cache_kernels=cache_kernels)
    warm = [[c.output.ops for c in measure(cfg, cache_kernels=k).classes] for k in (True, False)]
    assert len(opcount._OPS) > 0 and len(opcount._ANSWERED) > 0
    monkeypatch.setattr(opcount, "_op", lambda f, args, kwargs, out: opcount._record(
        f, args, kwargs, out))
    fresh = [c.output.ops for c in measure(cfg, cache_kernels=False).classes]
    assert warm == [fresh, fresh]


def test_on_a_kernel_cache_the_counter_runs_each_op_through_it_in_its_place_and_gives_it_back():
    """Entered right on a MetaKernelCache, the counter is the one Python mode each op passes
    (the cache off the stack while it is entered), runs the op through the cache, which answers
    the repeat, and counts both calls: 2·4·8·3 FLOPs, (4·8 + 8·3)·4 bytes read, 4·3·4 written;
    on exit the cache is the current mode again, and an op after it is the cache's alone."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode, _len_torch_dispatch_stack
    from zerospec.runtime.metacache import MetaKernelCache
    x, w = torch.empty(4, 8, device="meta"), torch.empty(8, 3, device="meta")
    with MetaKernelCache() as cache:
        with OpCounter() as c:
            assert _len_torch_dispatch_stack() == 1 and _get_current_dispatch_mode() is c
            torch.mm(x, w)
            torch.mm(x, w)
        assert _get_current_dispatch_mode() is cache
        torch.mm(x, w)
    assert (cache.misses, cache.hits) == (1, 2)
    assert c.ops == Counter({Op("aten.mm.default", 2 * 4 * 8 * 3, (4 * 8 + 8 * 3) * 4, 4 * 3 * 4): 2})
