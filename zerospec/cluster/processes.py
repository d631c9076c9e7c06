"""Run a function on N real processes (127.0.0.1, torch.distributed) and get every rank's result.

``launch(fn, n)`` starts N processes, each with a process group (gloo, or NCCL on GPUs) and a
:class:`~zerospec.runtime.context.RankContext` whose interconnect is the torch.distributed backend, calls
``fn(ctx, *args)`` and returns the N return values in rank order — the process-level twin of
``VirtualCluster.run``. ``train_processes(cfg)`` runs ``train.py``'s per-rank step that way and
returns the same :class:`~zerospec.training.run.Result` as ``train(cfg)``.

Processes come from a *forkserver* that has imported torch once: a fresh interpreter per rank
pays torch's import again (spec/engine.md, "Starting ranks"), and forking the caller itself would
copy its threads and OpenMP state. Results travel as files
(``torch.save``), so a rank that dies leaves nothing half-written in a pipe.

Failures (design property 6): the launcher hosts the TCPStore. A rank whose own code raises writes
its error to the store and exits at once; its peers' collectives then fail, and the backend names
that rank (see :mod:`zerospec.comm.torch_dist`). A rank killed from outside cannot write, so the
launcher writes for it when it sees the process gone. A rank that hangs outside a collective makes
its peers time out after ``timeout`` s; the launcher then kills it. Either way :func:`launch` raises
:class:`~zerospec.runtime.errors.RankError` naming the rank that failed first, with every rank's fate in
``err.fates``; nothing waits longer than about ``timeout`` + a few seconds.
"""
from __future__ import annotations

import datetime
import multiprocessing
import multiprocessing.connection
import os
import signal
import tempfile
import time
import traceback
from typing import Any, Callable

import torch
import torch.distributed as dist

from ..comm.torch_dist import FAILED_KEY, PeerFailure, check_torch_version, rank_context
from ..runtime.errors import RankError

BACKENDS = ("gloo", "nccl")
GRACE = 2.0    # seconds a rank may outlive its failed peers (time to report its own error)
# what the forkserver imports once, before it forks any rank. A module a rank imports itself is
# imported again in every rank process: autograd's first backward with a gradient argument imports
# symbolic_shapes lazily (0.4 s alone, ~1 s a rank with 4 ranks on 2 cores). Extend with preload().
PRELOAD = ["torch", "torch.distributed", "torch.fx.experimental.symbolic_shapes",
           "zerospec.cluster.processes", "zerospec.training.run"]
_state: dict[str, Any] = {}   # this *child* process's device, store and current context


# -- inside each rank's process -------------------------------------------------------------------
def new_context():
    """A fresh RankContext (new memory and comm ledgers) on this process's group, for a worker
    that runs several trainings in one launch."""
    if "device" not in _state:
        raise RuntimeError("new_context() works only inside a rank process started by launch()")
    ctx = rank_context(_state["device"], store=_state["store"])
    _state["ctx"] = ctx
    return ctx


def _child(rank, n, port, backend, timeout, threads, fn, args, kwargs, outdir) -> None:
    torch.set_num_threads(threads)   # N processes share the machine's cores
    delta = datetime.timedelta(seconds=timeout)
    report: dict[str, Any]
    try:
        store = dist.TCPStore("127.0.0.1", port, n + 1, is_master=False, timeout=delta)
        _state["store"] = store
        device = "cpu"
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
            device = f"cuda:{torch.cuda.current_device()}"
        _state["device"] = device
        dist.init_process_group(backend, store=store, rank=rank, world_size=n, timeout=delta)
        ctx = new_context()
        t0 = time.perf_counter()
        value = fn(ctx, *args, **kwargs)
        report = {"ok": True, "value": value, "seconds": time.perf_counter() - t0}
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the launcher
        ctx = _state.get("ctx")
        # a transport failure is a consequence of someone else's; anything else starts here
        primary = not isinstance(exc, PeerFailure)
        message = f"{type(exc).__name__}: {exc}"
        if primary and "store" in _state:
            try:
                _state["store"].set(FAILED_KEY.format(rank=rank), message[:2000])
            except Exception:  # noqa: BLE001 - the launcher is gone; nobody left to tell
                pass
        report = {"ok": False, "primary": primary, "error": message,
                  # the innermost phase the exception left (phase_name is the outer one by now)
                  "phase": (ctx.failed_phase or ctx.phase_name) if ctx else "setup",
                  "step": ctx.step if ctx else 0,
                  "last_op": (ctx.comm.last_op if ctx else None) or "no collective yet",
                  "traceback": traceback.format_exc()}
    tmp = os.path.join(outdir, f"rank{rank}.pt.tmp")
    try:
        torch.save(report, tmp)
    except Exception as exc:  # noqa: BLE001 - e.g. fn returned something torch.save cannot pickle
        report = {"ok": False, "primary": True, "phase": "result", "step": "-", "last_op": "-",
                  "error": f"the result of rank {rank} could not be saved: {type(exc).__name__}: "
                           f"{exc}", "traceback": traceback.format_exc()}
        torch.save(report, tmp)
    os.replace(tmp, os.path.join(outdir, f"rank{rank}.pt"))   # atomic: never read half-written
    if report["ok"]:
        dist.destroy_process_group()
    else:
        os._exit(1)   # close the sockets now, so peers blocked in a collective fail at once


# -- the launcher ---------------------------------------------------------------------------------
def preload(*modules: str) -> None:
    """Have the forkserver import ``modules`` too, so rank processes do not each import them. Only
    speed: it takes effect if called before the server starts (this process's first :func:`launch`,
    or the report's helper, zerospec/cluster/helper.py)."""
    bad = [m for m in modules if not isinstance(m, str) or not m]
    if bad:
        raise ValueError(f"modules must be non-empty module names, got {bad!r}")
    PRELOAD.extend(m for m in modules if m not in PRELOAD)


def mp_context(start_method: str | None):
    """The multiprocessing context ranks (and the report's helpers) start from: the forkserver
    with PRELOAD imported, where the platform has one; else spawn."""
    method = start_method or ("forkserver" if "forkserver" in multiprocessing.get_all_start_methods()
                              else "spawn")
    mpctx = multiprocessing.get_context(method)
    if method == "forkserver":   # no effect once the server runs; it then already has these
        mpctx.set_forkserver_preload(list(PRELOAD))
    return mpctx


def launch(fn: Callable[..., Any], n_ranks: int, *args, backend: str = "gloo",
           timeout: float = 60.0, torch_threads: int = 1, start_method: str | None = None,
           **kwargs) -> list[Any]:
    """Run ``fn(ctx, *args, **kwargs)`` on ``n_ranks`` processes; return their results in rank
    order, or raise :class:`RankError` naming the rank that failed first. ``fn`` must be picklable
    (a module-level function)."""
    check_torch_version()
    if not isinstance(n_ranks, int) or n_ranks < 1:
        raise ValueError(f"n_ranks must be an integer >= 1, got {n_ranks!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if not 0 < timeout < float("inf"):
        raise ValueError(f"timeout must be a finite number of seconds > 0, got {timeout!r}")
    if not isinstance(torch_threads, int) or torch_threads < 1:
        raise ValueError(f"torch_threads must be an integer >= 1, got {torch_threads!r}")
    if backend == "nccl" and not torch.cuda.is_available():
        raise ValueError("backend 'nccl' needs CUDA, which this machine does not have; use 'gloo'")
    store = dist.TCPStore("127.0.0.1", 0, n_ranks + 1, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=timeout))   # port 0: any free port
    mpctx = mp_context(start_method)
    with tempfile.TemporaryDirectory(prefix="zerospec-launch-") as outdir:
        procs = [mpctx.Process(target=_child, name=f"zerospec-rank{r}", daemon=True,
                               args=(r, n_ranks, store.port, backend, timeout, torch_threads, fn,
                                     args, kwargs, outdir))
                 for r in range(n_ranks)]
        try:
            for p in procs:
                p.start()
            reports = _supervise(procs, store, timeout, outdir)
        finally:   # interrupted (Ctrl-C) or failed here: leave no rank process behind
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join()
    if all(rep["ok"] for rep in reports):
        return [rep["value"] for rep in reports]
    raise _rank_error(reports)


def _read(outdir: str, rank: int) -> dict | None:
    path = os.path.join(outdir, f"rank{rank}.pt")
    if not os.path.exists(path):
        return None
    return torch.load(path, map_location="cpu", weights_only=False)


def _death(code: int) -> str:
    if code < 0:
        return f"process killed by {signal.Signals(-code).name}"
    return f"process exited with code {code} without a result"


def _supervise(procs, store, timeout: float, outdir: str) -> list[dict]:
    """Wait for every rank; name dead ranks in the store; kill ranks that outlive a failure."""
    n = len(procs)
    reports: list[dict | None] = [None] * n
    failed_at = None
    while any(r is None for r in reports):
        alive = [p.sentinel for p, rep in zip(procs, reports) if rep is None]
        multiprocessing.connection.wait(alive, timeout=0.1)
        now = time.monotonic()
        for r, p in enumerate(procs):
            if reports[r] is not None or p.exitcode is None:
                continue
            rep = _read(outdir, r)
            if rep is None:   # died without a word (killed, or os._exit): say so for its peers
                rep = {"ok": False, "primary": True, "error": _death(p.exitcode), "phase": "?",
                       "step": "?", "last_op": "unknown", "traceback": ""}
                store.set(FAILED_KEY.format(rank=r), rep["error"])
            reports[r] = rep
            if not rep["ok"] and failed_at is None:
                failed_at = now
        if failed_at is None:
            continue
        pending = [r for r in range(n) if reports[r] is None]
        others_done = all(reports[r] is not None for r in range(n) if r not in pending)
        # peers of a failed rank fail within `timeout` (the process group's); a rank still running
        # once everyone else has reported, or long after, is stuck outside any collective
        if pending and ((others_done and now - failed_at > GRACE) or now - failed_at > timeout + GRACE):
            for r in pending:
                procs[r].kill()
                procs[r].join()
                reports[r] = {"ok": False, "primary": True, "phase": "?", "step": "?",
                              "last_op": "unknown", "traceback": "", "killed": True,
                              "error": f"still running {now - failed_at:.1f} s after its peers "
                                       f"failed (hung outside a collective?); killed by the launcher"}
    for p in procs:
        p.join()
    return reports


def _rank_error(reports: list[dict]) -> RankError:
    """The first failure: a rank's own error or death, else a hung rank, else a transport error."""
    failed = [r for r, rep in enumerate(reports) if not rep["ok"]]
    primary = [r for r in failed if reports[r]["primary"] and not reports[r].get("killed")]
    hung = [r for r in failed if reports[r].get("killed")]
    root = (primary or hung or failed)[0]
    rep = reports[root]
    fates = {r: ("ok" if x["ok"] else x["error"]) for r, x in enumerate(reports)}
    others = "; ".join(f"rank {r}: {fates[r].splitlines()[0][:300]}" for r in fates if r != root)
    where = (f"in phase {rep['phase']!r} (step {rep['step']}, last collective: {rep['last_op']})"
             if rep["phase"] != "?" else "(a dead or killed process reports no phase)")
    err = RankError(f"rank {root} failed {where}: {rep['error']}\n  other ranks: {others}", root)
    err.fates = fates
    err.traceback = rep.get("traceback", "")
    return err


__all__ = ["launch", "new_context", "mp_context", "BACKENDS"]
