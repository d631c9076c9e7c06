"""zerospec.runtime.metacache: the meta kernel cache answers a repeat exactly as the kernel would,
and runs what it cannot answer (views, writes that resize, host tensors) every time."""
from __future__ import annotations

import torch

from zerospec.runtime.metacache import MetaKernelCache


def test_the_kernel_cache_answers_repeated_ops():
    cache = MetaKernelCache()
    x = torch.empty(4, 6, dtype=torch.float16, device="meta")
    with cache:
        a = torch.nn.functional.gelu(x)
        b = torch.nn.functional.gelu(x)
        v = x.view(6, 4)                       # a view: never cached, still a view of x
    assert (cache.misses, cache.hits) == (1, 1)
    assert (a.shape, a.dtype, b.shape, b.dtype) == ((4, 6), torch.float16, (4, 6), torch.float16)
    assert a.untyped_storage()._cdata != b.untyped_storage()._cdata
    assert v.untyped_storage()._cdata == x.untyped_storage()._cdata


def test_the_kernel_cache_runs_an_op_that_returns_its_inputs_storage_every_time():
    """_unsafe_view returns its input's storage under a schema that promises a fresh tensor: the
    cache never answers it, however often it repeats (a fresh answer would be bytes no GPU holds)."""
    x = torch.empty(4, 6, device="meta")
    with MetaKernelCache() as cache:
        views = [torch.ops.aten._unsafe_view.default(x, [6, 4]) for _ in range(3)]
    assert {v.untyped_storage()._cdata for v in views} == {x.untyped_storage()._cdata}
    assert cache.hits == 0


def test_the_kernel_cache_answers_a_repeat_in_the_shape_of_the_first_answer():
    """Repeats of ops returning several tensors (a tuple: layer norm's three, max's values and
    indices; a list: a foreach op) come back as the first answers did, tensor by tensor."""
    x = torch.empty(4, 6, device="meta")
    ln = torch.ops.aten.native_layer_norm.default
    with MetaKernelCache() as cache:
        firsts = (ln(x, [6], None, None, 1e-5), torch.max(x, dim=1), torch._foreach_add([x, x], 1.0))
        repeats = (ln(x, [6], None, None, 1e-5), torch.max(x, dim=1), torch._foreach_add([x, x], 1.0))
    assert cache.hits == 3
    for a, b in zip(firsts, repeats):
        assert type(a) is type(b) and len(a) == len(b)
        assert [(t.shape, t.stride(), t.dtype) for t in a] == [(t.shape, t.stride(), t.dtype) for t in b]
    assert repeats[1].indices.dtype == torch.int64


def test_the_kernel_cache_keeps_python_scalar_types_apart():
    """mul by 1 and by 1.0 promote an integer tensor differently, so they are different keys."""
    x = torch.empty(3, dtype=torch.int64, device="meta")
    with MetaKernelCache():
        assert (x * 1).dtype == torch.int64
        assert (x * 1.0).dtype == torch.float32


def test_the_kernel_cache_answers_a_repeated_write_with_the_argument_written():
    """An in-place op and an out= op, repeated on arguments of the same metadata, return the
    argument they write (itself, not a copy) without running the kernel again."""
    x, y, z = (torch.empty(4, 6, device="meta") for _ in range(3))
    with MetaKernelCache() as cache:
        outs = [(a.add_(z), torch.div(a, 2.0, out=b)) for a, b in ((x, y), (y, x))]
    assert (cache.misses, cache.hits) == (2, 2)
    assert [(p is a, q is b) for (p, q), (a, b) in zip(outs, ((x, y), (y, x)))] == [(True,) * 2] * 2


def test_the_kernel_cache_runs_a_write_that_resizes_every_time():
    """An out= tensor of the wrong size is resized by the kernel: a repeat must be resized too."""
    x = torch.empty(4, 6, device="meta")
    empties = [torch.empty(0, device="meta") for _ in range(2)]
    with MetaKernelCache() as cache:
        outs = [torch.add(x, x, out=e) for e in empties]
    assert [o.shape for o in outs] == [(4, 6)] * 2 and cache.hits == 0


def test_the_kernel_cache_runs_a_write_to_a_host_tensor_every_time():
    """A host tensor's values change with each write: only meta tensors are all metadata."""
    y = torch.zeros(3)
    with MetaKernelCache() as cache:
        y.add_(1.0)
        y.add_(1.0)
    assert y.tolist() == [2.0, 2.0, 2.0] and cache.hits == 0


def test_the_kernel_cache_runs_set_every_time():
    """set_ onto a storage of the same size changes no shape, only which storage a tensor holds,
    and only if it held another: never answered, whether the first call moved its tensor or not."""
    s, b, c = (torch.empty(4, device="meta") for _ in range(3))
    a = torch.empty(4, device="meta").set_(s)
    with MetaKernelCache() as cache:
        a.set_(s)          # already on s: nothing changes
        b.set_(s)
        c.set_(s)
    assert {t.untyped_storage()._cdata for t in (a, b, c)} == {s.untyped_storage()._cdata}
    assert cache.hits == 0


def test_the_kernel_cache_runs_a_write_that_returns_nothing_every_time():
    """The in-place foreach ops write their list and return nothing: never answered."""
    y, m = torch.zeros(3), torch.empty(3, device="meta")
    with MetaKernelCache() as cache:
        for _ in range(2):
            torch._foreach_add_([y], 1.0)
            torch._foreach_add_([m], 1.0)
    assert y.tolist() == [2.0, 2.0, 2.0] and cache.hits == 0


def test_a_second_cache_on_the_shared_table_answers_what_the_first_learnt(monkeypatch):
    """Two caches on one table: the second answers the first's key without running the kernel;
    the process's table starts again empty once it holds LIMIT keys."""
    from zerospec.runtime import metacache
    table, x = {}, torch.empty(4, 6, dtype=torch.float16, device="meta")
    with MetaKernelCache(table):
        torch.nn.functional.gelu(x)
    with MetaKernelCache(table) as second:
        y = torch.nn.functional.gelu(x)
    assert (second.misses, second.hits) == (0, 1) and (y.shape, y.dtype) == ((4, 6), torch.float16)
    monkeypatch.setattr(metacache, "LIMIT", 2)
    metacache.forget()
    metacache.KERNELS.update({1: None})
    assert metacache.shared() is metacache.KERNELS and len(metacache.KERNELS) == 1
    metacache.KERNELS.update({2: None})
    assert len(metacache.shared()) == 0
