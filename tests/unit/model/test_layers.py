"""The decoder family's layers (zerospec/model/layers.py), each against an independent oracle."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from zerospec.model.layers import attention, rms_norm, rope, rope_tables, swiglu


def _randn(*shape, seed=0, scale=1.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.mark.parametrize("scale", [1.0, 1e-3])
def test_rms_norm_equals_torchs_with_epsilon_inside_the_square_root(scale):
    """x / sqrt(mean(x²) + eps) · w, as torch.nn.functional.rms_norm; at scale 1e-3, mean(x²) ≈ eps."""
    x, w = _randn(3, 5, 16, scale=scale), _randn(16, seed=1)
    torch.testing.assert_close(rms_norm(x, w, 1e-6), F.rms_norm(x, (16,), w, eps=1e-6))
    torch.testing.assert_close(rms_norm(x, w, 1e-5), F.rms_norm(x, (16,), w, eps=1e-5))


def test_swiglu_is_down_of_silu_gate_times_up():
    """SwiGLU's inner part is silu(x·Wg^T) ⊙ (x·Wu^T), written out by hand with distinct gate and up."""
    x, wg, wu = _randn(2, 7, 8), _randn(12, 8, seed=1), _randn(12, 8, seed=2)
    g, u = x @ wg.T, x @ wu.T
    torch.testing.assert_close(swiglu(x, wg, wu), g * torch.sigmoid(g) * u)


def _split_heads(qkv, n_head, n_kv, hd):
    B, T, _ = qkv.shape
    q, k, v = qkv.split([n_head * hd, n_kv * hd, n_kv * hd], dim=2)
    return (q.view(B, T, n_head, hd).transpose(1, 2), k.view(B, T, n_kv, hd).transpose(1, 2),
            v.view(B, T, n_kv, hd).transpose(1, 2))


@pytest.mark.parametrize("n_head,n_kv", [(4, 4), (4, 2), (6, 2), (4, 1)])
def test_grouped_query_attention_equals_sdpa_with_enable_gqa(n_head, n_kv):
    """Each kv head serves n_head/n_kv consecutive query heads, as torch's causal SDPA with enable_gqa."""
    hd, T = 8, 10
    qkv = _randn(2, T, (n_head + 2 * n_kv) * hd)
    q, k, v = _split_heads(qkv, n_head, n_kv, hd)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=n_kv != n_head)
    torch.testing.assert_close(attention(qkv, n_head, n_kv), ref.transpose(1, 2).reshape(2, T, n_head * hd))


def _meta_rope(x, theta):
    """Meta's original Llama RoPE (complex numbers on interleaved pairs (2i, 2i+1)) applied to x in
    the rotate-half layout (pairs (i, i + hd/2)): convert, rotate, convert back."""
    B, H, T, hd = x.shape
    half = hd // 2
    inter = torch.stack((x[..., :half], x[..., half:]), dim=-1)                  # (.., hd/2, 2)
    freqs = 1.0 / theta ** (torch.arange(0, hd, 2)[:half].double() / hd)
    freqs_cis = torch.polar(torch.ones(T, half, dtype=torch.float64),
                            torch.outer(torch.arange(T).double(), freqs))          # (T, hd/2)
    out = torch.view_as_real(torch.view_as_complex(inter.double().contiguous()) * freqs_cis)
    return torch.cat((out[..., 0], out[..., 1]), dim=-1).float()


@pytest.mark.parametrize("theta", [10000.0, 500000.0])
def test_rope_equals_metas_complex_rotation_in_the_rotate_half_layout(theta):
    """q rotated per head by position t · θ^(−2i/hd), as Meta's complex-number Llama code computes it."""
    x = _randn(2, 3, 12, 16)
    cos, sin = rope_tables(12, 16, theta)
    torch.testing.assert_close(rope(x, cos, sin), _meta_rope(x, theta), atol=1e-5, rtol=1e-5)


def test_rope_scores_depend_on_relative_position_only():
    """⟨rope(q, m), rope(k, n)⟩ is the same for every (m, n) with the same m − n."""
    hd, T = 16, 12
    q, k = _randn(hd), _randn(hd, seed=1)
    cos, sin = rope_tables(T, hd, 10000.0)
    rq = rope(q.expand(1, 1, T, hd), cos, sin)[0, 0]          # q at every position
    rk = rope(k.expand(1, 1, T, hd), cos, sin)[0, 0]
    scores = rq @ rk.T                                         # (m, n)
    for delta in (0, 3, -5):
        diag = torch.diagonal(scores, offset=-delta)
        torch.testing.assert_close(diag, diag[:1].expand_as(diag), atol=1e-4, rtol=1e-5)
    assert not torch.allclose(scores[4, 1], scores[4, 2])     # and it does depend on m − n


def test_attention_with_rope_rotates_q_and_k_before_the_scores():
    """attention(..., rope_theta) equals causal SDPA on RoPE-rotated q and k (v untouched)."""
    n_head, n_kv, hd, T = 4, 2, 8, 9
    qkv = _randn(1, T, (n_head + 2 * n_kv) * hd)
    q, k, v = _split_heads(qkv, n_head, n_kv, hd)
    ref = F.scaled_dot_product_attention(_meta_rope(q, 1e4), _meta_rope(k, 1e4), v, is_causal=True,
                                         enable_gqa=True)
    torch.testing.assert_close(attention(qkv, n_head, n_kv, 1e4), ref.transpose(1, 2).reshape(1, T, -1),
                               atol=1e-5, rtol=1e-5)
