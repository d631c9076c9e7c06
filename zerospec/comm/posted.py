"""A posted reduce-scatter: each rank hands its input over and goes on; the sum is built in rank order.

Stage 2 reduce-scatters a unit's gradient the moment backward has produced it (C8). As a blocking
call in the simulator, that makes every rank hand the baton on at every unit, so the ranks run
their backward in lockstep, each one's activations leaving the cache while the others run: a cost
of the simulation, not of ZeRO (README, the lockstep diagnostic). Posted, the call reads the
rank's input at once and returns: the input is added to an fp32 accumulator if every lower rank's
already is, else copied until they are, so the caller may free or reuse it on return. When the last
input is in, every rank's output gets its chunk; ``Interconnect.wait`` returns once all of a rank's
posted calls have got that far. The additions are the blocking call's (``checks.reduce_step``), in
the same order, so the outputs are bit for bit the blocking call's, whatever order the ranks post in.

What the simulator holds meanwhile belongs to no rank's device (no ledger counts it, the memory
observer does not see it): per reduction in flight, the fp32 sum of one unit; and under a schedule
that lets a rank post before a lower one (the jittered baton), a copy of each early input. In rank
order (the default) stage 2 holds at most the fp32 sums of all units, 4Ψ bytes, just before the
last rank posts.
"""
from __future__ import annotations

import torch

from .checks import check_calls, reduce_end, reduce_step
from .interconnect import Call, describe


class PostedReduction:
    """One posted reduce-scatter of a group of ``n`` ranks, collecting their inputs."""

    def __init__(self, n: int, first: Call, index: int):
        self.n = n
        self.summary = first.summary()          # what every rank's call must match
        self.op = first.reduce_op
        self.out_shape = tuple(first.out.shape)
        self.first = index
        self.outs: list[torch.Tensor | None] = [None] * n
        self.early: dict[int, torch.Tensor] = {}  # copies of inputs that came before their turn
        self.acc: torch.Tensor | None = None
        self.summed = 0                         # ranks 0 … summed−1 are in the accumulator
        self.done = False
        self.seconds = 0.0                      # every rank's time in add, summed (the timeline's)

    def problem(self, index: int, call: Call) -> str | None:
        """What is wrong with group rank ``index``'s call, or None."""
        if self.outs[index] is not None:
            return f"rank {index} posted twice"
        own = check_calls([call], self.n)
        if own is not None:
            return own
        if call.summary() != self.summary or tuple(call.out.shape) != self.out_shape:
            return (f"ranks posted different collectives: rank {self.first} "
                    f"{describe(*self.summary)} into {self.out_shape}, rank {index} "
                    f"{call.describe()} into {tuple(call.out.shape)}")
        return None

    def missing(self) -> list[int]:
        """Group ranks that have not posted yet."""
        return [r for r, out in enumerate(self.outs) if out is None]

    def add(self, index: int, call: Call) -> None:
        """Read group rank ``index``'s input; when it is the last one, write every output."""
        self.outs[index] = call.out
        inp = call.inp.reshape(-1)
        if index != self.summed:
            self.early[index] = inp.clone()
            return
        self._sum(inp)
        while self.summed in self.early:
            self._sum(self.early.pop(self.summed))
        if self.summed == self.n:
            acc, size = reduce_end(self.acc, self.op, self.n), self.acc.numel() // self.n
            for r, out in enumerate(self.outs):
                out.view(-1).copy_(acc[r * size:(r + 1) * size])
            self.acc, self.outs, self.done = None, [], True

    def _sum(self, inp: torch.Tensor) -> None:
        self.acc = reduce_step(self.acc, inp, self.op)
        self.summed += 1
