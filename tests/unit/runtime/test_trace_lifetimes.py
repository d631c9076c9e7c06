"""A traced step's events are a function of the step alone: not of what the process imported
before it, nor of when its caller lets go of the result or the garbage collector runs."""
from __future__ import annotations

import gc
import subprocess
import sys
import textwrap

import pytest

from zerospec.model.gpt import SMALL
from zerospec.training.config import TrainConfig
from zerospec.training.scale import measure

CFG = TrainConfig(stage=3, n_d=4, model=SMALL)


def events(r) -> list[tuple]:
    return [(e.op, e.nbytes, e.category) for e in r.classes[0].allocations]


def test_a_trace_ends_where_its_step_ends_whenever_the_result_is_let_go():
    """The storages still alive when the step ends (its output's trained weights) die when the
    caller drops the result: no event of theirs joins the trace then."""
    r = measure(CFG, trace=True)
    trace, recorded = r.classes[0].allocations, events(r)
    del r
    gc.collect()
    assert [(e.op, e.nbytes, e.category) for e in trace] == recorded


FRESH = textwrap.dedent("""
    import gc, sys
    from zerospec.model.gpt import SMALL
    from zerospec.training.config import TrainConfig
    from zerospec.training.scale import measure
    lazy = ("torch._dynamo", "torch.fx.experimental.symbolic_shapes")
    assert not any(m in sys.modules for m in lazy), "not a fresh process: the test would be vacuous"
    gc.disable()     # a storage held by a reference cycle then stays: its event would move
    def events(r): return [(e.op, e.nbytes, e.category) for e in r.classes[0].allocations]
    cfg = TrainConfig(stage=3, n_d=4, model=SMALL)
    first = events(measure(cfg, trace=True))
    print(first == events(measure(cfg, trace=True)), len(first))
""")


@pytest.mark.slow   # a fresh interpreter: the first meta step of a process
def test_the_first_traced_step_of_a_process_traces_what_the_next_one_does():
    """PyTorch's Python meta kernels import symbolic_shapes and torch._dynamo on first use; inside
    a step, those imports held the step's frames in reference cycles, so tensors outlived their
    last use until a collection (338 events against 361). Imported before the step: the first
    step of a fresh process, with the collector off, traces every event of the second."""
    out = subprocess.run([sys.executable, "-c", FRESH], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    same, n = out.stdout.split()
    assert same == "True" and int(n) > 0, out.stdout
