"""torch's own data-parallel engines as oracles: DDP, ZeroRedundancyOptimizer and FSDP2.

:class:`GPT` is :mod:`zerospec.model.gpt` as an ``nn.Module``, with the same math: ``model.block``
and ``model.forward`` repeated op for op, each Linear and LayerNorm called as its submodule (so
wrappers that hook submodules see every use; tests/engine/test_peers.py checks the bits). Module
boundaries follow zerospec's sharding units, so FSDP2 shards the same groups: the root holds the
embedding unit (wte, wpe) — the LM head is tied to wte and used outside any block, which FSDP2
handles only when the tied weight belongs to the root — and every block and the final LayerNorm
is its own FSDP2 unit.

Peer of each stage (fp32, torch.optim.Adam with zerospec's hyper-parameters):

====== ==================================================== ==========================
stage  peer                                                 what it shards
====== ==================================================== ==========================
0      ``DistributedDataParallel`` + Adam                   nothing
1      DDP + ``ZeroRedundancyOptimizer(Adam)``              optimizer states
2      FSDP2 ``fully_shard(reshard_after_forward=False)``   states + grads (+ params between steps)
3      FSDP2 ``fully_shard(reshard_after_forward=True)``    states + grads + params
====== ==================================================== ==========================

:func:`run_peer` trains one on the current process group and returns per-step losses, full weights
and collective counts (``CommDebugMode``); the comparison itself is in tests/engine and spec/engine.md.
"""
from __future__ import annotations

import contextlib
import dataclasses
import time
import warnings
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ..cluster import processes
from ..model import gpt
from ..model.data import BigramData
from ..optim.adam import adam_update, reference_optimizer

# the peers' modules, imported once by the forkserver instead of once by every rank process (alone:
# torch.distributed.optim 0.74 s, torch.distributed.tensor 0.35 s, fsdp 0.41 s of import)
PEER_MODULES = ("torch.distributed.optim", "torch.distributed.fsdp",
                "torch.distributed.tensor.debug")
processes.preload(*PEER_MODULES)

PEERS = {0: "DDP", 1: "ZeroRedundancyOptimizer", 2: "FSDP2(reshard_after_forward=False)",
         3: "FSDP2(reshard_after_forward=True)"}


class Block(nn.Module):
    """One transformer block; parameter names are zerospec's ("ln_1.weight", "attn.c_attn.weight", …)."""

    def __init__(self, cfg: gpt.GPTConfig):
        super().__init__()
        d = cfg.n_embd
        self.cfg = cfg
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.Module()
        self.attn.c_attn, self.attn.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Module()
        self.mlp.c_fc, self.mlp.c_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # model.block, op for op, through the submodules (so wrappers that hook them, as DeepSpeed
        # ZeRO-3's parameter gathering does, see every use): nn.LayerNorm is F.layer_norm(x, (C,),
        # w, b, eps=1e-5) and nn.Linear is F.linear(x, w, b), exactly model.block's calls
        y = gpt.attention(self.attn.c_attn(self.ln_1(x)), self.cfg.n_head)   # (B, T, C)
        x = x + self.attn.c_proj(y)
        h = F.gelu(self.mlp.c_fc(self.ln_2(x)))
        return x + self.mlp.c_proj(h)


class GPT(nn.Module):
    """zerospec's tiny GPT as a module: root = embedding unit, then blocks, then ln_f."""

    def __init__(self, cfg: gpt.GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Parameter(torch.empty(cfg.vocab_size, cfg.n_embd))
        self.wpe = nn.Parameter(torch.empty(cfg.block_size, cfg.n_embd))
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # model.forward, op for op (same ops in the same order give the same bits)
        B, T = idx.shape
        x = F.embedding(idx, self.wte) + F.embedding(torch.arange(T, device=idx.device), self.wpe)
        for blk in self.h:
            x = blk(x)                                                  # (B, T, C)
        x = self.ln_f(x)   # nn.LayerNorm calls F.layer_norm(x, (C,), w, b, eps=1e-5), as model does
        logits = F.linear(x, self.wte)                                  # (B, T, vocab), tied head
        return F.cross_entropy(logits.view(B * T, -1).float(), targets.reshape(-1))

    @classmethod
    def from_init(cls, cfg: gpt.GPTConfig, seed: int) -> "GPT":
        """The module with exactly ``model.init_params(cfg, seed)``."""
        m = cls(cfg)
        init = gpt.init_params(cfg, seed)
        with torch.no_grad():
            for key, p in m.unit_params().items():
                u, name = key.split("/", 1)
                p.copy_(init[u][name])
        return m

    def unit_params(self) -> dict[str, nn.Parameter]:
        """Parameters under zerospec's names, "unit/param" (as in ``Result.master``)."""
        out = {"embed/wte": self.wte, "embed/wpe": self.wpe}
        for i, blk in enumerate(self.h):
            out.update({f"h.{i}/{n}": p for n, p in blk.named_parameters()})
        out.update({f"ln_f/{n}": p for n, p in self.ln_f.named_parameters()})
        return out


class ZerospecAdam(torch.optim.Optimizer):
    """torch.optim's interface around zerospec's own Adam arithmetic (:func:`optim.adam_update`).

    With it a peer differs from zerospec only in its *engine* (bucketing, sharding, reduction
    order), not in how Adam rounds: the comparison isolates what this module is about.
    """

    def __init__(self, params, cfg):
        super().__init__(params, {})
        self.cfg = cfg

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if not st:
                    st["step"] = 0
                    st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                st["step"] += 1
                adam_update(p, st["exp_avg"], st["exp_avg_sq"], p.grad, st["step"], self.cfg)


def full_weights(model: GPT) -> dict[str, torch.Tensor]:
    """Every weight, whole, on every rank (FSDP2's DTensors are gathered: a collective)."""
    out = {}
    for k, p in model.unit_params().items():
        t = p.detach()
        out[k] = (t.full_tensor() if hasattr(t, "full_tensor") else t).clone()
    return out


OPTIMIZERS = ("torch", "zerospec")


def build(stage: int, cfg, optimizer: str = "torch"):
    """(model, optimizer) of the peer of zerospec stage ``stage``, on the current process group.
    ``optimizer``: "torch" (torch.optim.Adam) or "zerospec" (:class:`ZerospecAdam`)."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    model = GPT.from_init(cfg.model, cfg.seed)
    a = cfg.adam

    def adam(params):
        return reference_optimizer(params, a) if optimizer == "torch" else ZerospecAdam(params, a)
    if stage in (0, 1):
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(model)
        if stage == 0:
            return model, adam(model.parameters())
        from torch.distributed.optim import ZeroRedundancyOptimizer
        if optimizer == "zerospec":
            return model, ZeroRedundancyOptimizer(model.parameters(), optimizer_class=ZerospecAdam,
                                                  cfg=a)
        return model, ZeroRedundancyOptimizer(
            model.parameters(), optimizer_class=torch.optim.Adam, lr=a.lr, betas=(a.beta1, a.beta2),
            eps=a.eps, weight_decay=a.weight_decay, foreach=False)
    if stage in (2, 3):
        from torch.distributed.fsdp import fully_shard
        for mod in [*model.h, model.ln_f]:
            fully_shard(mod, reshard_after_forward=stage == 3)
        fully_shard(model, reshard_after_forward=stage == 3)
        return model, adam(model.parameters())
    raise ValueError(f"stage must be one of {sorted(PEERS)}, got {stage!r}")


# c10d op names (as CommDebugMode reports them) -> the Interconnect's names
C10D_OPS = {"allreduce_": "all_reduce", "_reduce_scatter_base_": "reduce_scatter",
            "reduce_scatter_tensor_coalesced_": "reduce_scatter", "_allgather_base_": "all_gather",
            "allgather_into_tensor_coalesced_": "all_gather", "broadcast_": "broadcast",
            "barrier": "barrier"}


def _counts(mode) -> dict[str, int]:
    out: dict[str, int] = {}
    for op, c in mode.get_comm_counts().items():
        name = str(op).split(".")[-1]
        name = C10D_OPS.get(name, name)
        out[name] = out.get(name, 0) + c
    return out


def run_peer(stage: int, cfg, *, weights: bool = True, count: bool = True,
             optimizer: str = "torch") -> dict:
    """Train the peer of ``stage`` for ``cfg.steps`` steps on this process group.

    Returns this rank's ``losses`` (fp32 scalars), ``weights`` after every step (full, if asked),
    ``counts`` of the last step (phase → op → collectives, from ``CommDebugMode``; None unless
    ``count``) and ``seconds`` per step.
    """
    out: dict = {}
    for out in peer_steps(stage, cfg, weights=weights, count=count, optimizer=optimizer):
        pass
    return out


def peer_steps(stage: int, cfg, *, weights: bool = True, count: bool = True,
               optimizer: str = "torch"):
    """:func:`run_peer` one step at a time: each ``next()`` trains the next step (the first also
    builds the peer) and yields the record so far, the same dict each time — for a caller that
    interleaves the peer's steps with its own (zerospec/testing/paired.py)."""
    from torch.distributed.tensor.debug import CommDebugMode
    rank, n = dist.get_rank(), dist.get_world_size()
    if cfg.n_d != n:
        raise ValueError(f"config n_d={cfg.n_d} but the process group has {n} ranks")
    model, opt = build(stage, cfg, optimizer)
    module = model.module if hasattr(model, "module") else model
    data = BigramData(cfg.model.vocab_size, cfg.model.block_size, cfg.seed)
    out = {"losses": [], "weights": [], "counts": None, "seconds": []}

    for step in range(cfg.steps):
        # counting wraps every op in a dispatch mode (~2x slower): only the last, steady step
        counted = count and step == cfg.steps - 1

        def phase():
            return CommDebugMode() if counted else contextlib.nullcontext()

        idx, tgt = data.batch(step, cfg.batch)
        t0 = time.perf_counter()
        with phase() as fwd:
            loss = model(BigramData.shard(idx, rank, n), BigramData.shard(tgt, rank, n))
        with phase() as bwd, warnings.catch_warnings():
            # CommDebugMode's module tracker warns that no *input* needs a gradient: true, harmless
            warnings.filterwarnings("ignore", "Full backward hook is firing")
            loss.backward()
        with phase() as stp:
            opt.step()
            opt.zero_grad(set_to_none=True)
        out["seconds"].append(time.perf_counter() - t0)
        if counted:
            out["counts"] = {"forward": _counts(fwd), "backward": _counts(bwd), "step": _counts(stp)}
        out["losses"].append(loss.detach())
        if weights:
            out["weights"].append(full_weights(module))
        yield out


# -- zerospec next to its peer, in the same processes ---------------------------------------------
# zerospec's phases, grouped like the peer's (its gradient sync and parameter sync happen inside
# backward and optimizer.step there)
PHASE_GROUP = {"forward": "forward", "backward": "backward", "grad_sync": "backward",
               "step": "step", "param_sync": "step"}


def zerospec_rank(ctx, cfg, *, count: bool, weights: bool) -> dict:
    """zerospec's own per-rank run (train.rank_main), with per-step weights, counts and times."""
    from torch.distributed.tensor.debug import CommDebugMode

    from ..training import run as train
    units = cfg.units()
    init, batches = train.initial_weights(cfg, units), train.make_batches(cfg)
    rec = {"weights": [], "stamps": []}

    mode = CommDebugMode()

    def on_step(step, stage):
        rec["stamps"].append(time.perf_counter())
        if weights:
            rec["weights"].append([(sl, m.detach().clone()) for sl, m in stage.owned_master()])
        if count and step == cfg.steps - 1:    # count the last step only, as for the peer
            mode.__enter__()
        if count and step == cfg.steps:
            mode.__exit__(None, None, None)

    if count and cfg.steps == 1:
        mode.__enter__()
    t0 = time.perf_counter()
    out = train.rank_main(ctx, cfg, units, init, batches, on_step)
    stamps = [t0] + rec.pop("stamps")
    rec["seconds"] = [b - a for a, b in zip(stamps, stamps[1:])]   # step 1 includes setup
    rec["records"] = ctx.comm.ledger.records(ctx.rank)
    c: dict[str, dict[str, int]] = {"forward": {}, "backward": {}, "step": {}}
    for r in rec["records"]:   # the ledger's count for the last step, per phase group
        if r.step == cfg.steps:
            g = c[PHASE_GROUP[r.phase]]
            g[r.op] = g.get(r.op, 0) + 1
    rec["counts"] = c
    rec["c10d_last_step"] = _counts(mode) if count else None   # what torch saw
    rec["losses"] = out.losses
    return rec


def compare_rank(ctx, cfg, stages, *, count: bool = True, weights: bool = True,
                 optimizers=("torch",)) -> list[dict]:
    """For each stage: zerospec's run, then its peer's with each optimizer (see :func:`build`)."""
    out = []
    for k, stage in enumerate(stages):
        c = dataclasses.replace(cfg, stage=stage)
        zs = zerospec_rank(ctx if k == 0 else processes.new_context(), c, count=count,
                           weights=weights)
        peers = {o: run_peer(stage, c, weights=weights, count=count, optimizer=o)
                 for o in optimizers}
        out.append({"stage": stage, "zerospec": zs, "peers": peers})
    return out


def mean_losses(runs, cfg) -> list[float]:
    """Per step, the mean of the ranks' losses, summed in fp64 in rank order."""
    return [float(sum(r["losses"][s].double() for r in runs) / cfg.n_d) for s in range(cfg.steps)]


def zerospec_row(cfg, stage: int, zs: list[dict], weights: bool) -> dict:
    """The zerospec side of a comparison row from every rank's output: losses (rank-mean),
    ledger records per rank and, with ``weights``, the full master weights after every step."""
    row = {"stage": stage, "losses": mean_losses(zs, cfg), "records": [z["records"] for z in zs]}
    if weights:
        from ..training.result import gather_master
        scfg = dataclasses.replace(cfg, stage=stage)
        units = scfg.units()
        row["weights"] = [gather_master(units, [SimpleNamespace(master=z["weights"][s]) for z in zs],
                                        scfg) for s in range(cfg.steps)]
    return row


def compare(cfg, stages=(0, 1, 2, 3), *, count: bool = True, weights: bool = True,
            optimizers=("torch",), **launch_kw) -> list[dict]:
    """Launch ``cfg.n_d`` gloo processes; one row per stage with zerospec's and each peer's losses
    (mean over ranks, rank order), weights after every step ("unit/param" → tensor), per-step
    collective counts of the last step by phase, and step times (rank 0's)."""
    per_rank = processes.launch(compare_rank, cfg.n_d, cfg, list(stages), count=count,
                                weights=weights, optimizers=tuple(optimizers),
                                timeout=cfg.timeout, **launch_kw)
    rows = []
    for k, stage in enumerate(stages):
        zs = [per_rank[r][k]["zerospec"] for r in range(cfg.n_d)]
        row = {**zerospec_row(cfg, stage, zs, weights), "peer": PEERS[stage],
               "counts": zs[0]["counts"], "seconds": zs[0]["seconds"],
               "c10d_last_step": zs[0]["c10d_last_step"], "peers": {}}
        for o in optimizers:
            ps = [per_rank[r][k]["peers"][o] for r in range(cfg.n_d)]
            row["peers"][o] = {"losses": mean_losses(ps, cfg), "counts": ps[0]["counts"],
                               "seconds": ps[0]["seconds"], "weights": ps[0]["weights"]}
        rows.append(row)
    return rows
