"""The exact global norm (integer bins per binade) and the clip coefficient."""
from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from tests.support.examples import examples
from zerospec.optim.clip import clip_coefficient, norm_from_bins, square_bins

FP32 = arrays(np.float32, st.integers(1, 300),
              elements=st.floats(width=32, min_value=-2.0 ** 60, max_value=2.0 ** 60))


def _binned_norm_is_exact(x, cut):
    """norm_from_bins equals sqrt(math.fsum(squares)) exactly, for the whole array or any two parts."""
    t = torch.from_numpy(x)
    exact = math.sqrt(math.fsum(float(v) * float(v) for v in x))
    assert norm_from_bins(square_bins(t)) == exact
    assert norm_from_bins(square_bins(t[:cut]) + square_bins(t[cut:])) == exact


test_the_binned_norm_is_the_correctly_rounded_exact_norm_however_split, \
    test_the_binned_norm_is_the_correctly_rounded_exact_norm_however_split_more_examples = \
    examples(20, 80, x=FP32, cut=st.integers(0, 300))(_binned_norm_is_exact)


def test_subnormals_and_extremes_are_binned_exactly():
    """2^-149 (the smallest fp32), 65504 (the largest fp16) and 1e18 squared add up exactly."""
    x = torch.tensor([2.0 ** -149, 65504.0, 1e18, -3.0, 0.0])
    assert norm_from_bins(square_bins(x)) == math.sqrt(math.fsum(float(v) ** 2 for v in x))


def test_a_non_finite_gradient_has_a_nan_norm():
    """An inf or nan anywhere makes the norm nan (as torch's clip_grad_norm_ would not clip sensibly)."""
    assert math.isnan(norm_from_bins(square_bins(torch.tensor([1.0, float("inf")]))))


def test_the_coefficient_is_torchs_clip_grad_norm_coefficient():
    """max_norm/(‖g‖ + 1e-6) when clipping, 1 otherwise — the factor torch applies, to fp32 precision."""
    g = torch.linspace(-1, 2, 101)
    for max_norm in (0.5, 1e3):
        p = torch.nn.Parameter(torch.zeros(101))
        p.grad = g.clone()
        torch.nn.utils.clip_grad_norm_([p], max_norm)
        theirs = float(p.grad[-1] / g[-1])
        ours = clip_coefficient(norm_from_bins(square_bins(g)), max_norm)
        assert abs(ours - theirs) <= 2.0 ** -23 * theirs


class _Kernels(torch.utils._python_dispatch.TorchDispatchMode):
    """Every kernel run, with its outputs' shapes and dtypes (not their values or devices)."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        outs = out if isinstance(out, (tuple, list)) else (out,)
        self.seen.append((str(func), tuple((tuple(o.shape), o.dtype) for o in outs
                                           if isinstance(o, torch.Tensor))))
        return out


def test_on_meta_the_binned_norm_runs_the_real_kernels_on_the_real_shapes():
    """A meta gradient has no values: square_bins runs the kernels a finite real gradient of the
    same shape runs, making tensors of the same shapes and dtypes (what a meta step measures),
    and nothing asks a value of it; the one kernel apart is the selection of the finite elements
    (all of them: a copy of the same size on meta)."""
    real = torch.linspace(-3.0, 5.0, 1000).to(torch.float16)
    meta = torch.empty_like(real, device="meta")
    with _Kernels() as a:
        square_bins(real)
    with _Kernels() as b:
        square_bins(meta)
    assert a.seen and [out for _, out in a.seen] == [out for _, out in b.seen]
    assert [(x, y) for (x, _), (y, _) in zip(a.seen, b.seen) if x != y] == [
        ("aten.index.Tensor", "aten.clone.default")]
