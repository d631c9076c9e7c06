"""How the model gets its parameters, and how gradients and activations leave it — one path for all stages.

``ParamFetcher.fetch(i)`` asks the stage for unit i's full fp16 vector (a resident replica in
stages 0–2, an all-gather just in time in stage 3), casts it up to the compute dtype as a fresh
leaf, and yields parameter-shaped views of it. Two autograd mechanisms then do the rest:

* ``saved_tensors_hooks``: when autograd saves a view of a parameter for backward, the pack hook
  stores a *reference* (unit, size, stride, offset) instead of the data; in stage 3 the unpack
  hook asks the stage for the unit again in backward (the re-gather of C24/C57, in reverse order),
  casts it again and rebuilds the view; stages 0–2 keep every unit resident, so their backward
  reuses the forward's cast (same bits, one pass over the unit fewer). Every other saved tensor
  is an activation: counted in the memory ledger, deduplicated by storage, released when
  backward has consumed it.
* a custom autograd Function, :class:`_UnitViews`, makes the parameter views: autograd calls its
  backward once per use, when the gradients of all of that use's parameters are complete (None
  for a parameter the use left out: the LM head uses wte, not wpe). Once every forward use of a
  unit has its gradient (the embedding unit is used twice: lookup and tied LM head), the summed
  gradient is written as fp16 into the slot the stage provides and handed to it (stage 2/3
  reduce-scatter it right there, inside backward: C8). Writing each parameter's gradient straight
  into the slot saves what ``torch.split``'s backward would do: concatenate them into an fp32
  copy of the unit first.

Because the autograd graph, the kernels and the summation order are identical in every stage, the
stages are bit-identical (design property 3). The fp32 leaf is a CPU compute cast, not counted
(a GPU computes from the fp16 values directly); in stage 3 its storage is dropped as soon as the
forward use ends, so backward cannot compute from anything it did not gather again.
"""
from __future__ import annotations

import contextlib
import dataclasses

import torch

from ..runtime.memory import storage_key


@dataclasses.dataclass
class _Use:
    """One forward use of a unit (the fetch context) and what backward still needs of it."""

    unit: int
    leaf: torch.Tensor
    refs: int = 0                       # saved views not yet unpacked
    full16: torch.Tensor | None = None  # the stage's fp16 vector while backward needs it
    upcast: torch.Tensor | None = None


@dataclasses.dataclass(frozen=True)
class _ParamRef:
    use: _Use
    size: torch.Size
    stride: tuple[int, ...]
    offset: int
    version: int      # the parameter's version counter when autograd saved it


class ParamFetcher:
    """Serves one rank's model its parameters through its stage; see the module docstring."""

    def __init__(self, stage, compute_dtype: torch.dtype):
        self.stage = stage
        self.units = stage.units
        self.memory = stage.ctx.memory
        self.compute_dtype = compute_dtype
        self.grad_scale = 1.0   # gradients are multiplied by this when cast to fp16
        self.grad_fault = None  # test hook (loss_scale.poison): fault(unit, grad) before the cast
        self.begin_step()

    def begin_step(self) -> None:
        n = len(self.units)
        self._uses: dict[int, _Use] = {}
        self._kept: list[_Use] = []
        self._n_uses = [0] * n
        self._n_grads = [0] * n
        self._acc: list[torch.Tensor | None] = [None] * n
        self._acts: dict[int, list] = {}

    # -- forward ---------------------------------------------------------------------------------
    @contextlib.contextmanager
    def fetch(self, i: int, last: bool = False):
        """Unit i's parameters for one use. ``last``: the final use in forward, kept for backward
        (backward starts with it, as FSDP2 keeps its root unsharded)."""
        unit = self.units[i]
        full16 = self.stage.acquire(i)
        leaf = full16[:unit.numel].to(self.compute_dtype, copy=True).requires_grad_(True)
        use = _Use(i, leaf)
        self._uses[storage_key(leaf)] = use
        self._n_uses[i] += 1
        try:
            views = _UnitViews.apply(leaf, self, use)
            yield {p.name: v for p, v in zip(unit.params, views)}
        finally:
            if self.stage.resident and use.refs:
                # the stage keeps the unit anyway (stages 0–2): backward gets this use's compute
                # copy rather than a second cast of the same fp16 values (the same bits)
                use.upcast = leaf.detach()
            else:   # stage 3 frees the unit: backward must gather it again and cast it again
                leaf.untyped_storage().resize_(0)
            if last:
                use.full16 = full16
                self._kept.append(use)
            else:
                self.stage.release(i, full16)

    def end_forward(self) -> None:
        """Release kept units that backward turned out not to need."""
        for use in self._kept:
            if use.refs == 0 and use.full16 is not None:
                self.stage.release(use.unit, use.full16)
                use.full16 = None

    # -- saved tensors ---------------------------------------------------------------------------
    def pack(self, t: torch.Tensor):
        key = storage_key(t)
        use = self._uses.get(key)
        if use is not None:
            use.refs += 1
            return _ParamRef(use, t.size(), t.stride(), t.storage_offset(), t._version)
        entry = self._acts.get(key)
        if entry is None:
            self._acts[key] = [1, t]
            self.memory.track("activations", t)
        else:
            entry[0] += 1
        return t

    def unpack(self, packed):
        if not isinstance(packed, _ParamRef):
            key = storage_key(packed)
            entry = self._acts[key]
            entry[0] -= 1
            if entry[0] == 0:
                self.memory.free(entry[1])
                del self._acts[key]
            return packed
        use = packed.use
        if use.leaf._version != packed.version:
            # autograd's own check for saved tensors, which the reference bypasses: backward
            # must not see (stages 0–2, which reuse the forward's cast) or miss (stage 3, which
            # casts again) an in-place write made after the save
            raise RuntimeError(f"a parameter of unit {self.units[use.unit].name!r} was modified in "
                               f"place after autograd saved it for backward (version "
                               f"{packed.version} -> {use.leaf._version})")
        if use.upcast is None:
            if use.full16 is None:
                use.full16 = self.stage.acquire(use.unit)
            use.upcast = use.full16[:self.units[use.unit].numel].to(self.compute_dtype, copy=True)
        view = use.upcast.as_strided(packed.size, packed.stride, packed.offset)
        use.refs -= 1
        if use.refs == 0:
            if use.full16 is not None:
                self.stage.release(use.unit, use.full16)
            use.full16 = use.upcast = None
        return view

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    # -- gradients -------------------------------------------------------------------------------
    def _on_grads(self, use: _Use, grads: tuple[torch.Tensor | None, ...]) -> None:
        """One use's parameter gradients (fp32, None: not used), from _UnitViews.backward.

        Per parameter, the same fp32 additions in the same order as summing whole-unit vectors;
        a parameter a use left out adds nothing rather than +0 (which could only turn a −0 into
        +0). A parameter no use touched gets 0 in the slot, which may hold last step's values."""
        if use.refs == 0 and use.leaf.untyped_storage().nbytes():
            # stages 0–2 kept the forward's cast for backward: every node that used it has run
            # (each feeds this use's gradients, which only now are complete), so free it now
            use.leaf.untyped_storage().resize_(0)
            use.upcast = None
        i = use.unit
        acc = self._acc[i]
        if acc is None:
            acc = list(grads)
        else:   # an earlier use's sum + this use's, per parameter: the unit-level sum, elementwise
            acc = [a if g is None else g if a is None else a + g for a, g in zip(acc, grads)]
        self._n_grads[i] += 1
        if self._n_grads[i] < self._n_uses[i]:
            self._acc[i] = acc
            return
        self._acc[i] = None
        unit, slot = self.units[i], self.stage.grad_slot(i)
        for p, g in zip(unit.params, acc):
            dst = slot[p.offset:p.offset + p.numel].view(p.shape)
            if g is None:
                dst.zero_()
            else:
                dst.copy_(g * self.grad_scale if self.grad_scale != 1.0 else g)
        if self.grad_fault is not None:
            self.grad_fault(i, slot[:unit.numel])
        self.stage.grad_ready(i, slot)

    def check_complete(self) -> None:
        """After backward: every use got its gradient and every saved tensor was consumed."""
        missing = [self.units[i].name for i in range(len(self.units))
                   if self._n_grads[i] != self._n_uses[i]]
        if missing:
            raise RuntimeError(f"units without a complete gradient after backward: {missing}")
        for key, (count, t) in list(self._acts.items()):  # saved but never unpacked
            self.memory.free(t)
        self._acts.clear()


class _UnitViews(torch.autograd.Function):
    """Parameter-shaped views of a unit's fp32 leaf; backward hands their gradients to the fetcher.

    It returns no gradient for the leaf: the gradients go to the stage's fp16 slot, never into an
    fp32 copy of the whole unit (what ``torch.split``'s backward would concatenate)."""

    @staticmethod
    def forward(ctx, flat, fetcher, use):
        ctx.set_materialize_grads(False)     # None for a parameter this use left out
        ctx.fetcher, ctx.use = fetcher, use
        return tuple(v for v in fetcher.units[use.unit].views(flat).values())

    @staticmethod
    def backward(ctx, *grads):
        ctx.fetcher._on_grads(ctx.use, grads)
        return None, None, None
