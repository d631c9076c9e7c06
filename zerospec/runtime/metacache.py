"""Meta kernels once per shape: :class:`MetaKernelCache`, the dispatch mode paper-scale meta steps
run under (zerospec/training/scale.py).

PyTorch implements many meta kernels in Python (``mm`` ~50 µs a call, an out= ``div`` ~350 µs, layer
norm backward ~2 ms), and a 1T model makes the same few hundred calls per layer with the same
shapes. A meta kernel's result is a function of its arguments' metadata alone (shapes, strides,
offsets, dtypes, devices, and the non-tensor arguments; ``set_`` aside, below), so the cache
remembers, per such key, what the kernel did, and answers repeats without running it:

* an op that returns fresh tensors: the outputs' metadata; a repeat gets new empty meta tensors of
  it (never the remembered tensors: each call's outputs are storages of their own);
* an op that writes one of its arguments and returns it (in place, ``add_``; or ``out=``):
  whether the first call changed any argument's metadata (an ``out=`` of the wrong size is
  resized); if not, a repeat returns that argument (the one its schema names) without running
  the kernel. Only where every tensor argument is a meta tensor: a host tensor's values change;
* views, ops whose output is not a fresh tensor (``_unsafe_view`` returns its input's storage),
  writes that return several tensors or none, and ``set_`` (what it does depends on which storage
  it is given, not only on metadata): run every time, so a view shares its input's storage as on
  a GPU.

What a key's first call did depends on the key alone, so the answers hold for every meta step of
the process, not only the one that found them: :func:`shared` is the table ``measure`` gives each
step (zerospec/training/scale.py), so a step pays PyTorch's Python meta kernels only for the keys
no earlier step met (a 120-layer step of Figure 6's shape has about 1,100 keys, and the next
length of the same configuration adds about 20). It holds metadata only (shapes, strides, dtypes,
the op), never a tensor; past :data:`LIMIT` keys it starts again empty. :func:`forget` empties it
(a benchmark that times a step from cold).

It is exact by construction and checked case by case (tests/unit/runtime/test_metacache.py) and against
an uncached run (tests/unit/training/test_scale.py). Everything else that watches the ops (the memory
observers, the op counter, FlopCounterMode) is entered after it, so sees every op before it answers.
A traced step does not enter it: the storage trace runs each op through :meth:`MetaKernelCache.call`
itself (one Python mode an op, not two), and reads ``answered`` to skip its look at an op whose
outputs the table made; the op counter reads ``answered`` and ``key`` to count such an op by its key.
"""
from __future__ import annotations

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from .dispatch import DispatchMode
from .observe import tensors_in


def _key(x):
    # every op of a meta step passes here (tens of thousands a step): no generator, no tuple()
    # of the shape (a torch.Size is a tuple and hashes as one); the device as True for a meta
    # tensor, else the device itself (``x.device.type`` builds a device and a string: it was
    # half the key's cost)
    if isinstance(x, torch.Tensor):
        return ("T", x.shape, x.stride(), x.storage_offset(), x.dtype, x.is_meta or x.device)
    if isinstance(x, (list, tuple)):
        return (type(x), tuple([_key(y) for y in x]))
    return (type(x), x)                        # 1 and 1.0 promote differently: keep the type


def _metadata(tensors: list[torch.Tensor]) -> list[tuple]:
    """What a write may change besides values: the view of the storage, the storage, its size."""
    return [(t.shape, t.stride(), t.storage_offset(), t.dtype, t.untyped_storage()._cdata,
             t.untyped_storage().nbytes()) for t in tensors]


_KIND: dict = {}            # aten op -> "fresh", "run", or (position, name) of the argument it
#                             writes and returns
_UNCACHEABLE = object()     # a key whose answer is not cached (decided by the key alone)


def _kind(func):
    """What ``func``'s schema says it returns (read once per op): "fresh" tensors and writes no
    argument; one argument it writes, (position, name); else "run" (a view; several returns; a
    write that returns nothing, as the in-place foreach ops do; ``set_``)."""
    returns = [r.alias_info for r in func._schema.returns]
    writes = [(i, a.name, a.alias_info.before_set) for i, a in enumerate(func._schema.arguments)
              if a.alias_info is not None and a.alias_info.is_write]
    if not writes and all(r is None for r in returns):
        return "fresh"
    if func._schema.name == "aten::set_":   # what it does depends on which storage it is given,
        return "run"                         # which no key holds
    if len(returns) == 1 and returns[0] is not None and returns[0].is_write:
        return next(((i, name) for i, name, held in writes if held == returns[0].before_set), "run")
    return "run"


KERNELS: dict = {}          # the process's table (module doc): key -> what its first call did
LIMIT = 1 << 14             # keys kept at most (about 2 KB each: some 32 MB)


def shared() -> dict:
    """The process's table of answers, emptied first if it holds :data:`LIMIT` keys or more."""
    if len(KERNELS) >= LIMIT:
        KERNELS.clear()
    return KERNELS


def forget() -> None:
    """Empty the process's table: the next meta step runs every kernel once again."""
    KERNELS.clear()


def import_lazy_modules() -> None:
    """Import what PyTorch's Python meta kernels import on their first call, before a step runs:
    ``torch._check`` imports ``torch.fx.experimental.symbolic_shapes`` (and sympy), a kernel
    wrapped by ``torch._disable_dynamo`` imports ``torch._dynamo``. An import inside a step keeps
    the step's frames, and the tensors in their locals, in reference cycles that only the
    garbage collector frees, so storages would die when it runs, not where the code lets them
    go: the first meta step of a process would then trace other events than the next
    (tests/unit/runtime/test_metacache_imports.py). Once per process, ~1.4 s of CPU, which that
    first step would pay anyway."""
    import torch._dynamo  # noqa: F401
    import torch.fx.experimental.symbolic_shapes  # noqa: F401


class MetaKernelCache(DispatchMode):
    """Answer repeated meta ops from what the first call of the same key did (module doc).
    ``cache``: the table to read and fill (:func:`shared`); a fresh one by default."""

    def __init__(self, cache: dict | None = None):
        super().__init__()
        import_lazy_modules()     # before any step runs under it
        self.cache: dict = {} if cache is None else cache
        self.hits = self.misses = 0
        self.answered = None     # how the last call was answered from the table: "made" (its
        #                          outputs new storages; it writes no argument), "written" (the
        #                          argument it writes, returned: nothing changed); None: it ran
        self.key = None          # the last answered call's key: its outputs are the key's

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self.call(func, args, kwargs or {})

    def call(self, func, args: tuple, kwargs: dict):
        """Run ``func`` on its arguments, or answer it from the table: the mode's work, for a
        mode above that calls it in place of the op (:class:`~zerospec.runtime.trace.StorageTrace`
        in a traced step) with this one not entered, which saves each op a second Python mode."""
        self.answered = None
        kind = _KIND.get(func)
        if kind is None:
            kind = _KIND[func] = _kind(func)
        if kind == "run":
            return func(*args, **kwargs)       # views, set_, other writes: never answered
        try:
            # id(func): an OpOverload hashes in Python; the ops live as long as the process
            # (the arguments are always a tuple: their own key without _key's type tag)
            key = (id(func), tuple([_key(a) for a in args]),
                   tuple([(k, _key(v)) for k, v in kwargs.items()]) if kwargs else ())
            hit = self.cache.get(key)
        except TypeError:                      # an unhashable argument: just run the kernel
            return func(*args, **kwargs)
        if hit is _UNCACHEABLE:                # seen before: its answer is not remembered
            return func(*args, **kwargs)
        if hit is not None:
            self.hits += 1
            self.key = key
            if kind != "fresh":                # the argument it writes, as the kernel returns it
                self.answered = "written"
                position, name = kind
                return kwargs[name] if name in kwargs else args[position]
            metas, spec = hit
            outs = [torch.empty_strided(*m[1:3], dtype=m[3], device="meta") if m[0] == "T"
                    else m[1] for m in metas]
            self.answered = "made"
            # a plain tensor or a tuple of them (most ops) without pytree's generic walk
            return outs[0] if spec is None else spec(outs) if isinstance(spec, type) \
                else tree_unflatten(outs, spec)
        self.misses += 1
        inputs = tensors_in(args, kwargs)
        if kind != "fresh":
            before = _metadata(inputs)
            out = func(*args, **kwargs)
            # a host tensor's values changed: only meta tensors are all metadata
            meta = all(t.device.type == "meta" for t in inputs)
            self.cache[key] = True if meta and _metadata(inputs) == before else _UNCACHEABLE
            return out
        out = func(*args, **kwargs)
        self._remember(key, inputs, out)
        return out

    def _remember(self, key, inputs, out) -> None:
        outs, spec = tree_flatten(out)
        if isinstance(out, torch.Tensor):
            spec = None
        elif type(out) in (tuple, list) and all(isinstance(o, torch.Tensor)
                                                or type(o) in (bool, int, float) for o in out):
            spec = type(out)                   # flat: no nesting, no None (a pytree node)
        inputs = {x.untyped_storage()._cdata for x in inputs}
        metas = []
        for o in outs:
            if not isinstance(o, torch.Tensor):
                if o is not None and type(o) not in (bool, int, float):
                    self.cache[key] = _UNCACHEABLE
                    return
                metas.append(("V", o))
                continue
            fresh = torch.empty_strided(o.shape, o.stride(), dtype=o.dtype, device="meta")
            if (o.device.type != "meta" or o.storage_offset() != 0
                    or o.untyped_storage()._cdata in inputs
                    or o.untyped_storage().nbytes() != fresh.untyped_storage().nbytes()):
                self.cache[key] = _UNCACHEABLE   # not a plain fresh tensor (_unsafe_view's
                return                         # output is its input's storage): run it each time
            metas.append(("T", tuple(o.shape), o.stride(), o.dtype))
        self.cache[key] = (metas, spec)
