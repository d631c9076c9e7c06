"""Same stage code on real processes: stages agree bit for bit, and gloo agrees with the simulator.

Tolerance where the reduction order differs (sim vs gloo at N = 4), derived in spec/engine.md
("How close sim and gloo must be"): the simulator sums each element in rank order, gloo's ring in
another order. At N = 2 there is no order (a + b == b + a), so the runs must be *equal* — given the
same intra-op thread count, since CPU kernels split their own sums by thread. At N = 4
an fp32 sum of 4 terms changes by ≤ 3u·Σ|g| (u = 2^-24), which survives fp16 storage only across a
rounding boundary (one fp16 ulp). The loss moves by far less than its own rounding, so losses agree
to 1e-6 relative (the fp32 loss-sum bound of tests/claims/test_equivalence.py). A weight whose
gradient is rounding noise (it cancels: e.g. the attention key bias, whose exact gradient is zero)
is turned by Adam's 1/√v̂ into an update of up to ~lr, so no per-element bound tighter than O(lr)
holds for every weight; lr/10 separates order effects from bugs, which move weights by ≥ lr.
"""
from __future__ import annotations

import pytest
import torch

from tests.support import runs
from tests.support.runs import LONG_STEPS, assert_same_training, run, stage_id

STAGES = range(4)
# the 4-process launches, with the slow cases: the ODD model in fp32 (~2 s of the ranks' CPU) and
# the small model in fp16 (~10 s: 4 stages × 4 processes × 5 steps of real compute on 2 cores). The
# default run keeps the 2-process launch (exact against the simulator, and its ledgers below) and
# tests/engine/test_robust_engine.py's 4 processes with exact sums.
LAUNCHES = [pytest.param("small", "fp16", marks=pytest.mark.slow),
            pytest.param("odd", "fp32", marks=pytest.mark.slow)]
# the ledgers' comparison: the 2-process launch in the default run, then the two above
LEDGERS = [pytest.param(2, "odd", "fp16", id="nd=2-odd-fp16"),
           *(pytest.param(4, *case.values, id=f"nd=4-{'-'.join(case.values)}", marks=case.marks)
             for case in LAUNCHES)]


def simulated(stage: int, n_d: int, model: str, precision: str):
    """The simulator's run a launch of ``n_d`` processes is compared with (at 2, thread-matched)."""
    if n_d == 2:
        return runs.sim_matched(stage, 2, model, precision)
    return run(stage, n_d, model, LONG_STEPS, precision=precision)


def assert_close(ours, sim) -> None:
    for x, y in zip(ours.losses, sim.losses, strict=True):
        assert abs(x - y) <= 1e-6 * abs(y)
    lr = sim.config.adam.lr
    assert max(float((ours.master[k] - sim.master[k]).abs().max()) for k in sim.master) <= lr / 10


@pytest.mark.parametrize("model,precision", LAUNCHES)
@pytest.mark.parametrize("stage", [1, 2, 3], ids=stage_id)
def test_every_stage_on_gloo_is_bit_identical_to_data_parallelism(stage, model, precision):
    """On 4 gloo processes, each stage's per-rank losses and final weights equal stage 0's bits."""
    res = runs.gloo(4, model, precision)
    assert_same_training(res[0], res[stage])


@pytest.mark.parametrize("precision", ["fp16", "fp32"])
@pytest.mark.parametrize("stage", STAGES, ids=stage_id)
def test_two_gloo_processes_equal_the_simulator_exactly(stage, precision):
    """N = 2, same thread count: a two-term sum has one order, so gloo equals the simulator's bits."""
    assert_same_training(runs.gloo(2, "odd", precision)[stage],
                         runs.sim_matched(stage, 2, "odd", precision))


@pytest.mark.parametrize("model,precision", LAUNCHES)
@pytest.mark.parametrize("stage", STAGES, ids=stage_id)
def test_four_gloo_processes_match_the_simulator_within_the_derived_tolerance(stage, model, precision):
    """N = 4: ring order vs rank order; losses to 1e-6 relative, weights to lr/10 (module doc)."""
    assert_close(runs.gloo(4, model, precision)[stage], run(stage, 4, model, LONG_STEPS, precision=precision))


@pytest.mark.parametrize("n_d,model,precision", LEDGERS)
def test_gloo_ledger_books_the_simulators_traffic(n_d, model, precision):
    """Per step and phase, every rank books the same collectives and elements as on the simulator."""
    key = lambda x: (x.seq, x.op, x.dtype, x.numel, x.elements_sent, x.bytes_sent, x.phase, x.step)
    for stage in STAGES:
        ours, sim = runs.gloo(n_d, model, precision)[stage], simulated(stage, n_d, model, precision)
        for r in range(n_d):
            assert [key(x) for x in ours.comm.records(r)] == [key(x) for x in sim.comm.records(r)]


@pytest.mark.parametrize("n_d,model,precision", LEDGERS)
def test_gloo_memory_ledger_equals_the_simulators(n_d, model, precision):
    """Model-state bytes and peak bytes per rank do not depend on the backend."""
    for stage in STAGES:
        ours, sim = runs.gloo(n_d, model, precision)[stage], simulated(stage, n_d, model, precision)
        for r in range(n_d):
            assert ours.memory[r].peak == sim.memory[r].peak
            assert ours.model_states(r) == sim.model_states(r)


@pytest.mark.slow   # the 4-process launch
def test_the_comparison_is_not_vacuous():
    """The compared runs learn, and the N = 4 runs do differ somewhere (the order is real)."""
    gl, sim = runs.gloo(4, "odd", "fp32")[0], run(0, 4, "odd", LONG_STEPS, precision="fp32")
    assert gl.losses[-1] < gl.losses[0]
    assert any(not torch.equal(gl.master[k], sim.master[k]) for k in sim.master)


@pytest.mark.slow   # one launch of 4 gloo processes, 4 stages: ~10 s
@pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    "known gap (issue 18): with C_B on gloo the stages' buckets have other lengths (stage 0's "
    "all-reduce bucket is one row of B, stages 1-3's reduce-scatter buckets N rows of B/N), and "
    "gloo's ring sums an element in an order that depends on the buffer's length and the "
    "element's place in it; spec/engine.md, 'Buckets on gloo'"))
def test_every_stage_on_gloo_with_buckets_is_bit_identical_to_data_parallelism():
    """4 gloo processes, B = 1000 (several buckets per stream): each stage equals stage 0's bits."""
    from zerospec.training.config import TrainConfig
    from zerospec.training.sections import OptimOptions, ZeroROptions
    from zerospec.training.run import train_processes
    cfgs = [TrainConfig(stage=s, n_d=4, model=runs.MODELS["odd"], steps=runs.LONG_STEPS, timeout=60,
                        optim=OptimOptions(precision="fp32"),
                        zero_r=ZeroROptions(bucket_elements=1000)) for s in STAGES]
    res = train_processes(cfgs)
    for stage in (1, 2, 3):
        assert_same_training(res[0], res[stage])
