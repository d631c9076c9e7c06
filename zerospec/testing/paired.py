"""zerospec's engine against its peer, step by step in the same processes (the engine benchmark).

Timed one after the other, each side in a run of its own, the two halves of a comparison sit
seconds apart, and a shared machine's speed moves within minutes, so such rounds' ratios swing
widely. Here every rank
alternates: zerospec's step s, then the peer's step s, then zerospec's step s + 1 …, so the two
steps of a pair are timed within a tenth of a second of each other, on the same processes, after
the same other work (each side always follows the other's step, so neither finds its own data warm
in cache). Both train the same model and data with the same Adam hyper-parameters from the same
initial weights (:mod:`.oracles`); their collectives interleave on the one process group in the
same order on every rank.

The ranks do not meet at a pair's boundaries (a barrier there would be a collective of its own in
every interval): a rank done early starts its next step while others finish theirs, and waits at
its first collective, so one side's straggling can land in the other side's wall time. The
processes' CPU time, which holds no waiting, is returned beside it as the check.
"""
from __future__ import annotations

import time

from ..cluster import processes
from .oracles import peer_steps


def paired_rank(ctx, cfg, optimizer: str = "torch") -> dict[str, list[float]]:
    """In one rank's process: ``cfg.steps`` steps of zerospec stage ``cfg.stage``, each followed by
    the same step of its peer. Returns this rank's seconds per step, ``ours`` and ``peer`` (wall)
    and ``ours_cpu`` and ``peer_cpu`` (the process's CPU time), and both sides' losses."""
    from ..training import run as train
    peer = peer_steps(cfg.stage, cfg, weights=False, count=False, optimizer=optimizer)
    units = cfg.units()
    init, batches = train.initial_weights(cfg, units), train.make_batches(cfg)
    times: dict[str, list[float]] = {"ours": [], "peer": [], "ours_cpu": [], "peer_cpu": []}
    start = [time.perf_counter(), time.process_time()]
    record: dict = {}                            # the peer's, as run_peer returns it

    def on_step(step, stage) -> None:
        t, c = time.perf_counter(), time.process_time()
        times["ours"].append(t - start[0])      # step 1 includes zerospec's set-up
        times["ours_cpu"].append(c - start[1])
        record.update(next(peer))               # its first step builds the peer too
        start[:] = time.perf_counter(), time.process_time()
        times["peer"].append(start[0] - t)
        times["peer_cpu"].append(start[1] - c)

    out = train.rank_main(ctx, cfg, units, init, batches, on_step)
    return {**times, "losses": [float(x) for x in out.losses],
            "peer_losses": [float(x) for x in record["losses"]]}


def paired(cfg, optimizer: str = "torch", **launch_kw) -> list[dict[str, list[float]]]:
    """Launch ``cfg.n_d`` gloo processes running :func:`paired_rank`; every rank's record."""
    launch_kw.setdefault("timeout", cfg.timeout)
    return processes.launch(paired_rank, cfg.n_d, cfg, optimizer, **launch_kw)
