"""torchtitan's activation checkpointing: which blocks are checkpointed, and per op what a
checkpointed block keeps (``--activation-checkpointing``, spec/activations.md).

The rules are torchtitan's at the commit of its Llama 3 8B benchmark (pytorch/torchtitan
@9dec370, torchtitan/parallelisms/parallelize_llama.py, ``_apply_ac_to_transformer_block`` and
``apply_ac``, which wrap each TransformerBlock in turn):

* **full**: every block in ``checkpoint_wrapper`` (non-reentrant): its input kept, everything else
  recomputed in backward. zerospec runs it as a checkpoint per block, Megatron's k = 1
  (zerospec/zero_r/checkpointing.py).
* **selective-layer:K** (``mode="selective"``, ``selective_ac_option="K"``): a counter on the
  wrapper class counts the blocks from 1 as they are wrapped and wraps block c when c % K == 0,
  so with K = 2 the 2nd, 4th, … (0-based 1, 3, …) are checkpointed whole and the others keep every
  activation. Megatron's ``--checkpoint-activations K`` is another rule: one checkpoint per K
  consecutive blocks, every block inside one.
* **selective-op** (``selective_ac_option="op"``): every block wrapped with a selective
  checkpoint whose policy (``_custom_policy``) counts the block's ``aten.mm`` calls from 1, in
  forward and in the recompute separately (a fresh ``defaultdict(int)`` per block), and keeps
  (``MUST_SAVE``) the output of each op of ``_save_list`` — ``aten.mm``, the flash and
  efficient SDPA ops, ``_c10d_functional.reduce_scatter_tensor``, ``aten.abs``, ``aten.max`` —
  but the even-numbered mms; every other op is recomputed. In backward the recompute hands the
  kept outputs back instead of running those ops again (torch/utils/checkpoint.py,
  ``_CachingTorchDispatchMode`` and ``_CachedTorchDispatchMode``).

In zerospec's blocks a bias-free ``F.linear`` reaches dispatch as ``aten.mm`` (with a bias it is
``aten.addmm``, not in the list: recomputed, as torchtitan would). Attention's projection is
one fused mm (q, k, v together) where torchtitan's Llama has three (wq kept, wk recomputed, wv
kept), so a Llama block here keeps its k projection too (T·n_kv·hd elements per block); the MLP's
w1 (``c_gate``) is kept, w3 (``c_fc``) recomputed, w2 (``c_proj``) kept, as in torchtitan. The
``sdpa`` attention kernel (zerospec/model/flash.py, FlashAttention-2 modelled) stands for
``_scaled_dot_product_flash_attention``: its output and log-sum-exp are kept. Eager attention's
matmuls are ``aten.bmm``, not in the list: recomputed.
"""
from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..model import flash

aten = torch.ops.aten
MM = aten.mm.default
FLASH = "flash attention"           # zerospec's sdpa kernel, for the flash SDPA op


def _save_list() -> frozenset:
    """torchtitan's ``_save_list`` @9dec370. The SDPA ops and the functional reduce-scatter never
    run here (zerospec's attention kernel is FLASH; its collectives go through zerospec/comm/):
    listed so that the rule reads as its source."""
    ops = {MM, aten._scaled_dot_product_efficient_attention.default,
           aten._scaled_dot_product_flash_attention.default, aten.abs.default, aten.max.default}
    try:
        ops.add(torch.ops._c10d_functional.reduce_scatter_tensor.default)
    except (AttributeError, RuntimeError):   # a torch built without distributed
        pass
    return frozenset(ops)


SAVE_LIST = _save_list()


def checkpointed(i: int, every: int) -> bool:
    """selective-layer:K checkpoints block i (0-based) when its 1-based count is a multiple of K."""
    return (i + 1) % every == 0


class OpPolicy(TorchDispatchMode):
    """One block's per-op policy: in forward (``kept`` None) it runs every op and keeps the
    outputs the rule saves, in order (:attr:`kept`); in the recompute (``kept`` the forward's)
    it hands those back in the same order instead of running their ops. The mm count starts at 1
    in each."""

    def __init__(self, kept: list | None = None):
        super().__init__()
        self.replay = kept is not None
        self.kept = list(kept) if self.replay else []
        self.mms = 0
        self.inside = 0          # in the attention kernel: its own ops are not the block's

    def saves(self, func) -> bool:
        """torchtitan's ``_custom_policy``: listed ops, but every second mm."""
        if func is MM:
            self.mms += 1
        return func in SAVE_LIST and not (func is MM and self.mms % 2 == 0)

    def _take(self, what):
        done, out = self.kept.pop(0)
        if done != what:
            raise RuntimeError(f"the recompute ran {what} where forward kept {done}: the "
                               f"block's ops changed between forward and backward")
        # a fresh alias, as torch's cached mode hands back its detached copy: autograd makes
        # it this op's output
        return tuple(t.detach() if isinstance(t, torch.Tensor) else t for t in out) \
            if isinstance(out, (tuple, list)) else out.detach()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.inside or not self.saves(func):
            return func(*args, **kwargs)
        if self.replay:
            return self._take(func)
        out = func(*args, **kwargs)
        self.kept.append((func, out))
        return out

    def kernel(self, run, *args):
        """The attention kernel (model/flash.py's hook): kept whole, as the flash SDPA op."""
        if self.replay:
            return self._take(FLASH)
        self.inside += 1
        try:
            out = run(*args)
        finally:
            self.inside -= 1
        self.kept.append((FLASH, out))
        return out

    def tensors(self) -> list[torch.Tensor]:
        """Every kept tensor, in order (what the checkpoint saves beside the block's input)."""
        return [t for _, o in self.kept for t in _flat(o) if isinstance(t, torch.Tensor)]

    def layout(self) -> list:
        """:attr:`kept` without its tensors (None in their places): what backward rebuilds from."""
        return [(what, tuple(None if isinstance(t, torch.Tensor) else t for t in o)
                 if isinstance(o, (tuple, list)) else None) for what, o in self.kept]


def rebuild(layout: list, tensors) -> list:
    """The forward's kept outputs from :meth:`OpPolicy.layout` and the unpacked ``tensors``."""
    it = iter(tensors)
    return [(what, next(it) if o is None else tuple(next(it) if t is None else t for t in o))
            for what, o in layout]


def _flat(o) -> tuple:
    return tuple(o) if isinstance(o, (tuple, list)) else (o,)


@contextlib.contextmanager
def policy(kept: list | None = None):
    """``OpPolicy(kept)`` on, for the dispatcher's ops and for the attention kernel."""
    mode = OpPolicy(kept)
    hooks = flash.kernel_hooks()
    hooks.append(mode.kernel)
    try:
        with mode:
            yield mode
    finally:
        hooks.remove(mode.kernel)
