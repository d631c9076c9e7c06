"""Per-rank functions the engine tests launch. Module level, so the rank processes can import them."""
from __future__ import annotations

import os
import signal
import time

import torch
import torch.distributed as dist

from zerospec.training import run as tr


def collectives(ctx) -> dict:
    """Each Interconnect op once, on inputs whose results are worked out by hand in the test."""
    r, n = ctx.rank, ctx.n_ranks
    out = {}
    x = torch.arange(5, dtype=torch.float16) + 10 * r       # rank r: [10r, 10r+1, ..., 10r+4]
    out["all_reduce_sum"] = ctx.comm.all_reduce(x.clone(), "sum")
    out["all_reduce_mean"] = ctx.comm.all_reduce(x.clone(), "mean")
    out["all_reduce_max"] = ctx.comm.all_reduce(x.clone(), "max")
    y = torch.full((2 * n,), float(r + 1))                  # rank r: all r+1
    chunk = torch.empty(2)
    out["reduce_scatter_mean"] = ctx.comm.reduce_scatter(chunk, y, "mean").clone()
    full = torch.empty(3 * n, dtype=torch.float16)
    out["all_gather"] = ctx.comm.all_gather(full, torch.full((3,), float(r), dtype=torch.float16))
    own = torch.zeros(2 * n)                                # gather into the buffer we read from
    own[2 * r:2 * r + 2] = r
    out["all_gather_aliased"] = ctx.comm.all_gather(own, own[2 * r:2 * r + 2]).clone()
    b = torch.full((4,), float(r))
    out["broadcast"] = ctx.comm.broadcast(b, src=n - 1)
    ctx.comm.barrier()
    out["records"] = ctx.comm.ledger.records(r)
    return out


def fp16_sums(ctx) -> dict:
    """4 ranks hold 2048, 2048, 0.5, 2050 (fp16): the exact sum 6148.5 rounds once to 6148; every
    order of fp16 additions (sequential or pairwise) gives 6144. Backend vs raw gloo."""
    h = torch.tensor([[2048.0, 2048.0, 0.5, 2050.0][ctx.rank]], dtype=torch.float16)
    raw = h.clone()
    dist.all_reduce(raw)
    return {"backend": ctx.comm.all_reduce(h, "sum").item(), "raw": raw.item()}


def gloo_orders(ctx) -> dict:
    """Raw gloo: reduce-scatter vs the slice of an all-reduce (same length), and the backend's
    unpadded all-reduce vs its reduce-scatter of the padded vector."""
    r, n = ctx.rank, ctx.n_ranks
    g = torch.Generator().manual_seed(11 + r)
    numel = 4099                                   # divides by no N > 1 we use
    padded = -(-numel // n) * n
    x = torch.zeros(padded)
    x[:numel] = torch.randn(numel, generator=g) * torch.exp(3 * torch.randn(numel, generator=g))
    ar = x.clone()
    dist.all_reduce(ar)
    rs = torch.empty(padded // n)
    getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)(rs, x.clone())
    c = padded // n
    mine = ctx.comm.all_reduce(x[:numel].clone(), "mean")
    chunk = ctx.comm.reduce_scatter(torch.empty(c), x.clone(), "mean")
    return {"raw_equal": torch.equal(rs, ar[r * c:(r + 1) * c]),
            "backend_equal": torch.equal(chunk, torch.cat([mine, torch.zeros(padded - numel)])[r * c:(r + 1) * c])}


def batched_calls(ctx) -> dict:
    """The same collectives one by one and inside one batch (which gloo sends fused): which
    outputs differ, and what the ledger says carried each collective. Lengths: a small-model
    unit, units whose ring chunks straddle their shards (odd length / N), and one over 2N MiB
    (gloo: > 2 segments per rank) fused with others."""
    r, n = ctx.rank, ctx.n_ranks
    g = torch.Generator().manual_seed(5 + r)

    def rand(numel, dtype=torch.float32):   # magnitudes over many binades: order shows in the bits
        x = torch.randn(numel, generator=g, dtype=torch.float64)
        return x.mul_(torch.randint(-12, 12, (numel,), generator=g, dtype=torch.int8).double().exp2_()).to(dtype)

    big = n * 300_001        # fp64: 2.4·n MB, over gloo's 2 segments of at most 1 MiB per rank
    ins = {"ar_unit": rand(139_264), "ar_odd": rand(5 * n + 3, torch.float16), "rs_odd": rand(9 * n),
           "ar_sum": rand(37), "ag": rand(1_001, torch.float16), "ar_odd64": rand(7 * n + 1, torch.float64),
           "rs_big": rand(big, torch.float64), "rs_small": rand(n, torch.float64)}

    def calls(comm) -> dict:
        o = {k: v.clone() for k, v in ins.items()}
        comm.all_reduce(o["ar_unit"], "mean")
        comm.all_reduce(o["ar_odd"], "mean")
        o["rs_odd_out"] = comm.reduce_scatter(torch.empty(9), o["rs_odd"], "mean")
        comm.all_reduce(o["ar_sum"], "sum")                  # another op: a group of its own
        o["ag_out"] = comm.all_gather(torch.empty(1_001 * n, dtype=torch.float16), o["ag"])
        comm.all_reduce(o["ar_odd64"], "mean")
        o["rs_big_out"] = comm.reduce_scatter(torch.empty(big // n, dtype=torch.float64), o["rs_big"], "mean")
        x = o["rs_small"]                    # output inside its own input
        comm.reduce_scatter(x[r:r + 1], x, "mean")
        return o

    alone = calls(ctx.comm)
    with ctx.comm.batch():
        together = calls(ctx.comm)
    return {"differ": [k for k in alone if not torch.equal(alone[k], together[k])],
            "sent_as": [x.sent_as for x in ctx.comm.ledger.records(r)]}


def fused_send_fails(ctx) -> dict:
    """gloo refuses a batch's fused all-reduce when it is sent: by the next call of another kind,
    then at the end of the batch. What each error names, and whether the rank can go on."""
    from zerospec.runtime.errors import CollectiveError
    r = ctx.rank
    ctx.comm.backend.failure_wait = 0.0     # no peer will report: do not wait for one
    out, real = {}, dist.all_reduce

    def refuse(*args, **kwargs):
        raise RuntimeError("injected: gloo refused the call")

    for case in ("flushed by the gather", "at the end of the batch"):
        dist.all_reduce = refuse
        try:
            with ctx.comm.batch():
                ctx.comm.all_reduce(torch.ones(6), "mean")
                if case == "flushed by the gather":
                    ctx.comm.all_gather(torch.empty(2 * ctx.n_ranks), torch.ones(2))
        except CollectiveError as exc:
            out[case] = str(exc)
        finally:
            dist.all_reduce = real
        # the rank goes on: a plain reduction is sent and reduced, not held for a batch
        out[case + ", then"] = ctx.comm.all_reduce(torch.full((3,), float(r + 1)), "sum").tolist()
    return out


def _run(ctx, cfg, on_step):
    units = cfg.units()
    return tr.rank_main(ctx, cfg, units, tr.initial_weights(cfg, units), tr.make_batches(cfg), on_step)


def raise_at(ctx, cfg, bad_rank: int, step: int):
    """Train; ``bad_rank`` raises after ``step`` while its peers go on into the next collective."""
    def on_step(s, stage):
        if ctx.rank == bad_rank and s == step:
            raise ValueError(f"injected failure on rank {bad_rank}")
    return _run(ctx, cfg, on_step).losses


def die_at(ctx, cfg, bad_rank: int, step: int):
    """Train; ``bad_rank``'s process is killed (SIGKILL: no cleanup, no report) after ``step``."""
    def on_step(s, stage):
        if ctx.rank == bad_rank and s == step:
            os.kill(os.getpid(), signal.SIGKILL)
    return _run(ctx, cfg, on_step).losses


def hang_at(ctx, cfg, bad_rank: int, step: int, seconds: float):
    """Train; ``bad_rank`` sleeps outside any collective after ``step``."""
    def on_step(s, stage):
        if ctx.rank == bad_rank and s == step:
            time.sleep(seconds)
    return _run(ctx, cfg, on_step).losses


def gpu_memory(ctx, cfg) -> dict:
    """On a CUDA device: what the ledger says the stage holds vs what the CUDA allocator holds."""
    from zerospec.zero import STAGES
    units = cfg.units()
    init = tr.initial_weights(cfg, units)
    kw = {"zero1_comm": cfg.zero1_comm} if cfg.stage == 1 else {}
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    stage = STAGES[cfg.stage](ctx, units, init, cfg.adam, cfg.policy, **kw)
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - base
    sizes = [t.untyped_storage().nbytes() for t in _live_tensors(stage)]
    del stage
    # a whole training run on a fresh context: the ledger's peak against the allocator's
    from zerospec.cluster.processes import new_context
    run_ctx = new_context()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = tr.rank_main(run_ctx, cfg, units, init, tr.make_batches(cfg))
    torch.cuda.synchronize()
    return {"ledger_model_states": ctx.memory.model_states(), "ledger_total": ctx.memory.total,
            "allocated": held, "storages": sizes,
            "ledger_peak": run_ctx.memory.peak_total,
            "allocated_peak": torch.cuda.max_memory_allocated() - base,
            "losses": [float(x) for x in out.losses]}


def _live_tensors(stage):
    """The stage's persistent buffers (distinct storages), as the stage code names them."""
    seen, out = set(), []
    for name in ("param16", "grad16", "master", "exp_avg", "exp_avg_sq"):
        for t in getattr(stage, name):
            key = t.untyped_storage().data_ptr()
            if key not in seen:
                seen.add(key)
                out.append(t)
    return out


def raise_in_phase(ctx, rank: int, phase: str) -> None:
    """``rank`` raises inside ``ctx.phase(phase)``; the others wait at a barrier for it."""
    if ctx.rank == rank:
        with ctx.phase(phase):
            raise ValueError(f"injected failure in {phase}")
    ctx.comm.barrier()


def imports_while_training(ctx, cfgs) -> list[str]:
    """The modules this rank process imported while training ``cfgs`` in turn (none, if the
    forkserver's preload covers what a rank needs)."""
    import sys
    before = set(sys.modules)
    tr.train_rank(ctx, cfgs)
    return sorted(set(sys.modules) - before)
