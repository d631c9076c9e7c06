"""A step replayed on a capacity while it runs (zerospec/runtime/replay.py's LiveReplay, fed by
StorageTrace) ends at its first OutOfMemory, which is the one the replay of its whole trace finds."""
from __future__ import annotations

import pytest

from tests.unit.runtime.test_allocator import FRAGMENTING
from zerospec.evaluation.configs import CONFIGS
from zerospec.model.presets import gpt
from zerospec.runtime.memory import TraceEvent
from zerospec.runtime.trace import LiveReplay, replay
from zerospec.training.config import TrainConfig
from zerospec.training.scale import measure

MiB = 1 << 20
# Table 3's C5 at 14 GPUs, MP 2, one block of width 64: a checkpointed step with P_a+cpu
TINY = TrainConfig.of(model=gpt(1, 64, 4), stage=2, n_d=7, **CONFIGS["C5"].kwargs(2))


def events(trace, n=None) -> list[tuple]:
    """A trace as the allocator reads it (storage keys are addresses: they differ run to run)."""
    return [(e.op, e.nbytes, e.stream, e.label) for e in trace[:n]]


def report(oom) -> tuple:
    e = oom.error
    return (oom.event, oom.phase, e.requested, e.size, e.allocated, e.reserved, e.largest_free)


@pytest.fixture(scope="module")
def whole():
    """Rank class 0 of TINY's step, traced to its end."""
    return measure(TINY, trace=True, only=0).classes[0]


def test_a_step_ends_at_its_first_oom_as_its_whole_traces_replay_finds_it(whole):
    """Rank class 0's whole traced step, replayed on one byte less than its forward's allocated
    peak and than its step's: the step run again on that capacity ends at the same request (same
    event, phase, bytes asked, allocated, reserved, largest free block), its trace the same up to
    there, and no output; one runs out in forward, the other inside autograd's backward."""
    free = replay(whole.allocations)
    forward = next(p for p in free.phases if p.label.startswith("forward"))
    phases = []
    for cap in (forward.peak_allocated - 1, free.peak_allocated - 1):
        want = replay(whole.allocations, cap).oom
        got = measure(TINY, trace=True, only=0, capacity=cap).classes[0]
        assert report(got.oom) == report(want) and got.output is None
        assert events(got.allocations, want.event + 1) == events(whole.allocations, want.event + 1)
        phases.append(got.oom.phase)
    assert phases == ["forward@1", "backward@1"]


def test_a_step_that_fits_its_capacity_runs_to_its_end(whole):
    """On its own reserved peak the step does not run out: it runs whole, the same trace."""
    got = measure(TINY, trace=True, only=0, capacity=replay(whole.allocations).peak_reserved)
    c = got.classes[0]
    assert c.oom is None and c.output is not None
    assert events(c.allocations) == events(whole.allocations)


@pytest.mark.slow   # C30's paper-scale traced step, whole (shared with its claim tests) and to its OOM
def test_c30s_step_on_a_32gb_v100_ends_at_the_oom_its_whole_traces_replay_finds():
    """C30's case (GPT-2 1.5B, P_os+g+p, N_d = 400, 44 sequences) replayed on 32 GB as it runs
    ends at the request its whole trace's replay runs out at, with the same trace up to there."""
    from zerospec.evaluation.cached_memory import C30_BATCH, c30_config, c30_trace
    from zerospec.paper.hardware import DGX2
    trace = c30_trace(C30_BATCH)
    want = replay(trace, DGX2.memory_bytes).oom
    got = measure(c30_config(), micro_batch=C30_BATCH, trace=True,
                  capacity=DGX2.memory_bytes).classes[0]
    assert want is not None and report(got.oom) == report(want) and got.output is None
    assert events(got.allocations, want.event + 1) == events(trace, want.event + 1)
    assert len(got.allocations) < len(trace)


def test_a_live_replay_fed_event_by_event_is_the_replay_and_stops_at_its_oom():
    """The fragmenting trace on 200 MiB (tests/unit/runtime/test_allocator.py): fed one event at
    a time, event 8 answers the OutOfMemory and the result is replay's; nothing is fed after."""
    trace = FRAGMENTING
    live = LiveReplay(200 * MiB)
    answers = [live.feed(e) for e in trace[:9]]
    assert [a is not None for a in answers] == [False] * 8 + [True]
    got, want = live.result(trace), replay(trace, 200 * MiB)
    assert report(got.oom) == report(want.oom) == (8, "backward", 50 * MiB, 50 * MiB, 120 * MiB,
                                                   200 * MiB, 40 * MiB)
    assert got.phases == want.phases
    with pytest.raises(ValueError, match="trace event 9: fed after the OutOfMemory at event 8"):
        live.feed(trace[9])


def test_measure_refuses_a_capacity_without_a_trace():
    with pytest.raises(ValueError, match=r"capacity \(100\) replays the storage trace live: it "
                                         r"needs trace=True"):
        measure(TINY, capacity=100)
