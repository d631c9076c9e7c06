"""How the model gets its parameters and how their gradients leave it — one path for all stages.

``ParamFetcher.fetch(i)`` asks the stage for unit i's full fp16 vector (a resident replica in
stages 0–2, an all-gather just in time in stage 3), makes the compute-dtype leaf from it (a fresh
cast, or the vector itself where no cast is needed) and yields parameter-shaped views of it. Each
fetch block is one :class:`~.saved.Use`, whose life (forward → kept or saved → gathered again in
backward → released) is the explicit :class:`~.saved.UseState`; what autograd saves for backward
goes through :class:`~.saved.SavedTensors` (zerospec/zero/saved.py): parameter views as references,
gathered again in stage 3, activations counted in the ledger.

Gradients: a custom autograd Function, :class:`_UnitViews`, makes the parameter views. Autograd
calls its backward once per use, when the gradients of all of that use's parameters are complete
(None for a parameter the use left out: the LM head uses wte, not wpe). Once every forward use of
a unit has its gradient (the embedding unit is used twice: lookup and tied LM head), the summed
gradient is written as fp16 into the slot the stage provides and handed to it (stages 2/3
reduce-scatter it right there, inside backward: C8). Writing each parameter's gradient straight
into the slot saves what ``torch.split``'s backward would do: concatenate them into an fp32 copy
of the unit first.

Because the autograd graph, the kernels and the summation order are identical in every stage, the
stages are bit-identical (design property 3). The fp32 leaf is a CPU compute cast, not counted
(a GPU computes from the fp16 values directly); in stage 3 its storage is dropped as soon as the
forward use ends, so backward cannot compute from anything it did not gather again. In fp32
training on a CPU a unit the stage keeps needs no cast: its leaf is a view of the stage's own
vector (:func:`~.saved.unit_leaf`), which no use frees.
"""
from __future__ import annotations

import contextlib

import torch

from ..runtime.memory import storage_key
from .saved import SavedTensors, Use, UseState, compute_values, unit_leaf


class ParamFetcher:
    """Serves one rank's model its parameters through its stage; see the module docstring."""

    def __init__(self, stage, compute_dtype: torch.dtype):
        self.stage = stage
        self.units = stage.units
        self.compute_dtype = compute_dtype
        self.grad_scale = 1.0   # gradients are multiplied by this when cast to fp16
        self.begin_step()

    def begin_step(self) -> None:
        """Start a micro-step: fresh uses, saved tensors and gradient sums."""
        n = len(self.units)
        self.saved = SavedTensors(self.stage, self.compute_dtype)
        self._kept: list[Use] = []
        self._n_uses = [0] * n
        self._n_grads = [0] * n
        self._acc: list[list[torch.Tensor | None] | None] = [None] * n

    def hooks(self):
        """The saved-tensor hooks to run forward under (zerospec/zero/saved.py)."""
        return self.saved.hooks()

    # -- forward ---------------------------------------------------------------------------------
    @contextlib.contextmanager
    def fetch(self, i: int, last: bool = False):
        """Unit i's parameters for one use. ``last``: the final use in forward, kept for backward
        (backward starts with it, as FSDP2 keeps its root unsharded)."""
        unit = self.units[i]
        full16 = self.stage.acquire(i)
        resident = self.stage.is_resident(i)
        if getattr(self.stage, "computes_on_gathered", False):   # (test doubles: no such hook)
            leaf = compute_values(self.stage, full16, unit.numel, self.compute_dtype)
        else:
            leaf = unit_leaf(full16, unit.numel, self.compute_dtype, resident)
        leaf.requires_grad_(True)
        use = Use(i, leaf, resident=resident, owns_leaf=storage_key(leaf) != storage_key(full16))
        self.saved.add_use(use)
        self._n_uses[i] += 1
        try:
            yield dict(zip(unit.names, _UnitViews.apply(leaf, self, use)))
        finally:
            self._end_use(use, full16, last)

    def _end_use(self, use: Use, full16: torch.Tensor, last: bool) -> None:
        """The forward use is over: decide what backward will read (see UseState)."""
        # kept for backward when the stage says so (DeepSpeed's reuse distance) and backward
        # will read it: a use that saved no parameter view (the embedding lookup) lets go now
        last = last or (use.refs > 0 and self.stage.keep_for_backward(use.unit))
        if self.stage.is_resident(use.unit) and use.refs:
            # the stage keeps the unit anyway (stages 0–2): backward gets this use's compute
            # copy rather than a second cast of the same fp16 values (the same bits)
            use.cast, use.state = use.leaf.detach(), UseState.CAST_KEPT
        else:   # stage 3 frees the unit: backward must gather it again and cast it again
            if use.owns_leaf:   # (a view of the stage's own vector is not this use's to free)
                use.leaf.untyped_storage().resize_(0)
            use.state = UseState.SAVED if use.refs else UseState.RELEASED
        if last:
            use.full16 = full16
            if use.state is not UseState.CAST_KEPT:
                use.state = UseState.UNIT_KEPT
            self._kept.append(use)
        else:
            self.stage.release(use.unit, full16)

    def end_forward(self) -> None:
        """Release kept units that backward turned out not to need."""
        for use in self._kept:
            if use.refs == 0 and use.full16 is not None:
                self.stage.release(use.unit, use.full16)
                use.full16, use.state = None, UseState.RELEASED

    # -- gradients -------------------------------------------------------------------------------
    def _on_grads(self, use: Use, grads: tuple[torch.Tensor | None, ...]) -> None:
        """One use's parameter gradients (fp32, None: not used), from _UnitViews.backward: free
        the use's cast, add the gradients to the unit's sum and, once every use of the unit has
        added its, write the sum into the stage's slot."""
        self._free_cast(use)
        if self._accumulate(use.unit, grads):
            self._write_slot(use.unit)

    def _free_cast(self, use: Use) -> None:
        """Free the forward's cast that this use kept for backward, now that it is done."""
        if use.refs == 0 and use.owns_leaf and use.leaf.untyped_storage().nbytes():
            # stages 0–2 kept the forward's cast for backward: every node that used it has run
            # (each feeds this use's gradients, which only now are complete), so free it now
            use.leaf.untyped_storage().resize_(0)
            use.cast = None

    def _accumulate(self, i: int, grads: tuple[torch.Tensor | None, ...]) -> bool:
        """Add one use's gradients to unit i's sum; True once every use of the unit has added its.

        Per parameter, the same fp32 additions in the same order as summing whole-unit vectors;
        a parameter a use left out adds nothing rather than +0 (which could only turn a −0 into
        +0)."""
        acc = self._acc[i]
        if acc is None:
            acc = list(grads)
        else:   # an earlier use's sum + this use's, per parameter: the unit-level sum, elementwise
            acc = [a if g is None else g if a is None else a + g for a, g in zip(acc, grads)]
        self._acc[i] = acc
        self._n_grads[i] += 1
        return self._n_grads[i] >= self._n_uses[i]

    def _write_slot(self, i: int) -> None:
        """Unit i's summed gradient, times the loss scale, cast to fp16 into the slot the stage
        provides and handed to the stage. A parameter no use touched gets 0 in the slot, which may
        hold last step's values."""
        acc, self._acc[i] = self._acc[i], None   # moved, so scaling drops the unscaled sums
        unit, slot = self.units[i], self.stage.grad_slot(i)
        if self.grad_scale != 1.0:
            acc = [None if g is None else g * self.grad_scale for g in acc]
        real = slot[:unit.numel]
        if all(g is not None for g in acc):
            # the parameters tile [0, numel) in order: one cast-and-copy for the whole unit
            torch.cat([g.reshape(-1) for g in acc], out=real)
        else:
            for p, g in zip(unit.params, acc):
                dst = real[p.offset:p.offset + p.numel].view(p.shape)
                if g is None:
                    dst.zero_()
                else:
                    dst.copy_(g)
        self.grad_written(i, real)
        self.stage.grad_ready(i, slot)

    def grad_written(self, i: int, grad16: torch.Tensor) -> None:
        """Unit i's fp16 gradient (real elements), written and not yet handed to the stage.

        Does nothing: a seam for fault injection, patched by zerospec/testing/faults.py (the
        library never imports it) to put an inf where a GPU's fp16 backward would overflow."""

    def check_complete(self) -> None:
        """After backward: every use got its gradient and every saved tensor was consumed."""
        missing = [self.units[i].name for i in range(len(self.units))
                   if self._n_grads[i] != self._n_uses[i]]
        if missing:
            raise RuntimeError(f"units without a complete gradient after backward: {missing}")
        self.saved.release_unconsumed()
        self.stage.end_backward()


class _UnitViews(torch.autograd.Function):
    """Parameter-shaped views of a unit's fp32 leaf; backward hands their gradients to the fetcher.

    It returns no gradient for the leaf: the gradients go to the stage's fp16 slot, never into an
    fp32 copy of the whole unit (what ``torch.split``'s backward would concatenate)."""

    @staticmethod
    def forward(ctx, flat, fetcher, use):
        ctx.set_materialize_grads(False)     # None for a parameter this use left out
        ctx.fetcher, ctx.use = fetcher, use
        return fetcher.units[use.unit].view_tuple(flat)

    @staticmethod
    def backward(ctx, *grads):
        ctx.fetcher._on_grads(ctx.use, grads)
        return None, None, None
