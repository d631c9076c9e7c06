"""What one rank's code sees: its rank, the world size, its memory ledger, its interconnect, and a
recorder of where its time went (phases, compute between collectives, the collectives themselves).

Every engine builds one of these per rank — threads (:mod:`zerospec.cluster.threads`), processes
(:mod:`zerospec.comm.torch_dist`), meta tensors (:mod:`zerospec.training.scale`) — so stage code
never learns which one it runs on.
"""
from __future__ import annotations

import contextlib
import time

import torch

from .memory import MemoryLedger
from .segments import DEFAULT_STREAM


class Timeline:
    """One rank's events: own compute between collectives, and the collectives' data movement.

    With the baton only one rank runs at a time, so a rank's wall time while it holds the baton is
    its own work. Event: (step, phase, kind, seconds), kind "compute" or the collective's op.
    :func:`zerospec.report.replay.parallel_time` replays these as if the ranks ran side by side.
    """

    def __init__(self, ctx):
        self.ctx = ctx
        self.events: list[tuple[int, str, str, float]] = []
        self._since = time.perf_counter()

    def mark_compute(self) -> None:
        now = time.perf_counter()
        self.events.append((self.ctx.step, self.ctx.phase_name, "compute", now - self._since))
        self._since = now

    def add(self, kind: str, seconds: float) -> None:
        self.events.append((self.ctx.step, self.ctx.phase_name, kind, seconds))
        self._since = time.perf_counter()

    def extend_last(self, seconds: float) -> None:
        """Add ``seconds`` to the last collective event (the completion wait of a batch)."""
        for k in range(len(self.events) - 1, -1, -1):
            if self.events[k][2] != "compute":
                step, phase, kind, sec = self.events[k]
                self.events[k] = (step, phase, kind, sec + seconds)
                break
        self._since = time.perf_counter()

    def restart(self) -> None:
        self._since = time.perf_counter()


class RankContext:
    """What a rank's code sees: its rank, the world size, its device ledger and interconnect."""

    def __init__(self, rank: int, n_ranks: int, memory: MemoryLedger, comm):
        self.rank = rank
        self.n_ranks = n_ranks
        self.memory = memory
        # host memory this rank's code holds (P_a+cpu, offload) and its swap files on the NVMe
        # tier (zerospec/offload/); a meta device's are meta too: bytes counted, none held
        tier = "meta" if memory.device.type == "meta" else "cpu"
        self.host = MemoryLedger(tier)
        self.nvme = MemoryLedger(tier)
        self.comm = comm
        self.phase_name = "setup"
        self.failed_phase: str | None = None   # the innermost phase an exception left
        self.step = 0
        self.timeline = Timeline(self)
        self.stream = DEFAULT_STREAM   # the stream this rank's storages are made on now

    @property
    def device(self) -> torch.device:
        return self.memory.device

    @contextlib.contextmanager
    def phase(self, name: str):
        """Mark a phase: collectives inside are booked under it; memory is snapshotted at its end."""
        outer = self.phase_name
        self.timeline.mark_compute()
        self.phase_name = name
        try:
            yield
        except BaseException:
            self.failed_phase = self.failed_phase or name
            raise
        finally:
            self.timeline.mark_compute()
            self.memory.snapshot(f"{name}@{self.step}")
            self.phase_name = outer


    @contextlib.contextmanager
    def on_stream(self, name: str):
        """Storages made inside are made on stream ``name`` (a side stream of the owner's: FSDP2's
        all-gather and reduce-scatter outputs); the allocator model reuses a block only on the
        stream it was made on (zerospec/runtime/allocator.py). The arithmetic is unchanged."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"a stream is a non-empty name, got {name!r}")
        outer, self.stream = self.stream, name
        try:
            yield
        finally:
            self.stream = outer


class GroupView:
    """A rank's context seen through one group of the 2-D grid (comm/groups.py): ``rank`` and
    ``n_ranks`` are its place in the group and the group's size, ``comm`` the group's
    interconnect; memory, phase, step and timeline are the rank's own. ZeRO's stages get the DP
    group's view, so the same stage code shards over N_d ranks whatever N_m is (C11)."""

    def __init__(self, ctx, comm):
        self._ctx = ctx
        self.comm = comm

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def n_ranks(self) -> int:
        return self.comm.n_ranks

    @property
    def global_rank(self) -> int:
        return self._ctx.rank

    def __getattr__(self, name):
        return getattr(self._ctx, name)
