"""Paper-scale models measured, not extrapolated: the stage code on ``meta`` tensors, a few ranks.

``measure(model, stage, n_d)`` runs one training step of ZeRO stage ``stage`` for a GPT of any size
(7.5B, 1T: :mod:`zerospec.model.presets`) with ``device="meta"``: tensors carry shapes and dtypes but no
storage, so the memory ledger counts exactly the bytes a real run would hold and the interconnect
books exactly the traffic it would move, while nothing is allocated and no arithmetic is done.

**Which ranks run.** On meta, a rank's execution depends on its rank only through which slice of
each sharding unit it owns (``Unit.shard``), and what differs between slices is how much of each is
padding. So ranks are grouped into *classes* with the same number of real elements in every unit's
shard; a class is an interval of ranks, cut where some unit's shard turns from all-real to partly
padding to all padding. Typically: ranks 0..N−2, and the padded last rank N−1; plus, for a unit
smaller than N (a LayerNorm at N = 1024), the ranks whose shard is padding only. One rank per class
(its first) runs the unchanged per-rank step :func:`zerospec.training.step.rank_main`, alone, against a
:class:`~zerospec.comm.meta.MetaBackend` (no rendezvous) and a :class:`CommLedger` for the true N.
Stage 0 partitions nothing, so it has one class.

Every other rank's memory ledger is its class representative's. Its communication is the
representative's collective trace (op, dtype, size, phase, step, src) booked again for that rank in
a :class:`CommLedger` of N ranks — the ledger's ring model is where ranks legitimately differ
(an all-reduce of a size that N does not divide sends uneven chunks).
``tests/unit/training/test_scale.py`` checks that this gives ledgers equal (``==``, record by record
and snapshot by snapshot) to running all N ranks as threads through
:class:`~zerospec.cluster.threads.VirtualCluster`.

**Speed.** PyTorch implements many meta kernels in Python (layer norm backward: ~2 ms a call),
and a 1T model makes the same few hundred calls per layer with the same shapes: the step runs
under :class:`~zerospec.runtime.metacache.MetaKernelCache`, which answers repeats of an op with the
same argument metadata without running its kernel (exact by construction; see its module), from
a table shared by every step of the process (``metacache.shared()``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import time

from ..runtime.context import RankContext
from ..comm.groups import Grid
from ..comm.mesh import Mesh
from ..comm.interconnect import Interconnect
from ..comm.ledger import CommLedger
from ..comm.meta import MetaBackend
from ..runtime.errors import RankError
from ..runtime.memory import MemoryLedger
from ..runtime.metacache import MetaKernelCache, import_lazy_modules, shared
from ..runtime.trace import LiveReplay, OOMPoint, RanOut, StorageTrace
from ..model.gpt import GPTConfig
from ..model.units import Sized, Unit
from .step import RankOutput, rank_main
from .config import TrainConfig
from .run import initial_weights, make_batches


LINK_GROUPS = ("host", "nvme")   # a rank's own links (PCIe, its host's NVMe): no collective


# -- which ranks run -------------------------------------------------------------------------------
def rank_classes(units: tuple[Unit, ...], n_d: int, partitioned: bool = True) -> list[range]:
    """Intervals of ranks whose shards hold the same number of real elements in every unit."""
    if not partitioned:
        return [range(n_d)]
    cuts = {0, n_d}
    for u in units:
        full = u.numel // u.chunk              # ranks 0..full-1 own real elements only
        cuts.update(r for r in (full, full + (u.numel % u.chunk > 0)) if 0 < r < n_d)
    cuts = sorted(cuts)
    return [range(a, b) for a, b in zip(cuts, cuts[1:])]


# -- results ----------------------------------------------------------------------------------------
@dataclasses.dataclass
class RankClass:
    ranks: range
    memory: MemoryLedger
    model_states: int                          # bytes right after setup
    output: RankOutput | None                  # None when only the setup ran
    host: MemoryLedger                         # host memory (P_a+cpu)
    trace: list[tuple]   # per collective: (op, dtype, numel, phase, step, src, group, group size)
    allocations: list | None = None   # measure(trace=True): every storage made and let go, in order
    nvme: MemoryLedger | None = None           # the NVMe tier's swap files (ZeRO-Offload/Infinity)
    oom: OOMPoint | None = None   # measure(capacity=): where its step ran out, and ended

    @property
    def rep(self) -> int:
        return self.ranks[0]


@dataclasses.dataclass
class ScaleResult(Sized):
    config: TrainConfig
    units: tuple[Unit, ...]
    classes: list[RankClass]
    seconds: float
    _comm: CommLedger | None = None
    class_count: int = 0   # rank classes the step has; ``classes`` holds them all but after
    #                        measure(only=i), which steps the i-th alone

    @property
    def complete(self) -> bool:
        """Every rank class of the step was stepped (not ``measure(only=...)``)."""
        return len(self.classes) == self.class_count

    @property
    def grid(self) -> Grid:
        return Mesh.of(self.config).grid

    def rank_class(self, rank: int) -> RankClass:
        """The class of global rank ``rank``: its DP index's (every MP index of a DP index holds
        equal slices, so runs the same)."""
        if not 0 <= rank < self.config.n_ranks:
            raise ValueError(f"rank must be in 0..{self.config.n_ranks - 1}, got {rank}")
        d = self.grid.dp_index(rank) % self.config.shard_size   # MiCS: its place in its group
        found = next((c for c in self.classes if d in c.ranks), None)
        if found is None:
            raise ValueError(f"rank {rank}'s class was not stepped: this result holds "
                             f"{len(self.classes)} of the step's {self.class_count} rank classes "
                             f"(ranks {[c.ranks for c in self.classes]}; measure(only=...))")
        return found

    def model_states(self, rank: int = 0) -> int:
        return self.rank_class(rank).model_states

    def memory(self, rank: int = 0) -> MemoryLedger:
        return self.rank_class(rank).memory

    def host(self, rank: int = 0) -> MemoryLedger:
        """The rank's host-memory ledger (P_a+cpu's checkpoints)."""
        return self.rank_class(rank).host

    def nvme(self, rank: int = 0) -> MemoryLedger:
        """The rank's NVMe ledger (the swap files of zerospec/offload/)."""
        return self.rank_class(rank).nvme

    def comm_ledger(self, ranks=None) -> CommLedger:
        """The N-rank ledger with the given ranks' collectives booked (all ranks by default)."""
        if ranks is None and self._comm is not None:
            return self._comm
        mesh, cfg = Mesh.of(self.config), self.config
        ledger = CommLedger(mesh.n_ranks, cfg.gpus_per_node)
        for r in range(mesh.n_ranks) if ranks is None else ranks:
            rings = {}
            for op, dtype, numel, phase, step, src, group, n in self.rank_class(r).trace:
                ring = rings.get(group) or rings.setdefault(group, mesh.group(group, r).ranks)
                k = ring.index(r)
                ledger.book(r, op, dtype, numel, phase, step, src=src, group=group, n=n,
                            index=0 if group in LINK_GROUPS else k, peer=ring[(k + 1) % len(ring)])
        if ranks is None:
            self._comm = ledger
        return ledger

    def comm_elements(self, rank: int = 0) -> int:
        """Elements ``rank`` sent in the step, under the ring model for the true N."""
        return self.comm_ledger([rank]).elements(rank)

    def collectives(self, rank: int = 0) -> int:
        return len(self.rank_class(rank).trace)


class _SetupDone(Exception):
    pass


class _SetupOnlyContext(RankContext):
    """Stops the per-rank step where its first phase after setup begins."""

    def phase(self, name: str):
        if name != "setup":
            raise _SetupDone
        return super().phase(name)


# -- running ----------------------------------------------------------------------------------------
def measure(config: TrainConfig, *, micro_batch: int = 1, setup_only: bool = False,
            cache_kernels: bool = True, trace: bool = False, only: int | None = None,
            count_in: int | None = None, capacity: int | None = None) -> ScaleResult:
    """One step of ``config`` on its N meta GPUs (see the module doc): ``config`` runs with
    ``device="meta"`` and one step, each rank on ``micro_batch`` sequences per micro-step.

    Every section applies as in training; host and NVMe ledgers hold meta tensors and the NVMe
    tier writes no file (:class:`~zerospec.offload.nvme.MetaSwap`): bytes booked, none moved.
    Every MP index of a DP index holds equal slices, so MP index 0 stands for all of them; with
    MiCS the ranks of the first partition group stand for every replica.
    ``setup_only``: stop after the stages have allocated their model states (enough for C15's
    Table 1, whose cells are model states only; the step does not change them).
    ``cache_kernels``: answer repeated meta kernels from :class:`MetaKernelCache`, with what the
    process's earlier steps found (``metacache.shared()``).
    ``trace``: record each class's allocation trace for the caching allocator model
    (zerospec/runtime/trace.py; fragmentation, C30, C37): ``RankClass.allocations``, every
    storage (:class:`~zerospec.runtime.trace.StorageTrace`), and ``memory.trace``, the ledger's.
    ``only``: step the rank class of this index alone (0: the first, in rank order), for a caller
    that stops once one class settles what it asks (zerospec/evaluation/cached_memory.py); the
    result's ``class_count`` says how many the step has (``complete`` is then False unless it has
    one). A rank of another class is refused by ``rank_class`` and what reads it.
    ``count_in``: with ``count_flops``, count the ops of this rank class's step alone (its index,
    as ``only``); the others step without the op counter, which changes no byte of a ledger
    (tests/unit/evaluation/test_timing.py), for a caller that times one rank (evaluation/runs.py).
    ``capacity`` (with ``trace``): replay each class's trace live on a device of this many bytes
    (:class:`~zerospec.runtime.replay.LiveReplay`) and end its step at the first OutOfMemory:
    ``RankClass.oom``, with its ledger, trace and collectives up to there and no ``output``.
    """
    if not isinstance(micro_batch, int) or micro_batch < 1:
        raise ValueError(f"micro_batch (sequences per rank) must be an integer >= 1, "
                         f"got {micro_batch!r}")
    if capacity is not None and not trace:
        raise ValueError(f"capacity ({capacity!r}) replays the storage trace live: it needs "
                         f"trace=True")
    import_lazy_modules()      # cached or not: no import inside the step (metacache.py)
    n_d, n_m = config.n_d, config.n_m
    cfg = config.replace(device="meta", steps=1,
                         global_batch=micro_batch * n_d * config.grad_accum_steps)
    units = cfg.units()
    init, batches = initial_weights(cfg, units), make_batches(cfg)
    ledger, backend = CommLedger(cfg.n_ranks, cfg.gpus_per_node), MetaBackend(cfg.n_ranks)
    every = rank_classes(units, cfg.shard_size, partitioned=units[0].pad)
    if only is not None and not (isinstance(only, int) and 0 <= only < len(every)):
        raise ValueError(f"only (a rank class's index) must be in 0..{len(every) - 1}: the step "
                         f"has {len(every)} rank classes ({every}), got {only!r}")
    if count_in is not None and not (isinstance(count_in, int) and 0 <= count_in < len(every)):
        raise ValueError(f"count_in (a rank class's index) must be in 0..{len(every) - 1}: the "
                         f"step has {len(every)} rank classes ({every}), got {count_in!r}")
    uncounted = cfg.replace(count_flops=False) if count_in is not None else cfg
    t0 = time.perf_counter()
    classes = []
    kernels = MetaKernelCache(shared()) if cache_kernels else None
    # traced: the trace runs each op through the cache itself (one Python mode an op, not two)
    with kernels if kernels is not None and not trace else contextlib.nullcontext():
        for i in range(len(every)) if only is None else (only,):
            ranks, r = every[i], every[i][0] * n_m      # r: the DP index's MP rank 0
            make = _SetupOnlyContext if setup_only else RankContext
            ctx = make(r, cfg.n_ranks, MemoryLedger("meta", trace=trace), None)
            ctx.comm = Interconnect(ctx, backend, ledger)
            live = LiveReplay(capacity) if capacity is not None else None
            with StorageTrace(ctx, kernels, live) if trace else contextlib.nullcontext() as seen:
                out = _run_rank(ctx, cfg if count_in in (None, i) else uncounted, units, init,
                                batches)
            recs = ledger.records(r)
            srcs = iter(backend.srcs[r])       # the backend saw every collective, not host copies
            colls = [(c.op, c.dtype, c.numel, c.phase, c.step,
                      0 if c.group in LINK_GROUPS else next(srcs), c.group, c.group_size) for c in recs]
            states = out.model_states if out is not None else ctx.memory.model_states()
            classes.append(RankClass(ranks, ctx.memory, states, out, ctx.host, colls,
                                     seen.trace if seen is not None else None, ctx.nvme,
                                     seen.oom if seen is not None else None))
    return ScaleResult(cfg, units, classes, time.perf_counter() - t0, class_count=len(every))


def _run_rank(ctx, cfg, units, init, batches) -> RankOutput | None:
    try:
        return rank_main(ctx, cfg, units, init, batches)
    except (_SetupDone, RanOut):    # the step ends there by design: setup_only, capacity
        return None
    except Exception as exc:
        last = ctx.comm.last_op or "no collective yet"
        phase = getattr(ctx, "failed_phase", None) or ctx.phase_name
        raise RankError(f"meta rank {ctx.rank} of {ctx.n_ranks} failed in phase {phase!r} "
                        f"(last collective: {last}): {type(exc).__name__}: {exc}", ctx.rank) from exc


def measure_stages(config: TrainConfig, stages=(0, 1, 2, 3), **how) -> dict[int, ScaleResult]:
    """``measure`` of ``config`` at each of ``stages``."""
    return {s: measure(config.replace(stage=s), **how) for s in stages}
