"""zerospec.cluster.helper: the report's meta steps in a helper process on another CPU, with the
same results as in the report's own process, its errors raised there, and nothing left behind."""
from __future__ import annotations

import contextlib
import itertools
import os
import pathlib
import pickle
import subprocess
import sys
import time

import pytest

from zerospec.model.gpt import GPTConfig
from zerospec.cluster import helper
from zerospec.evaluation.cached_memory import C30_BATCH, c30_trace
from zerospec.cluster.helper import Beside
from zerospec.report.measure import Measurements, ReportConfig, meta_measurements
from zerospec.report.writeup import zero_r_table
from zerospec.runtime.errors import RankError

TWO_CPUS = pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(helper.usable_cpus()) < 2,
                              reason="needs CPU affinity (Linux) and a second usable CPU")
TINY = ReportConfig(ranks=4, model=GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2,
                                             n_embd=32), sweep=(1, 4, 64))


def _integers(flops, sweep, zero_r, c30):
    """Everything the report reads from its meta steps: per rank, the FLOP-counting steps' FLOPs,
    op counts, optimizer elements and model states; the sweep; ZeRO-R's table."""
    return ({k: [(o.flops, o.optim_elements, o.model_states, o.ops) for o in outs]
             for k, outs in flops.items()}, sweep,
            zero_r_table(Measurements(TINY, [], sweep, 0.0, zero_r)).rows)


@TWO_CPUS
def test_meta_steps_in_the_helper_equal_those_run_here():
    """FLOPs and op counts per rank, the memory sweep and ZeRO-R's table: the same integers from
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
    thread may run where it could before."""
    before = os.sched_getaffinity(0)
    with Beside(os.sched_getaffinity, 0) as side:
        mine = os.sched_getaffinity(0)
        theirs = side.result()
    assert len(mine) == 1 and theirs and not mine & theirs and mine | theirs <= before
    assert os.sched_getaffinity(0) == before


@TWO_CPUS
@pytest.mark.slow
def test_a_forkserver_the_helper_starts_keeps_the_whole_mask():
    """In a fresh process, where the helper starts the forkserver: processes it starts later (rank
    launches) may run on every CPU the process could, not only the helper's (~8 s of CPU)."""
    code = ("import os\n"
            "from zerospec.cluster.processes import mp_context\n"
            "from zerospec.cluster.helper import Beside\n"
            "before = os.sched_getaffinity(0)\n"
            "with Beside(os.getpid) as side:\n"
            "    side.result()\n"
            "with mp_context(None).Pool(1) as pool:\n"
            "    print(pool.apply(os.sched_getaffinity, (0,)) == before)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=_this_zerospec())
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"


def _this_zerospec() -> dict:
    """The environment for a fresh Python that imports the zerospec these tests import."""
    import zerospec
    root = str(pathlib.Path(zerospec.__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get(
        "PYTHONPATH")]))}


def test_with_one_cpu_the_work_runs_in_this_process(monkeypatch):
    """No second CPU: no helper; the result is computed here when asked for."""
    monkeypatch.setattr(helper, "usable_cpus", lambda: [0])
    with Beside(os.getpid) as side:
        assert not side.in_helper
        assert side.result() == os.getpid()


@TWO_CPUS
def test_an_error_in_the_helper_is_raised_here():
    """The helper's exception, with its message, from result()."""
    with Beside(int, "not a number") as side, pytest.raises(ValueError, match="not a number"):
        assert side.in_helper
        side.result()


def _die_unless_in(pid: int) -> str:
    if os.getpid() != pid:
        os._exit(3)
    return "here"


@TWO_CPUS
def test_a_helper_that_dies_is_named_and_the_work_done_here():
    """A helper that exits without a result: a warning naming how it died, and the work done in
    this process; no hang, nothing lost."""
    with Beside(_die_unless_in, os.getpid()) as side, \
            pytest.warns(RuntimeWarning, match="exited with code 3 before it returned"):
        assert side.in_helper
        assert side.result() == "here"


@TWO_CPUS
def test_a_helper_that_cannot_start_leaves_the_work_here(monkeypatch):
    """No process can be started (no semaphores, no forkserver socket): a warning saying so, and
    the work done in this process."""
    def refuse(method):
        raise OSError("no forkserver here")
    monkeypatch.setattr(helper, "mp_context", refuse)
    with Beside(os.getpid) as side, \
            pytest.warns(RuntimeWarning, match="could not start its helper"):
        assert side.result() == os.getpid()


def _unpicklable():
    return lambda: None


@TWO_CPUS
def test_a_result_that_cannot_come_back_is_an_error_naming_it():
    """A value that does not pickle: an error saying the helper could not send it back, not a
    silent second run here."""
    with Beside(_unpicklable) as side, pytest.raises(RuntimeError, match="could not send back"):
        side.result()


@TWO_CPUS
def test_a_second_call_gives_the_same_answer():
    """result() twice: the helper's value both times (it answered once)."""
    with Beside(os.getpid) as side:
        first = side.result()
        assert side.result() == first != os.getpid()


@TWO_CPUS
@pytest.mark.slow
def test_a_script_that_measures_on_import_still_gets_its_report(tmp_path):
    """A script without `if __name__ == "__main__":`: the helper's start imports it again, the
    measuring stops there with an error naming the fix, and the script's own run does the work
    (~10 s of CPU)."""
    script = tmp_path / "unguarded.py"
    script.write_text("import os\n"
                      "from zerospec.cluster.helper import Beside\n"
                      "with Beside(os.getpid) as side:\n"
                      "    print('pid', side.result() == os.getpid())\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path, env=_this_zerospec())
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["pid", "True"]
    assert 'put the call under `if __name__ == "__main__":`' in out.stderr
    assert "its meta steps run in this process" in out.stderr


@TWO_CPUS
@pytest.mark.parametrize("fail", [True, False], ids=["failed-here", "never-asked"])
def test_a_helper_not_waited_for_is_killed_and_the_cpu_mask_restored(fail):
    """An error in this process inside the block, or a block left without asking for the result:
    the helper (here asleep for a minute) is killed at once and this thread's mask restored."""
    before, t0 = os.sched_getaffinity(0), time.perf_counter()
    with pytest.raises(KeyError) if fail else contextlib.nullcontext():
        with Beside(time.sleep, 60) as side:
            assert side.in_helper
            if fail:
                raise KeyError("a training failed")
    assert time.perf_counter() - t0 < 30
    assert not side.process.is_alive() and side.process.exitcode < 0
    assert os.sched_getaffinity(0) == before


def test_the_test_runs_hook_keeps_the_report_in_one_process():
    """The test session's hook (tests/support/scheduling.py, zerospec/testing/report_hooks.py): the
    report's meta steps run in the worker, whose CPUs the other workers already keep busy."""
    from zerospec.report import measure
    with measure.Beside(os.getpid) as side:
        assert not side.in_helper and side.result() == os.getpid()


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
        {md: _storages_in_order(c30_trace(C30_BATCH, md)) for md in (False, True)}


def _storages_in_order(trace) -> list[tuple]:
    """The trace with each storage's key replaced by its allocation's place in the trace."""
    born, live = itertools.count(), {}
    out = []
    for ev in trace:
        if ev.op == "alloc":
            live[ev.key] = next(born)
        out.append(ev._replace(key=live[ev.key] if ev.op != "phase" else 0))
    return out
