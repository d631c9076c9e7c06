"""Continuing a run from a checkpoint: what it records besides tensors, and what must match.

A resumed run must continue the same model, the same data stream (seed and global batch: batch
``s`` of the stream is the same whatever N is) and the same loss-scaling regime. The number of
ranks, the stage and the accumulation steps may change — that is what resharding is for
(spec/checkpoints.md says when the continuation is bit-identical to the original run). With model
parallelism N_d may change and N_m may not: the checkpoint holds Megatron slices for its N_m, and
a run at another N_m would sum its row-parallel partials in another order anyway, so it could not
continue the original run's bits (unshard/shard could reslice the state; refused instead).
"""
from __future__ import annotations

from .state import unit_spec


def meta(cfg, step: int, updater) -> dict:
    """What a checkpoint records besides tensors (the same on every rank)."""
    return {"step": step, "optim_step": updater.optim_step, "stage": cfg.stage, "n_ranks": cfg.n_d,
            "n_m": cfg.n_m,
            "precision": cfg.precision,
            "scaler": updater.scaler.state_dict() if updater.scaler is not None else None,
            "data": {"seed": cfg.seed, "global_batch": cfg.batch}}


def check(cfg, state) -> None:
    """A resumed run must continue the same model and data stream; say what differs."""
    n = getattr(state, "n_ranks", cfg.n_d)
    if n != cfg.n_d:
        raise ValueError(f"checkpoint was loaded for n_ranks={n} but the config has n_d={cfg.n_d}")
    n_m = state.meta.get("n_m", 1)
    if n_m != cfg.n_m:
        raise ValueError(f"the checkpoint was written at n_m={n_m} (model-parallel degree) but the "
                         f"config has n_m={cfg.n_m}: a checkpoint resumes at another n_d with the "
                         f"same n_m (its files hold the Megatron slices of n_m={n_m})")
    if state.spec != unit_spec(cfg.model, cfg.n_m, cfg.tiles):
        raise ValueError("the checkpoint's model layout differs from cfg.model "
                         "(checkpoint.load(dir, model=cfg.model) names the difference)")
    data = {"seed": cfg.seed, "global_batch": cfg.batch}
    if state.meta["data"] != data:
        raise ValueError(f"the checkpoint continues data stream {state.meta['data']}, the config "
                         f"asks for {data}: set seed and global_batch to match")
    if state.meta["precision"] != cfg.precision:
        raise ValueError(f"checkpoint holds {state.meta['precision']} training state; the config "
                         f"asks for precision={cfg.precision!r}")
    if (state.meta["scaler"] is None) != (cfg.loss_scale is None):
        raise ValueError(f"the checkpoint has loss-scaler state {state.meta['scaler']} but the config "
                         f"has loss_scale={cfg.loss_scale}: both or neither")
    if not state.step < cfg.steps:
        raise ValueError(f"the checkpoint is at step {state.step}; cfg.steps={cfg.steps} leaves "
                         f"nothing to run")
