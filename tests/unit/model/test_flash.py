"""zerospec/model/flash.py: the memory-efficient kernel keeps FlashAttention-2's five tensors, and
computes what the written-out kernel computes, bit for bit."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from zerospec.model.family import ODD, GPTConfig
from zerospec.model.flash import attend

B, T, HD = 2, 12, 8
SHAPES = {"gpt-2 (multi-head)": (4, 4, None), "llama (grouped-query, rope)": (4, 2, 10000.0)}


def _qkv(n_head, n_kv, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, T, (n_head + 2 * n_kv) * HD, generator=g)


def _run(kernel, n_head, n_kv, theta):
    x = _qkv(n_head, n_kv).requires_grad_(True)
    w = torch.randn(B, T, n_head * HD, generator=torch.Generator().manual_seed(1))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = attend(x, n_head, n_kv, theta, kernel)
    (y * w).sum().backward()
    return y.detach(), x.grad, saved


@pytest.mark.parametrize("shape", SHAPES)
def test_sdpa_outputs_and_gradients_equal_eager_bit_for_bit(shape):
    """The kernel's forward and its recomputing backward are the written-out ops: torch.equal."""
    y0, g0, _ = _run("eager", *SHAPES[shape])
    y1, g1, _ = _run("sdpa", *SHAPES[shape])
    assert torch.equal(y0, y1) and torch.equal(g0, g1)


@pytest.mark.parametrize("shape", SHAPES)
def test_sdpa_saves_q_k_v_out_and_an_fp32_logsumexp_per_row(shape):
    """What the kernel saves is FlashAttention-2's list (FlashAttnFunc.forward): q (B, H, T, hd),
    k and v at their kv heads, the output (B, T, H·hd) and the log-sum-exp (B, H, T) in fp32; no
    T×T tensor, which the eager kernel does keep."""
    n_head, n_kv, theta = SHAPES[shape]
    _, _, saved = _run("sdpa", n_head, n_kv, theta)
    flash = [(tuple(t.shape), t.dtype) for t in saved if t.dim() != 2 or theta is None]
    expected = [((B, n_head, T, HD), torch.float32), ((B, n_kv, T, HD), torch.float32),
                ((B, n_kv, T, HD), torch.float32), ((B, T, n_head * HD), torch.float32),
                ((B, n_head, T), torch.float32)]
    # rope saves its cos/sin tables (2-D) before the kernel, as the eager kernel does too
    assert flash[-5:] == expected
    assert not any(t.shape[-2:] == (T, T) for t in saved)
    _, _, eager = _run("eager", n_head, n_kv, theta)
    assert any(t.shape[-2:] == (T, T) for t in eager)


def test_a_model_trained_with_sdpa_equals_eager_at_stage_3():
    """Four virtual GPUs, ZeRO-3, two steps: the same losses and final weights with either kernel."""
    from zerospec.training.config import TrainConfig
    from zerospec.training.run import train
    runs = {k: train(TrainConfig(stage=3, n_d=4, model=dataclasses.replace(ODD, attention=k),
                                 steps=2)) for k in ("eager", "sdpa")}
    assert runs["eager"].losses == runs["sdpa"].losses
    for name, w in runs["eager"].master.items():
        assert torch.equal(w, runs["sdpa"].master[name]), name


def test_on_meta_sdpa_keeps_no_scores_in_the_ledger():
    """A meta step's activation peak with sdpa is below eager's by at least the probabilities
    eager keeps: L·B·H·T² elements of the compute dtype (fp16 on meta, 2 bytes)."""
    from zerospec.training.config import TrainConfig
    from zerospec.training.scale import measure
    m = GPTConfig(vocab_size=64, block_size=256, n_layer=2, n_head=4, n_embd=32)
    peaks = {k: measure(TrainConfig(stage=0, n_d=1, model=dataclasses.replace(m, attention=k)))
             .memory(0).peak["activations"]
             for k in ("eager", "sdpa")}
    assert peaks["eager"] - peaks["sdpa"] >= m.n_layer * 1 * m.n_head * 256 * 256 * 2


def test_an_unknown_attention_is_refused_by_name():
    with pytest.raises(ValueError, match=r"GPTConfig.attention must be one of 'eager', 'sdpa', got 'flash3'"):
        GPTConfig(attention="flash3")


def test_on_meta_the_logsumexp_is_fp32_beside_fp16_q_k_v_and_out():
    """On meta (the planner) nothing is computed, and the saved tensors are the kernel's: the
    log-sum-exp (B, H, T) in fp32 whatever the compute dtype, as torch's meta kernel makes it."""
    n_head, n_kv = 4, 2
    x = torch.empty(B, T, (n_head + 2 * n_kv) * HD, device="meta", dtype=torch.float16,
                    requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = attend(x, n_head, n_kv, 10000.0, "sdpa")
    assert [(tuple(t.shape), t.dtype) for t in saved[-5:]] == [
        ((B, n_head, T, HD), torch.float16), ((B, n_kv, T, HD), torch.float16),
        ((B, n_kv, T, HD), torch.float16), ((B, T, n_head * HD), torch.float16),
        ((B, n_head, T), torch.float32)]
    y.sum().backward()
    assert x.grad.shape == x.shape and x.grad.device.type == "meta"
