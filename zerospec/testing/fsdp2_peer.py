"""The peer of stage 3's FSDP2 flavour (zerospec/zero/fsdp2.py): ``fully_shard`` as torchtitan
applies it, on gloo processes.

torchtitan's ``apply_fsdp`` (``torchtitan/parallelisms/parallelize_llama.py`` at 9dec370) wraps
every transformer block with ``reshard_after_forward = layer_id < n_layers - 1`` and then the
whole model (the root: embeddings, final norm, LM head), all with
``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``. The module is zerospec's GPT as in
:mod:`zerospec.testing.oracles`; its Adam is zerospec's arithmetic (:class:`oracles.ZerospecAdam`)
on FSDP2's fp32 sharded parameters, so the comparison isolates the engine: what is gathered in
which dtype, how gradients are cast and averaged.

``cfg.hpz`` = h > 1: the blocks torchtitan reshards get the integer ``reshard_after_forward = h``
(hpZ). ``cfg.grad_accum_steps`` = G: G forward-backwards per step, each loss divided by G
(torchtitan's ``rescale_accumulated_loss``, with no ``set_requires_gradient_sync``), micro-step k
of rank r on zerospec's rows (global micro-batch k·N + r, training/step.py).
``cfg.offload_optimizer`` = "cpu": every ``fully_shard`` with ``CPUOffloadPolicy``.
``comms`` = (all-gather, reduce-scatter), either None: FSDP2's custom collectives
(``FSDPModule.set_custom_all_gather`` / ``set_custom_reduce_scatter``) on every wrapped module,
objects of its ``AllGather`` / ``ReduceScatter`` protocol the caller writes (qwZ, qgZ:
tests/engine/test_fsdp2_quant_peer.py).
"""
from __future__ import annotations

import warnings

import torch
import torch.distributed as dist

from ..cluster import processes
from ..model.data import BigramData
from .oracles import GPT, ZerospecAdam, full_weights, mean_losses, zerospec_rank, zerospec_row


def build(cfg, comms=(None, None)):
    """(model, zerospec's Adam) wrapped as torchtitan wraps Llama, on this process group."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import (CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy,
                                        fully_shard)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    policy = MixedPrecisionPolicy(param_dtype=cfg.policy.dtype, reduce_dtype=torch.float32)
    # the flavour's offload is CPUOffloadPolicy (zero/fsdp2_offload.py); not pinned: pin_memory()
    # raises without an accelerator, and decides only whether host pages are locked and the
    # D2H copy is asynchronous
    off = {"offload_policy": CPUOffloadPolicy(pin_memory=False) if cfg.offload_optimizer == "cpu"
           else OffloadPolicy()}
    model = GPT.from_init(cfg.model, cfg.seed)
    last, h = len(model.h) - 1, cfg.hpz if cfg.hpz > 1 else True
    for i, blk in enumerate(model.h):
        fully_shard(blk, mesh=mesh, mp_policy=policy,
                    reshard_after_forward=h if i < last else False, **off)
    # torchtitan passes True for the root; the benchmark's torch (1963fc8) kept the root unsharded
    # after forward whatever it was given, torch 2.13 only for the default (None, _fsdp_state.py
    # l.205): None runs the benchmark's rule here
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=None, **off)
    all_gather, reduce_scatter = comms
    for m in (*model.h, model):
        if all_gather is not None:
            m.set_custom_all_gather(all_gather)
        if reduce_scatter is not None:
            m.set_custom_reduce_scatter(reduce_scatter)
    return model, ZerospecAdam(model.parameters(), cfg.adam)


def peer_run(cfg, comms=(None, None)) -> dict:
    """``cfg.steps`` steps of the peer: this rank's losses and the full fp32 weights after each."""
    rank, n = dist.get_rank(), dist.get_world_size()
    model, opt = build(cfg, comms)
    data = BigramData(cfg.model.vocab_size, cfg.model.block_size, cfg.seed)
    out = {"losses": [], "weights": []}
    g = cfg.grad_accum_steps
    for step in range(cfg.steps):
        opt.zero_grad(set_to_none=True)        # torchtitan's order: at the start of the step
        idx, tgt = data.batch(step, cfg.batch)
        mb, micro = idx.shape[0] // (n * g), []
        for k in range(g):
            rows = slice((k * n + rank) * mb, (k * n + rank + 1) * mb)
            loss = model(idx[rows], tgt[rows])
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", "Full backward hook is firing")
                (loss / g if g > 1 else loss).backward()
            micro.append(loss.detach())
        opt.step()
        out["losses"].append(micro[0] if g == 1 else torch.stack(micro).mean())
        out["weights"].append(full_weights(model))
    return out


def _compare_rank(ctx, cfg, comms) -> dict:
    return {"zerospec": zerospec_rank(ctx, cfg, count=False, weights=True),
            "peer": peer_run(cfg, comms)}


def compare(cfg, comms=(None, None)) -> dict:
    """Launch ``cfg.n_d`` gloo processes: zerospec's run of ``cfg`` (losses, weights after every
    step) and the peer's, as ``{"zerospec": row, "peer": {"losses", "weights"}}``."""
    per_rank = processes.launch(_compare_rank, cfg.n_d, cfg, comms, timeout=cfg.timeout)
    row = zerospec_row(cfg, cfg.stage, [x["zerospec"] for x in per_rank], True)
    peers = [x["peer"] for x in per_rank]
    return {"zerospec": row, "peer": {"losses": mean_losses(peers, cfg),
                                      "weights": peers[0]["weights"]}}
