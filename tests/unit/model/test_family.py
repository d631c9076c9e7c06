"""The decoder family (zerospec/model/family.py, gpt.py): every field validated, Ψ exact, the
forward equal to a plain torch module built for the same config, and a tiny Llama trained
bit-identically by every ZeRO stage."""
from __future__ import annotations

import contextlib
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.support.runs import assert_same_training
from tests.unit.model.test_layers import _meta_rope
from zerospec.model.family import DecoderConfig, GPTConfig
from zerospec.model.gpt import ODD, fetch_order, forward, init_params

LLAMA = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_embd=32, n_kv_head=2,
                  norm="rmsnorm", mlp="swiglu", d_ff=48, positions="rope", tie_embeddings=False,
                  bias=False)
CONFIGS = {
    "gpt2": GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_embd=32),
    "llama": LLAMA,
    "qwen2": GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_embd=32, n_kv_head=1,
                       norm="rmsnorm", norm_eps=1e-6, mlp="swiglu", d_ff=40, positions="rope",
                       rope_theta=1e6, tie_embeddings=False, bias=False, qkv_bias=True),
    "ln-nobias-gqa": GPTConfig(vocab_size=50, block_size=12, n_layer=3, n_head=6, n_embd=24, n_kv_head=3,
                               bias=False, d_ff=36),
    "swiglu-bias-tied": GPTConfig(vocab_size=37, block_size=12, n_layer=1, n_head=3, n_embd=18,
                                  mlp="swiglu", positions="rope", rope_theta=500.0),
    # Mistral-Nemo's head_dim (heads × head_dim != n_embd), Llama's attention_bias and mlp_bias
    "head-dim-o-mlp-bias": GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_embd=32,
                                     d_head=12, n_kv_head=2, norm="rmsnorm", mlp="swiglu", d_ff=48,
                                     positions="rope", tie_embeddings=False, bias=False,
                                     qkv_bias=True, o_bias=True, mlp_bias=True),
    # a step shorter than the learned position table (GPT-2 at --seq below n_positions)
    "short-step": GPTConfig(vocab_size=64, block_size=8, n_positions=16, n_layer=1, n_head=4,
                            n_embd=32),
}


# -- the config ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw,message", [
    ({"norm": "batchnorm"}, r"norm must be one of 'layernorm', 'rmsnorm', got 'batchnorm'"),
    ({"mlp": "relu"}, r"mlp must be one of 'gelu', 'swiglu', got 'relu'"),
    ({"positions": "alibi"}, r"positions must be one of 'learned', 'rope', got 'alibi'"),
    ({"n_kv_head": 3}, r"n_head=4 must be divisible by n_kv_head=3"),
    ({"n_kv_head": 0}, r"n_kv_head must be an integer >= 1, got 0"),
    ({"d_ff": 2.5}, r"d_ff must be an integer >= 1, got 2.5"),
    ({"norm_eps": 0}, r"norm_eps must be a number > 0, got 0"),
    ({"rope_theta": -1.0}, r"rope_theta must be a number > 0, got -1.0"),
    ({"tie_embeddings": 1}, r"tie_embeddings must be True or False, got 1"),
    ({"bias": None}, r"bias must be True or False, got None"),
    ({"qkv_bias": "yes"}, r"qkv_bias must be True or False or None \(= bias\), got 'yes'"),
    ({"n_embd": 12, "n_head": 4, "positions": "rope"}, r"even head dim, got n_embd/n_head = 12/4 = 3"),
])
def test_every_field_is_validated_naming_the_value_and_what_is_accepted(kw, message):
    """A bad field raises ValueError naming the value and the accepted range."""
    with pytest.raises(ValueError, match=message):
        GPTConfig(**{"n_embd": 32, "n_head": 4, **kw})


def test_the_defaults_are_gpt2_and_decoder_config_is_the_same_class():
    """Every new field's default is GPT-2's: the same units as the five GPT-2 fields alone."""
    assert DecoderConfig is GPTConfig
    assert GPTConfig().unit_spec()[1][1][:4] == [("ln_1.weight", (128,)), ("ln_1.bias", (128,)),
                                                 ("attn.c_attn.weight", (384, 128)), ("attn.c_attn.bias", (384,))]
    assert GPTConfig().gpt2_only == []


# -- Ψ ---------------------------------------------------------------------------------------------
class Reference(nn.Module):
    """The config as a plain torch module: nn layers, separate q/k/v, torch's SDPA with enable_gqa
    and Meta's complex-number RoPE — no code shared with zerospec.model."""

    def __init__(self, c: GPTConfig):
        super().__init__()
        self.c = c
        d, hd, kv = c.n_embd, c.head_dim, c.n_kv_head or c.n_head
        f, qb = c.d_ff or 4 * d, c.bias if c.qkv_bias is None else c.qkv_bias
        ob, mb, q = c.has_o_bias, c.has_mlp_bias, c.n_head * hd
        norm = (lambda: nn.RMSNorm(d, eps=c.norm_eps)) if c.norm == "rmsnorm" else \
            (lambda: nn.LayerNorm(d, eps=c.norm_eps, bias=c.bias))
        self.wte = nn.Embedding(c.vocab_size, d)
        self.wpe = nn.Embedding(c.position_rows, d) if c.positions == "learned" else None
        self.h = nn.ModuleList()
        for _ in range(c.n_layer):
            b = nn.ModuleDict({"ln_1": norm(), "q": nn.Linear(d, q, qb), "k": nn.Linear(d, kv * hd, qb),
                               "v": nn.Linear(d, kv * hd, qb), "o": nn.Linear(q, d, ob), "ln_2": norm(),
                               "up": nn.Linear(d, f, mb), "down": nn.Linear(f, d, mb)})
            if c.mlp == "swiglu":
                b["gate"] = nn.Linear(d, f, mb)
            self.h.append(b)
        self.ln_f = norm()
        self.lm_head = None if c.tie_embeddings else nn.Linear(d, c.vocab_size, bias=False)

    def load(self, init: dict[str, dict[str, torch.Tensor]]) -> "Reference":
        c, d = self.c, self.c.n_embd
        kvd = (c.n_kv_head or c.n_head) * c.head_dim
        with torch.no_grad():
            self.wte.weight.copy_(init["embed"]["wte"])
            if self.wpe is not None:
                self.wpe.weight.copy_(init["embed"]["wpe"])
            for i, b in enumerate(self.h):
                p = init[f"h.{i}"]
                names = {"ln_1": "ln_1", "ln_2": "ln_2", "o": "attn.c_proj", "up": "mlp.c_fc",
                         "down": "mlp.c_proj", "gate": "mlp.c_gate"}
                for mod, ours in names.items():
                    if mod in b:
                        for n, t in b[mod].named_parameters():
                            t.copy_(p[f"{ours}.{n}"])
                for n in ("weight", "bias"):
                    if f"attn.c_attn.{n}" in p:
                        for mod, t in zip("qkv", p[f"attn.c_attn.{n}"].split([c.n_head * c.head_dim, kvd, kvd])):
                            getattr(b[mod], n).copy_(t)
            for n, t in self.ln_f.named_parameters():
                t.copy_(init["ln_f"][n])
            if self.lm_head is not None:
                self.lm_head.weight.copy_(init["lm_head"]["weight"])
        return self

    def forward(self, idx, targets):
        c, (B, T) = self.c, idx.shape
        H, kv = c.n_head, c.n_kv_head or c.n_head
        x = self.wte(idx) + (self.wpe(torch.arange(T)) if self.wpe is not None else 0)
        for b in self.h:
            h = b["ln_1"](x)
            q, k, v = (b[m](h).view(B, T, n, -1).transpose(1, 2) for m, n in zip("qkv", (H, kv, kv)))
            if c.positions == "rope":
                q, k = _meta_rope(q, c.rope_theta), _meta_rope(k, c.rope_theta)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kv != H)
            x = x + b["o"](y.transpose(1, 2).reshape(B, T, -1))
            h = b["ln_2"](x)
            h = F.silu(b["gate"](h)) * b["up"](h) if "gate" in b else F.gelu(b["up"](h))
            x = x + b["down"](h)
        x = self.ln_f(x)
        logits = self.lm_head(x) if self.lm_head is not None else x @ self.wte.weight.T
        return F.cross_entropy(logits.view(B * T, -1), targets.reshape(-1))


@pytest.mark.parametrize("name", CONFIGS)
def test_psi_is_the_sum_of_the_shapes_and_a_torch_modules_parameter_count(name):
    """The closed form Ψ = the units' element count = the parameters of nn layers built for the config."""
    c = CONFIGS[name]
    shapes = sum(math.prod(s) for _, ps in c.unit_spec() for _, s in ps)
    assert c.psi == shapes == sum(p.numel() for p in Reference(c).parameters())


def _fetch(cfg, init, seen=None):
    names = [u for u, _ in cfg.unit_spec()]

    @contextlib.contextmanager
    def fetch(i, last=False):
        if seen is not None:
            seen.append((i, last))
        yield {k: t.requires_grad_(True) for k, t in init[names[i]].items()}
    return fetch


def _batch(cfg, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(cfg.vocab_size, (2, cfg.block_size), generator=g),
            torch.randint(cfg.vocab_size, (2, cfg.block_size), generator=g))


@pytest.mark.parametrize("name", CONFIGS)
def test_forward_equals_the_torch_module_built_for_the_config(name):
    """The loss (and the gradient of the token embedding) equal those of the plain torch module."""
    c = CONFIGS[name]
    init, (idx, tgt) = init_params(c, 3), _batch(c)
    ref = Reference(c).load(init)
    ours = forward(c, idx, tgt, _fetch(c, init))
    theirs = ref(idx, tgt)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    ours.backward(), theirs.backward()
    torch.testing.assert_close(init["embed"]["wte"].grad, ref.wte.weight.grad, atol=1e-5, rtol=1e-4)


def test_an_untied_head_is_a_vocab_by_d_unit_fetched_once_at_the_end():
    """The LM head is the last unit, V×d, fetched once and last (kept for backward); wte only for the lookup."""
    init, seen = init_params(LLAMA, 0), []
    assert LLAMA.unit_spec()[-1] == ("lm_head", [("weight", (64, 32))])
    forward(LLAMA, *_batch(LLAMA), _fetch(LLAMA, init, seen))
    L = LLAMA.n_layer
    assert seen == [(0, False), *((1 + i, False) for i in range(L)), (L + 1, False), (L + 2, True)]
    assert fetch_order(LLAMA) == [i for i, _ in seen]


# -- training --------------------------------------------------------------------------------------
def test_a_tiny_llama_trains_bit_identically_in_every_stage():
    """RMSNorm, SwiGLU, GQA, RoPE, untied, no bias: stages 1–3 equal stage 0 bit for bit at N = 4."""
    from zerospec.training.config import TrainConfig
    from zerospec.training.run import train
    runs = [train(TrainConfig(stage=s, n_d=4, model=LLAMA, steps=3)) for s in range(4)]
    assert runs[0].losses[-1] < runs[0].losses[0]
    for r in runs[1:]:
        assert_same_training(runs[0], r)


def test_model_parallelism_slices_the_new_features():
    """n_m > 1 slices the whole family (zerospec/model/megatron.py; tests/unit/model/test_megatron.py):
    a Llama config at n_m = 2 holds half of its query and kv heads and of d_ff per rank."""
    spec = dict(dict(LLAMA.unit_spec(2))["h.0"])
    assert spec["attn.c_attn.weight"] == ((32 + 2 * 16) // 2, 32)
    assert spec["mlp.c_gate.weight"] == spec["mlp.c_fc.weight"] == (24, 32)
    assert spec["mlp.c_proj.weight"] == (32, 24)
    assert LLAMA.unit_spec(1) == LLAMA.unit_spec()


def test_a_shapes_units_are_made_once_and_shared_by_equal_configs():
    """units() of equal configs at the same N_d, padding, N_m and T is one tuple; another N_d or padding is another."""
    import dataclasses
    twin = dataclasses.replace(ODD)          # equal, not the same object
    assert twin is not ODD and twin.units(4) is ODD.units(4)
    assert ODD.units(4) is not ODD.units(2) and ODD.units(4) is not ODD.units(4, pad=False)
    assert [u.padded for u in ODD.units(4)] != [u.padded for u in ODD.units(4, pad=False)]
