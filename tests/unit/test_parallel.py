"""zerospec.report.parallel: the report's meta steps in a helper process on another CPU, with the
same results as in the report's own process, its errors raised there, and nothing left behind."""
from __future__ import annotations

import itertools
import os
import pickle
from concurrent.futures import ProcessPoolExecutor

import pytest

from zerospec.cluster.processes import mp_context
from zerospec.model.gpt import GPTConfig
from zerospec.report import parallel
from zerospec.report.measure import ReportConfig, meta_measurements
from zerospec.report.cached import c30_trace
from zerospec.report.parallel import Beside
from zerospec.runtime.errors import RankError

TWO_CPUS = pytest.mark.skipif(len(parallel.usable_cpus()) < 2, reason="needs a second usable CPU")
TINY = ReportConfig(ranks=4, model=GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2,
                                             n_embd=32), sweep=(1, 4, 64))


def _integers(flops, sweep, zero_r, c30):
    """Everything the report reads from its meta steps, as plain integers."""
    return ({k: [(o.flops, o.optim_elements, o.model_states, o.ops) for o in outs]
             for k, outs in flops.items()}, sweep,
            {k: [(r.memory(q).peak, r.host(q).peak, r.model_states(q), r.comm_elements(q))
                 for q in range(r.config.n_ranks)] for k, r in zero_r.items()})


@TWO_CPUS
def test_meta_steps_in_the_helper_equal_those_run_here():
    """FLOPs and op counts per rank, the memory sweep and ZeRO-R's peaks: the same integers from
    the helper process as from this one, and the helper is another process."""
    with Beside(meta_measurements, TINY) as side:
        assert side.in_helper
        there = side.result()
    with Beside(os.getpid) as side:
        assert side.result() != os.getpid()
    assert _integers(*there) == _integers(*meta_measurements(TINY))


@TWO_CPUS
def test_each_process_keeps_a_cpu_of_its_own_and_this_one_is_restored():
    """Inside the block this thread is on one CPU and the helper on the others; after it, this
    thread may run where it could before, and so do the processes the forkserver starts later
    (rank launches reuse it)."""
    before = os.sched_getaffinity(0)
    with Beside(os.sched_getaffinity, 0) as side:
        mine = os.sched_getaffinity(0)
        theirs = side.result()
    assert len(mine) == 1 and theirs and not mine & theirs and mine | theirs <= before
    assert os.sched_getaffinity(0) == before
    with ProcessPoolExecutor(1, mp_context=mp_context(None)) as later:
        assert later.submit(os.sched_getaffinity, 0).result() == before


def test_with_one_cpu_the_work_runs_in_this_process(monkeypatch):
    """No second CPU: no helper; the result is computed here when asked for."""
    monkeypatch.setattr(parallel, "usable_cpus", lambda: [0])
    with Beside(os.getpid) as side:
        assert not side.in_helper
        assert side.result() == os.getpid()


@TWO_CPUS
def test_an_error_in_the_helper_is_raised_here():
    """The helper's exception, with its message, from result()."""
    with Beside(int, "not a number") as side, pytest.raises(ValueError, match="not a number"):
        side.result()


@TWO_CPUS
def test_a_helper_that_dies_is_named():
    """A helper that exits without a result: a clear error here, not a hang."""
    with Beside(os._exit, 3) as side, pytest.raises(RuntimeError, match="helper process died"):
        side.result()


def test_a_rank_error_survives_pickling():
    """A RankError from another process keeps its message and the rank it names."""
    err = RankError("rank 3 failed in phase 'forward'", 3)
    err.fates = {3: "boom"}
    back = pickle.loads(pickle.dumps(err))
    assert (type(back), str(back), back.rank, back.fates) == (RankError, str(err), 3, {3: "boom"})


@TWO_CPUS
@pytest.mark.slow
def test_c30s_trace_from_the_helper_is_the_one_measured_here():
    """The fragmentation figure's traces (GPT-2 1.5B, N_d = 400, M_D off and on) from the helper
    process equal the ones traced here, event for event, each storage named by the order it was
    made in (a key is an address in the process that made it); ~6 s of CPU."""
    with Beside(meta_measurements, TINY, True) as side:
        there = side.result()[3]
    assert {md: _storages_in_order(t) for md, t in there.items()} == \
        {md: _storages_in_order(c30_trace(74, md)) for md in (False, True)}


def _storages_in_order(trace) -> list[tuple]:
    """The trace with each storage's key replaced by its allocation's place in the trace."""
    born, live = itertools.count(), {}
    out = []
    for ev in trace:
        if ev.op == "alloc":
            live[ev.key] = next(born)
        out.append(ev._replace(key=live[ev.key] if ev.op != "phase" else 0))
    return out
