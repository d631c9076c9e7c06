"""Activation checkpointing (ZeRO-R, §3.2 and C27): keep a segment's input, recompute the rest.

**k.** ``TrainConfig.checkpoint_activations = k``: 0 is off; k >= 1 cuts the L transformer blocks
into segments of k consecutive blocks (Megatron-LM's ``--checkpoint-num-layers``; the last segment
is shorter when k does not divide L), so there are ceil(L/k) checkpoints. k = 1 is the paper's
"one checkpoint per transformer layer". Embeddings, the final LayerNorm and the LM head are never
checkpointed: only blocks are.

**Forward.** A segment runs without autograd: nothing inside it is saved; its input is saved once,
the *checkpoint* (ledger category ``"checkpoints"``, through the same saved-tensor hooks as every
activation, zerospec/zero/saved.py). **Backward.** When backward reaches the segment, it runs the
segment's forward again with autograd and the hooks on (what it saves is ``"recomputed"``) and
backpropagates through that recompute at once, so the recomputed activations live only while this
segment's backward consumes them. Same kernels, same order, same inputs: the recompute saves
exactly the tensors the plain forward saves, so gradients, losses and weights are bit-identical to
a run without checkpointing (tests/claims/test_activations.py).

**Parameters.** The recompute takes its units through the rank's ParamFetcher like any forward
use: a Use whose parameter gradients reach the stage's gradient slots exactly as without
checkpointing. Stage 3 all-gathers each unit again there (phase "backward") and keeps it until the
segment's backward is done (``fetch(i, last=True)``), so a unit is gathered twice per step, as
without checkpointing (forward; recompute instead of backward's re-gather): still 3Ψ (C24). The
checkpointed forward needs no Use — nothing is saved and no gradient comes back through it, and a
Use would wait for one — so it serves each unit straight from the fetcher's stage with the
fetcher's cast: ``acquire`` (stage 3: the forward all-gather) → fp32 cast → views → ``release``.

Why not ``torch.utils.checkpoint(..., use_reentrant=False)``: it re-runs the wrapped function to
recompute, which would fetch every unit a second time as a new Use whose gradient never arrives
(the fetcher's completeness check fails, and stage 3's keep/re-gather life is bypassed); it keeps
the segment inputs in a closure and the recomputed tensors in its own frame, so the ledger would
see neither; and its saved-tensor hooks replace the fetcher's for everything inside the segment.
The recompute here is a dozen lines and keeps all of that in the ledger's sight.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools

import torch

from ..model import gpt
from ..zero.saved import compute_values
from . import selective


def segments(k: int, n_layer: int) -> list[range]:
    """The checkpointed segments of blocks ``0..n_layer-1`` for ``k`` (0: none)."""
    check(k, n_layer)
    return _cut(range(n_layer), k) if k else []


def _cut(layers: range, k: int) -> list[range]:
    return [layers[a:a + k] for a in range(0, len(layers), k)]


def check(k, n_layer: int) -> None:
    """ValueError unless ``k`` is 0 (off) or a whole number of blocks 1..n_layer."""
    if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= n_layer:
        raise ValueError(f"checkpoint_activations must be 0 (off) or blocks per checkpoint "
                         f"1..{n_layer} (n_layer), got {k!r}")


def block_runner(k: int, fetcher, mp=None, keep=None, every: int = 0, per_op: bool = False):
    """``gpt.forward``'s ``run_blocks`` for one rank's run: plain blocks when k = 0, else a
    checkpoint every k blocks, recomputed in backward through ``fetcher`` (``fetch``, which
    gpt.forward passes, is ``fetcher.fetch``: a segment needs the fetcher's stage and hooks too).
    ``mp``: the rank's model-parallel group (zerospec/model/megatron.py) or None; ``keep``:
    how a checkpoint is kept between forward and backward — None: whole, on the device; else a
    :class:`zerospec.zero_r.partition.Partitioned` (ZeRO-R's P_a, P_a+cpu).
    torchtitan's selective modes (zerospec/zero_r/selective.py), with k = 0: ``every`` K, a
    checkpoint of one block for every K-th block, the others plain; ``per_op``, every block a
    checkpoint keeping its input and what the per-op policy saves; ``keep`` keeps each input as
    it keeps a segment's."""
    if every or per_op:
        return _selective(fetcher, mp, keep, every, per_op)
    if k == 0:
        return gpt.blocks if mp is None else functools.partial(gpt.blocks, mp=mp)

    def run_blocks(cfg: gpt.GPTConfig, x: torch.Tensor, fetch, layers: range,
                   tiles: int = 1) -> torch.Tensor:
        for seg in _cut(layers, k):
            with fetcher.saved.counting("checkpoints"):   # the one tensor the segment saves
                x = _Segment.apply(x, _Run(cfg, fetcher, seg, mp, keep, tiles))   # (B, T, C)
        return x
    return run_blocks


def count(k: int, n_layer: int, every: int = 0, per_op: bool = False) -> int:
    """Checkpoints one micro-step keeps: a segment's, per-op's every block's, selective-layer:K's
    the blocks :func:`selective.checkpointed` picks (M_D's slots, zero_r/defrag.py)."""
    if per_op:
        return n_layer
    if every:
        return sum(selective.checkpointed(i, every) for i in range(n_layer))
    return len(segments(k, n_layer))


def _selective(fetcher, mp, keep, every: int, per_op: bool):
    def run_blocks(cfg: gpt.GPTConfig, x: torch.Tensor, fetch, layers: range,
                   tiles: int = 1) -> torch.Tensor:
        for i in layers:
            if every and not selective.checkpointed(i, every):   # this block keeps everything
                x = gpt.blocks(cfg, x, fetch, range(i, i + 1), mp, tiles)
                continue
            with fetcher.saved.counting("checkpoints"):   # its input (and the ops it keeps)
                x = _Segment.apply(x, _Run(cfg, fetcher, range(i, i + 1), mp, keep, tiles,
                                           per_op))
        return x
    return run_blocks


@dataclasses.dataclass(frozen=True)
class _Run:
    """One segment: the blocks ``layers`` of ``cfg``, parameters from ``fetcher``."""

    cfg: gpt.GPTConfig
    fetcher: object
    layers: range
    mp: object = None
    keep: object = None
    tiles: int = 1          # memory-centric tiling's MLP tiles per block (C-I3); 1: none
    per_op: bool = False    # torchtitan's per-op policy: the forward keeps some ops' outputs

    def blocks(self, x: torch.Tensor, fetch) -> torch.Tensor:
        return gpt.blocks(self.cfg, x, fetch, self.layers, self.mp, self.tiles)

    @contextlib.contextmanager
    def serve(self, i: int):
        """Unit i for the no-autograd forward: the stage's fp16 vector, cast as the fetcher casts."""
        stage, unit = self.fetcher.stage, self.fetcher.units[i]
        full16 = stage.acquire(i)
        flat = compute_values(stage, full16, unit.numel, self.fetcher.compute_dtype)
        try:
            yield unit.views(flat)
        finally:   # the cast dies with the use, as the fetcher's does in stage 3 (a view of the
            #        gathered vector itself is the stage's to let go: FSDP2's flavour)
            if flat.untyped_storage()._cdata != full16.untyped_storage()._cdata:
                flat.untyped_storage().resize_(0)
            stage.release(i, full16)

    def refetch(self, i: int):
        """Unit i for the recompute: a fetcher Use, kept until the segment's backward releases it.
        An MLP tile is let go after its recompute and gathered again by its backward, so that one
        tile at a time is gathered in backward too (C-I3's bound; DeepSpeed's ZeRO-3 releases a
        recomputed module's parameters after its forward the same way)."""
        return self.fetcher.fetch(i, last=not self._is_tile(i))

    def _is_tile(self, i: int) -> bool:
        """Unit i is an MLP tile: block b's unit is 1 + b·(1 + T), its tiles the T after it."""
        return self.tiles > 1 and (i - 1) % (1 + self.tiles) != 0


class _Segment(torch.autograd.Function):
    """Blocks of one segment: forward without saving, backward = recompute + its backward."""

    @staticmethod
    def forward(ctx, x, run: _Run):
        ctx.run = run
        if not run.per_op:
            _keep(ctx, run, x)                    # the checkpoint
            return run.blocks(x, run.serve)       # grad mode is off in here
        with selective.policy() as kept:          # the input and the outputs the policy keeps
            y = run.blocks(x, run.serve)
        ctx.layout = kept.layout()
        _keep(ctx, run, x, kept.tensors())
        return y

    @staticmethod
    def backward(ctx, grad_y):
        run, saved = ctx.run, ctx.run.fetcher.saved
        tensors = ctx.saved_tensors
        own, kept = tensors[:len(tensors) - ctx.n_ops], list(tensors[len(tensors) - ctx.n_ops:])
        del tensors
        policy = contextlib.nullcontext()
        if run.per_op:                            # the recompute hands the kept outputs back
            policy = selective.policy(selective.rebuild(ctx.layout, kept))
        del kept
        if run.keep is None:
            x, = own                              # the ledger lets the checkpoint go here
        else:                                     # P_a: all-gathered over the MP group
            x = run.keep.restore(ctx.kept, own)
        del own
        x = x.detach().requires_grad_(True)
        with torch.enable_grad(), saved.hooks(), saved.counting("recomputed"), policy:
            y = run.blocks(x, run.refetch)
        torch.autograd.backward(y, grad_y)        # parameter gradients go to the fetcher
        return x.grad, None


def _keep(ctx, run: _Run, x: torch.Tensor, ops: tuple = ()) -> None:
    """Save checkpoint ``x`` whole, or as ``run.keep`` keeps it (P_a: 1/N_m of it, P_a+cpu: on
    the host, M_D: in its slot), and after it the per-op policy's kept outputs ``ops``."""
    ctx.n_ops = len(ops)
    if run.keep is None:
        ctx.save_for_backward(x, *ops)
    else:
        ctx.kept = run.keep.keep(x, lambda *part: ctx.save_for_backward(*part, *ops))
