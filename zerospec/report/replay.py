"""Replay one step's measured events as if the ranks ran side by side: the honest step time on N GPUs.

The virtual cluster runs one rank at a time (the baton, see :mod:`zerospec.cluster.threads`), so a step's wall
time is the *sum* of every rank's work. Each rank's :class:`~zerospec.runtime.context.Timeline` records what
it did while it held the CPU — ``(step, phase, "compute", seconds)`` — and, for every collective,
``(step, phase, op, seconds)`` with the data-movement time. :func:`parallel_time` replays those events
on N independent clocks:

* a compute event advances only its own rank's clock;
* the k-th collective of the step is a rendezvous: every clock jumps to the latest arrival (the others
  *wait*), then all advance by the collective's data-movement time (the largest any rank recorded).

Caveat, so nobody over-reads the numbers: the simulated backend's data movement copies every rank's
buffers on one thread (a posted reduce-scatter's is spread over the ranks' posts, and its last
poster records the sum), so a collective's seconds are pessimistic for one GPU, and collectives
never overlap compute here, posted ones included (real systems bucket and overlap, C8).
"""
from __future__ import annotations

import dataclasses

Event = tuple[int, str, str, float]      # (step, phase, kind, seconds); kind "compute" or an op name


@dataclasses.dataclass(frozen=True)
class Segment:
    """One bar of the timeline: rank ``rank`` did ``kind`` in ``phase`` from ``start`` for ``seconds``."""

    rank: int
    start: float
    seconds: float
    phase: str
    kind: str            # "compute", "wait", or the collective's op


@dataclasses.dataclass(frozen=True)
class StepReplay:
    step: int
    seconds: float                 # step time on N parallel GPUs: the latest clock at the end
    compute: list[float]           # per rank: own compute seconds
    wait: list[float]              # per rank: seconds spent waiting for slower ranks at collectives
    collective_seconds: float      # data-movement seconds of the step's collectives (each counted once)
    n_collectives: int
    segments: list[Segment]

    @property
    def serial_seconds(self) -> float:
        """What the baton scheduler pays for the same events: all compute, each collective once."""
        return sum(self.compute) + self.collective_seconds


def step_events(timelines: list[list[Event]], step: int) -> list[list[Event]]:
    """Each rank's events of ``step``, in order."""
    return [[e for e in tl if e[0] == step] for tl in timelines]


def parallel_time(timelines: list[list[Event]], step: int) -> StepReplay:
    """Replay ``step`` of every rank's timeline on N parallel clocks (see the module docstring)."""
    if not timelines:
        raise ValueError("parallel_time needs at least one rank's timeline, got none")
    per_rank = step_events(timelines, step)
    if not any(per_rank):
        steps = sorted({e[0] for tl in timelines for e in tl})
        raise ValueError(f"no events for step {step}; the timelines have steps {steps}")
    n = len(per_rank)
    clocks, compute, wait = [0.0] * n, [0.0] * n, [0.0] * n
    idx = [0] * n
    segments: list[Segment] = []
    coll_seconds, n_coll = 0.0, 0
    while True:
        arrivals: list[Event | None] = []
        for r, evs in enumerate(per_rank):
            while idx[r] < len(evs) and evs[idx[r]][2] == "compute":
                _, phase, _, sec = evs[idx[r]]
                segments.append(Segment(r, clocks[r], sec, phase, "compute"))
                clocks[r] += sec
                compute[r] += sec
                idx[r] += 1
            arrivals.append(evs[idx[r]] if idx[r] < len(evs) else None)
        if all(a is None for a in arrivals):
            break
        ops = {a[2] if a else None for a in arrivals}
        if len(ops) > 1:
            desc = ", ".join(f"rank {r}: {a[2] if a else 'end of step'}" for r, a in enumerate(arrivals))
            raise ValueError(f"step {step}, collective #{n_coll}: ranks disagree ({desc})")
        start = max(clocks)
        dur = max(a[3] for a in arrivals)
        for r, a in enumerate(arrivals):
            if start > clocks[r]:
                segments.append(Segment(r, clocks[r], start - clocks[r], a[1], "wait"))
                wait[r] += start - clocks[r]
            segments.append(Segment(r, start, dur, a[1], a[2]))
            clocks[r] = start + dur
            idx[r] += 1
        coll_seconds += dur
        n_coll += 1
    return StepReplay(step, max(clocks), compute, wait, coll_seconds, n_coll, segments)
