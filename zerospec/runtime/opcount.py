"""Every aten op a rank runs, with its FLOPs and the bytes it moves: the per-op roofline's input.

:class:`OpCounter` is a ``TorchDispatchMode``. For each op run under it, it records the tuple
:class:`Op` ``(name, flops, bytes read, bytes written)`` and counts identical tuples
(``collections.Counter``): a GPT step repeats the same few dozen ops per layer with the same
shapes, so a 100B step is a few hundred distinct tuples however many layers it has.

* **FLOPs** come from torch's own table, ``torch.utils.flop_counter.flop_registry``, the one
  ``FlopCounterMode`` uses, called the way it calls it (``formula(*args, **kwargs, out_val=out)``);
  an op the table does not know (elementwise, reductions, copies) counts 0 FLOPs, as there. Ops
  the table does not know but that decompose (``CompositeImplicitAutograd``) are decomposed under
  this mode, as ``FlopCounterMode`` does, so the ops seen are the ops it counts: the sum of
  ``flops × count`` equals its total exactly, whichever of the two modes is entered first.
* **Bytes**: an op whose every output is a view or alias of an input that it does not write (its
  schema's alias annotation without ``!``: ``view``, ``t``, ``transpose``, ``expand``, ``slice``,
  ``detach``, ``alias`` …; and ``_unsafe_view``, a view whose schema does not say so, seen by its
  output living in its input's storage) moves nothing; nor does an op that only allocates
  (``empty``, ``empty_strided`` …, :data:`ALLOCATES`). Any other op reads every tensor argument
  and writes every tensor output, each as passed (``numel × element size``, not the storage
  behind a view); an in-place op (``add_``) reads its ``self`` and writes it back; an ``out=``
  argument, and the ``self`` of ``copy_``, ``fill_``, ``zero_`` (:data:`OVERWRITES`), is written,
  not read. No fusion is assumed: each op goes to memory and back, so the bytes are an upper
  bound on a real run's HBM traffic (a fused kernel keeps intermediates on chip). Shapes and
  dtypes are all this needs, so it works on ``meta`` tensors.

The mode keeps no state but its Counter and a cache of each aten op's schema facts, and passes
every call on unchanged, so it nests with ``FlopCounterMode`` and with the memory observers
(:mod:`.observe`, :mod:`.trace`) in any order without changing what they see or return
(the tests enter FlopCounterMode beneath it, which then sees the ops the counter passes on:
zerospec/testing/flops.py). Entered right on a :class:`MetaKernelCache` (a meta step under
``measure``), it takes the cache's place on the mode stack until it exits and runs each op through
:meth:`MetaKernelCache.call` itself: the same answers, one Python mode an op rather than two.
Training counts its FLOPs with this mode alone: a 100B meta step
took 0.42× as long with it as with FlopCounterMode in its place (benchmarks/, one reading).
"""
from __future__ import annotations

from collections import Counter
from typing import NamedTuple

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode, _pop_mode, _push_mode
from torch.utils.flop_counter import flop_registry

from .dispatch import DispatchMode
from .memory import storage_key
from .metacache import MetaKernelCache, _key
from .observe import tensors_in, written_arguments


class Op(NamedTuple):
    """One op call's cost: its aten name, FLOPs (torch's registry) and bytes read and written."""

    name: str
    flops: int
    read: int
    written: int

    @property
    def bytes(self) -> int:
        return self.read + self.written


# Ops that only allocate: the memory is reserved, not touched (its first writer pays).
ALLOCATES = frozenset({"aten.empty.memory_format", "aten.empty_strided.default",
                       "aten.new_empty.default", "aten.new_empty_strided.default",
                       "aten.empty_like.default"})
# In-place ops that overwrite ``self`` without reading it (a memcpy, a memset): no schema says so.
OVERWRITES = frozenset({"aten.copy_.default", "aten.fill_.Scalar", "aten.fill_.Tensor",
                        "aten.zero_.default"})


class _Facts(NamedTuple):
    """What one aten op's schema (and torch's FLOP table) says, read once per op."""

    func: object               # kept alive, so its id() is never reused while cached
    name: str
    moves: str                 # "none" (allocates only, or a view by its schema), "writes"
    #                            (writes an argument: in-place, out=), "maybe" (check storages)
    unread: frozenset          # arguments written without being read
    params: tuple              # argument names, in order
    formula: object            # flop_registry's formula for its overload packet, or None
    decomposes: bool           # FlopCounterMode would decompose it (module doc)
    free: Op | None            # its Op whatever the arguments, when it moves nothing and has
    #                            no FLOP formula (a view by its schema, an allocation); else None


_FACTS: dict[int, _Facts] = {}   # id(aten op) -> its facts: a cache, not state


def _facts(func) -> _Facts:
    f = _FACTS.get(id(func))
    if f is None:
        rets, params, name = func._schema.returns, func._schema.arguments, str(func)
        view = bool(rets) and all(r.alias_info is not None and not r.alias_info.is_write
                                  for r in rets)
        writes = written_arguments(func)      # (position, name, keyword-only): the observer's reading
        unread = {a for _, a, kw in writes if kw} | ({"self"} if name in OVERWRITES else set())
        key = torch._C.DispatchKey.CompositeImplicitAutograd
        decomposes = (func not in flop_registry and func is not torch.ops.prim.device.default
                      and (key in func.py_kernels
                           or torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), key)))
        moves = "none" if view or name in ALLOCATES else "writes" if writes else "maybe"
        formula = flop_registry.get(func._overloadpacket)
        f = _FACTS[id(func)] = _Facts(
            func, name, moves, frozenset(unread), tuple(a.name for a in params), formula,
            decomposes, Op(name, 0, 0, 0) if moves == "none" and formula is None else None)
    return f


def unread(func) -> frozenset:
    """The arguments ``func`` writes without reading them: ``out=`` ones, and ``self`` of an op
    in :data:`OVERWRITES`. Every other tensor argument is read."""
    return _facts(func).unread


def _storages(x) -> set[int]:
    return {storage_key(t) for t in tensors_in(x)}


def is_view(func, args, kwargs, out) -> bool:
    """No bytes move: an op that only allocates; the schema says every output is a view; or
    (``_unsafe_view``, whose schema does not say so) the op writes no argument and every output
    lives in an input's storage."""
    return _is_view(_facts(func), args, kwargs, out)


def _is_view(f: _Facts, args, kwargs, out) -> bool:
    if f.moves != "maybe":
        return f.moves == "none"
    outs = _storages(out)
    return bool(outs) and outs <= _storages((args, kwargs))


def _nbytes(x) -> int:
    return sum(t.numel() * t.element_size() for t in tensors_in(x))


def _record(f: _Facts, args: tuple, kwargs: dict, out) -> Op:
    """The :class:`Op` of one call of the op whose facts are ``f`` (module doc)."""
    flops = int(f.formula(*args, **kwargs, out_val=out)) if f.formula is not None else 0
    if _is_view(f, args, kwargs, out):
        return Op(f.name, flops, 0, 0)
    if f.unread:
        args = [v for name, v in zip(f.params, args) if name not in f.unread]
        kwargs = {k: v for k, v in kwargs.items() if k not in f.unread}
    return Op(f.name, flops, _nbytes((args, kwargs)), _nbytes(out))


_OPS: dict = {}     # (op, its arguments' and outputs' metadata, whether a view) -> its Op
_ANSWERED: dict = {}   # a MetaKernelCache key -> the Op of a call the cache answered
LIMIT = 1 << 14     # keys kept at most: past it the table starts again empty


def _op(f: _Facts, args: tuple, kwargs: dict, out) -> Op:
    """:func:`_record`'s Op of an op with a FLOP formula, remembered per key: an Op is a
    function of the op, the shapes, strides, dtypes and non-tensor values of its arguments and
    outputs (what torch's FLOP formulas and the byte counts read: zerospec/runtime/metacache.py's
    key), and, for an op whose schema leaves it open, whether its outputs live in its inputs'
    storages. torch's formulas walk their arguments with pytree at each call (a third of a
    counted meta step's time); a step repeats the same few matmul shapes per layer."""
    try:
        key = (id(f.func), _key(args), tuple([(k, _key(v)) for k, v in kwargs.items()]),
               _key(out), _is_view(f, args, kwargs, out) if f.moves == "maybe" else None)
        op = _OPS.get(key)
    except TypeError:                        # an unhashable argument: count it afresh
        return _record(f, args, kwargs, out)
    if op is None:
        if len(_OPS) >= LIMIT:
            _OPS.clear()
        op = _OPS[key] = _record(f, args, kwargs, out)
    return op


class OpCounter(DispatchMode):
    """``with OpCounter() as c: ...`` then ``c.ops``: a Counter of :class:`Op` tuples."""

    def __init__(self):
        super().__init__()
        self.ops: Counter[Op] = Counter()
        self._kernels = None
        self._depth = 0          # how many times entered (the decomposition re-enters it)

    def __enter__(self):
        if self._depth == 0:
            # the mode it sits on, if a MetaKernelCache (a meta step under measure): the counter
            # takes its place on the mode stack until it exits and runs each op through it
            # itself (MetaKernelCache.call), one Python mode an op, not two; an op the cache
            # answers from its table is counted by the answer's key
            below = _get_current_dispatch_mode()
            self._kernels = below if isinstance(below, MetaKernelCache) else None
            if self._kernels is not None:
                _pop_mode()
        self._depth += 1
        return super().__enter__()

    def __exit__(self, *exc):
        self._depth -= 1
        try:
            return super().__exit__(*exc)
        finally:
            if self._depth == 0 and self._kernels is not None:
                _push_mode(self._kernels)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        f = _FACTS.get(id(func)) or _facts(func)
        # FlopCounterMode's rule: an op its table lacks is decomposed if it can be, and its parts
        # are what get counted (torch/utils/flop_counter.py, _FlopCounterMode.__torch_dispatch__)
        if f.decomposes:
            with self:
                r = func.decompose(*args, **kwargs)
            if r is not NotImplemented:
                return r
        kernels = self._kernels
        out = func(*args, **kwargs) if kernels is None else kernels.call(func, args, kwargs)
        if f.free is not None:                 # a view or an allocation without FLOPs
            self.ops[f.free] += 1
            return out
        if kernels is not None and kernels.answered is not None:
            # answered from the table: the outputs, and so the Op, are a function of the key
            op = _ANSWERED.get(kernels.key)
            if op is None:
                if len(_ANSWERED) >= LIMIT:
                    _ANSWERED.clear()
                op = _ANSWERED[kernels.key] = _record(f, args, kwargs, out)
        else:
            op = _op(f, args, kwargs, out) if f.formula is not None else _record(f, args, kwargs, out)
        self.ops[op] += 1
        return out

    @property
    def flops(self) -> int:
        return total_flops(self.ops)


def total_flops(ops: Counter) -> int:
    """Σ count × FLOPs over a Counter of :class:`Op`."""
    return sum(op.flops * n for op, n in ops.items())


def total_bytes(ops: Counter) -> int:
    """Σ count × bytes (read + written) over a Counter of :class:`Op`."""
    return sum(op.bytes * n for op, n in ops.items())
