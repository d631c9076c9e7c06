"""What autograd saves for backward: parameters as references, activations counted in the ledger.

:class:`SavedTensors` is one micro-step's pair of ``saved_tensors_hooks``. When autograd saves a
view of a parameter (a view of a fetched unit's fp32 leaf) of a unit the stage does not keep
(stage 3), the pack hook stores a :class:`ParamRef` (use, size, stride, offset) instead of the
data; the unpack hook rebuilds the view from whatever the :class:`Use` holds at that point of its
lifecycle (:class:`UseState`): it gathers the unit again (the re-gather of C24/C57, in reverse
order) and casts it again. A unit the stage keeps (stages 0–2) is read in backward from the
forward's own cast, so its views are stored as they are (:class:`KeptView`); both kinds count
the use's saved views, which is how the cast is freed once backward is done with it.
Every other saved tensor is an activation: counted in the memory ledger once per storage
(:class:`Activation`), released when backward has unpacked it as often as forward packed it —
under ``"activations"``, or the category :meth:`SavedTensors.counting` names (activation
checkpointing, zerospec/zero_r/checkpointing.py: a segment's kept input is ``"checkpoints"``, what
its recompute saves in backward is ``"recomputed"``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import enum
from typing import NamedTuple

import torch

from ..runtime.memory import storage_key


def unit_cast(full16: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """The cast a use of a unit makes wherever it needs one (forward, stage 3's re-gather, a
    checkpoint's forward): its ``numel`` real elements, fp16 storage → compute dtype, a fresh
    copy. One function, so the three can never differ by a bit."""
    return full16[:numel].to(dtype, copy=True)


def compute_values(stage, full16: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """What compute reads of a unit the stage gathered: :func:`unit_cast`'s copy, or, where the
    stage computes on the gathered vector itself (``stage.computes_on_gathered``: FSDP2's
    unsharded parameters are what autograd uses) and its dtype is the compute dtype, a view."""
    if getattr(stage, "computes_on_gathered", False) and full16.dtype == dtype:
        return full16[:numel].detach()
    return unit_cast(full16, numel, dtype)


def unit_leaf(full16: torch.Tensor, numel: int, dtype: torch.dtype, resident: bool) -> torch.Tensor:
    """Forward's leaf for one use of a unit: :func:`unit_cast`'s copy, or, in fp32 training on a
    CPU where the stage keeps the unit (stages 0–2), a view of the stage's own vector: the same
    values without a copy of the unit per use. On a GPU or ``meta`` the copy stays: paper-scale
    storage traces, and the allocator results pinned from them, include it."""
    if resident and full16.dtype == dtype and full16.device.type == "cpu":
        return full16[:numel].detach()
    return unit_cast(full16, numel, dtype)


class UseState(enum.Enum):
    """Where one forward use of a unit is in its life; what it holds is said per state."""

    FORWARD = "forward"          # in the fetch block: fp16 vector acquired, the leaf made from it
    CAST_KEPT = "cast kept"      # views saved; the stage keeps the unit, so backward reads the
    #                              forward's own cast (stages 0–2: same bits, one cast fewer)
    UNIT_KEPT = "unit kept"      # the last use in forward keeps the fp16 vector: backward starts
    #                              with it (stage 3's tied LM head, as FSDP2 keeps its root)
    SAVED = "saved"              # views saved as references only: backward must gather again (stage 3)
    REGATHERED = "regathered"    # in backward: the fp16 vector gathered again (or kept), cast again
    RELEASED = "released"        # no saved view left to unpack: nothing held for backward


@dataclasses.dataclass
class Use:
    """One forward use of unit ``unit`` (one fetch block) and what backward still needs of it."""

    # the tensors stay out of repr: printing a Use whose cast was freed (storage resized to 0)
    # would read freed memory
    unit: int
    leaf: torch.Tensor = dataclasses.field(repr=False)   # autograd's leaf (unit_leaf)
    resident: bool = False              # the stage keeps the unit (stages 0–2): backward reads
    #                                     this use's own cast, so saved views are kept as they are
    state: UseState = UseState.FORWARD
    refs: int = 0                       # saved views not yet unpacked
    full16: torch.Tensor | None = dataclasses.field(default=None, repr=False)  # the stage's fp16
    #                                     vector, while backward needs it
    cast: torch.Tensor | None = dataclasses.field(default=None, repr=False)    # the fp32 values
    #                                     backward's views read
    owns_leaf: bool = True              # the leaf is a copy (unit_leaf), freed once backward is
    #                                     done with it; else a view of the stage's vector


class KeptView(NamedTuple):   # a tuple: made for every saved parameter view (hot path)
    """What the pack hook stores for a saved view of a resident unit's parameters: the view itself
    (backward reads the forward's own cast, CAST_KEPT), and the version it was saved at."""

    use: Use
    view: torch.Tensor
    version: int


class ParamRef(NamedTuple):   # a tuple: made for every saved parameter view (hot path)
    """What the pack hook stores for a saved parameter view: where it lies in its use's cast."""

    use: Use
    size: torch.Size
    stride: tuple[int, ...]
    offset: int
    version: int      # the parameter's version counter when autograd saved it


@dataclasses.dataclass
class Activation:
    """A saved non-parameter storage: counted once in the ledger, freed at its last unpack."""

    tensor: torch.Tensor
    key: int                     # its storage_key
    unpacks_left: int = 1


class SavedTensors:
    """One micro-step's saved-tensor hooks for a rank: ``with saved.hooks(): forward``."""

    def __init__(self, stage, compute_dtype: torch.dtype):
        self.stage = stage
        self.units = stage.units
        self.memory = stage.ctx.memory
        self.compute_dtype = compute_dtype
        self.uses: dict[int, Use] = {}            # by the storage of the use's leaf
        self.activations: dict[int, Activation] = {}  # by storage
        self.category = "activations"             # what a newly saved storage is counted as

    def add_use(self, use: Use) -> None:
        """Views of ``use.leaf`` saved from now on are packed as references to ``use``. Uses that
        read the stage's vector in place share its storage: a new one may replace an earlier one
        only once that one's block has ended, else a view saved in the earlier block would be
        charged to the new one."""
        key = storage_key(use.leaf)
        earlier = self.uses.get(key)
        if earlier is not None and earlier.state is UseState.FORWARD:
            raise RuntimeError(f"unit {self.units[use.unit].name!r} fetched again inside its own "
                               f"fetch block")
        self.uses[key] = use

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    @contextlib.contextmanager
    def counting(self, category: str):
        """Activations saved inside are counted under ``category`` (a storage already counted
        keeps its category: the ledger counts each storage once)."""
        before, self.category = self.category, category
        try:
            yield
        finally:
            self.category = before

    def pack(self, t: torch.Tensor):
        storage = t.untyped_storage()
        key = storage._cdata             # storage_key(t), with the storage at hand for its size
        use = self.uses.get(key)
        if use is not None:
            use.refs += 1
            if use.resident:
                return KeptView(use, t, t._version)
            return ParamRef(use, t.size(), t.stride(), t.storage_offset(), t._version)
        act = self.activations.get(key)
        if act is None:
            act = self.activations[key] = Activation(t, key)
            self.memory.count_storage(self.category, key, storage.nbytes())
        else:
            act.unpacks_left += 1
        return act, t      # a plain tuple (the refs are named ones): unpack needs no lookup

    def unpack(self, packed):
        if type(packed) is tuple:
            act, t = packed
            if act.unpacks_left == 0:
                raise _freed("an activation")
            act.unpacks_left -= 1
            if act.unpacks_left == 0:
                self.memory.free_storage(act.key)
                del self.activations[act.key]
            return t
        use = packed.use
        if use.state is UseState.RELEASED:   # every saved view of the use was unpacked already
            raise _freed(f"unit {self.units[use.unit].name!r}'s parameters")
        if use.leaf._version != packed.version:
            # autograd's own check for saved tensors, which the hooks bypass: backward must not
            # see (stages 0–2, which reuse the forward's cast) or miss (stage 3, which casts
            # again) an in-place write made after the save
            raise RuntimeError(f"a parameter of unit {self.units[use.unit].name!r} was modified in "
                               f"place after autograd saved it for backward (version "
                               f"{packed.version} -> {use.leaf._version})")
        if type(packed) is KeptView:
            view = packed.view
        else:
            if use.state in (UseState.SAVED, UseState.UNIT_KEPT):
                if use.state is UseState.SAVED:
                    use.full16 = self.stage.acquire(use.unit)
                use.cast = compute_values(self.stage, use.full16, self.units[use.unit].numel,
                                          self.compute_dtype)
                use.state = UseState.REGATHERED
            view = use.cast.as_strided(packed.size, packed.stride, packed.offset)
        use.refs -= 1
        if use.refs == 0:
            if use.full16 is not None:
                self.stage.release(use.unit, use.full16)
            use.full16 = use.cast = None
            use.state = UseState.RELEASED
        return view

    def release_unconsumed(self) -> None:
        """After backward: free activations saved but never unpacked (a branch backward skipped)."""
        for key in self.activations:
            self.memory.free_storage(key)
        self.activations.clear()


def _freed(what: str) -> RuntimeError:
    """Backward over the same graph a second time (``retain_graph=True``): what the first one
    unpacked was freed as it went, as autograd frees saved tensors without the flag."""
    return RuntimeError(f"trying to backward through the graph a second time: {what} saved for "
                        f"backward was already freed by the first backward (zerospec frees saved "
                        f"tensors as backward consumes them; retain_graph=True is not supported)")
