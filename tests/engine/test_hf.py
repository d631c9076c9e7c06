"""Hugging Face ``transformers`` as a cross-check of the decoder family: Ψ, FLOPs, saved bytes.

Optional: these tests need ``pip install -e ".[hf]"`` and skip without it; they are marked ``hf``
and ``slow`` (importing transformers alone takes ~2.5 s), so the default run leaves them out and
CI runs them in its slow step, after installing the extra. Config objects only: nothing is
downloaded (each preset's config.json fields are written down below, CONFIG_JSON, and HF builds
the model from them). spec/engine.md, "Cross-checks with transformers and FSDP2", says what
differs and why.

* **Ψ** — every published preset (zerospec/model/presets.py) built by HF on ``meta``: HF's count
  equals the shape sum, for the whole model and per module (embeddings, one block, final norm,
  head), and for the Llama family per tensor (q/k/v ↔ the fused c_attn's row blocks).
* **FLOPs** — a tiny Llama-style and a tiny GPT-2 forward under ``FlopCounterMode``, on both: equal
  op for op, but (transformers 4.x) HF's RoPE, whose angle table is one batched matmul.
* **Saved activations** — one block on ``meta`` in fp16: the bytes HF's block saves for backward
  (``saved_tensors_hooks``, every non-parameter storage once) against zerospec's ledger for one
  recomputed block (``measure(..., checkpoint_activations=1)``'s ``recomputed`` peak), each
  difference named and pinned by its closed form.
"""
from __future__ import annotations

import contextlib
import importlib.util
import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from zerospec.model import gpt
from zerospec.model.family import GPTConfig
from zerospec.model.layers import rope_tables
from zerospec.model.presets import PUBLISHED
from zerospec.training.scale import measure
from zerospec.training.config import TrainConfig
from zerospec.training.sections import ZeroROptions


def _missing() -> str | None:
    try:
        if importlib.util.find_spec("transformers") is not None:
            return None
    except (ImportError, ValueError):
        pass
    return "transformers is not installed: pip install -e '.[hf]' (CI installs it for its slow step)"


MISSING = _missing()
pytestmark = [pytest.mark.hf, pytest.mark.slow,
              pytest.mark.skipif(MISSING is not None, reason=MISSING or "")]


# -- zerospec config -> HF config ---------------------------------------------------------------------
def hf_config(cfg: GPTConfig, family: str, **extra):
    """The HF config of the same shape: ``family`` "llama", "mistral", "qwen2" or "gpt2"."""
    import transformers as tf
    if family == "gpt2":
        assert cfg.mlp == "gelu" and cfg.norm == "layernorm" and cfg.tie_embeddings and cfg.bias
        return tf.GPT2Config(vocab_size=cfg.vocab_size, n_positions=cfg.block_size, n_embd=cfg.n_embd,
                             n_layer=cfg.n_layer, n_head=cfg.n_head, n_inner=cfg.ff,
                             layer_norm_epsilon=cfg.norm_eps, **extra)
    cls = {"llama": tf.LlamaConfig, "mistral": tf.MistralConfig, "qwen2": tf.Qwen2Config}[family]
    # Qwen2's q/k/v biases are its architecture (no config field); Llama's attention_bias would put
    # a bias on o_proj too, so only the Qwen2 class expresses qkv_bias without bias
    assert cfg.has_qkv_bias == (family == "qwen2") and not cfg.bias
    return cls(vocab_size=cfg.vocab_size, hidden_size=cfg.n_embd, intermediate_size=cfg.ff,
               num_hidden_layers=cfg.n_layer, num_attention_heads=cfg.n_head,
               num_key_value_heads=cfg.kv_heads, max_position_embeddings=cfg.block_size,
               rope_theta=cfg.rope_theta, rms_norm_eps=cfg.norm_eps,
               tie_word_embeddings=cfg.tie_embeddings, **extra)


def family(name: str) -> str:
    """The HF class of a published preset. GPT-3 has none in transformers: its preset is GPT-2's
    block at GPT-3's shape (presets.py says so), so GPT2Config counts that reading of it."""
    return next(f for p, f in (("llama", "llama"), ("mistral", "mistral"), ("qwen", "qwen2"),
                               ("gpt-3", "gpt2")) if name.startswith(p))


def on_meta(hcfg, **kw):
    from transformers import AutoModelForCausalLM
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(hcfg, **kw)


def numel(module) -> int:
    return sum(p.numel() for p in module.parameters())


def hf_units(model, cfg: GPTConfig) -> dict[str, int]:
    """HF's parameters per zerospec unit (embed, one block, ln_f, lm_head): HF's own modules."""
    base = model.base_model
    if hasattr(base, "wte"):                                   # GPT-2: embed = wte + wpe, tied head
        embed, blocks, norm = numel(base.wte) + numel(base.wpe), base.h, base.ln_f
    else:
        embed, blocks, norm = numel(base.embed_tokens), base.layers, base.norm
    out = {"embed": embed, "h.0": numel(blocks[0]), "ln_f": numel(norm)}
    if not cfg.tie_embeddings:
        out["lm_head"] = numel(model.lm_head)
    return out


# Llama's tensor names -> zerospec's (q, k and v are row blocks of the fused c_attn)
LLAMA_NAMES = {"input_layernorm.weight": "ln_1.weight",
               "post_attention_layernorm.weight": "ln_2.weight",
               "self_attn.o_proj.weight": "attn.c_proj.weight",
               "mlp.gate_proj.weight": "mlp.c_gate.weight", "mlp.up_proj.weight": "mlp.c_fc.weight",
               "mlp.down_proj.weight": "mlp.c_proj.weight"}


def llama_block_shapes(block, cfg: GPTConfig) -> dict[str, tuple[int, ...]]:
    """One HF Llama/Mistral/Qwen2 block's tensors under zerospec's names; q/k/v stacked by rows."""
    p = {n: tuple(t.shape) for n, t in block.named_parameters()}
    out = {LLAMA_NAMES[n]: s for n, s in p.items() if n in LLAMA_NAMES}
    qkv = [p[f"self_attn.{x}_proj.weight"] for x in "qkv"]
    assert len({s[1] for s in qkv}) == 1
    out["attn.c_attn.weight"] = (sum(s[0] for s in qkv), qkv[0][1])
    if cfg.has_qkv_bias:
        out["attn.c_attn.bias"] = (sum(p[f"self_attn.{x}_proj.bias"][0] for x in "qkv"),)
    assert len(out) == len(p) - 2 * (1 + cfg.has_qkv_bias), sorted(p)   # every HF tensor mapped
    return out


# The parameter-determining fields of each published preset's config.json (presets.py cites the repo),
# written down here once more, apart from presets.py: HF counts *these*, so a preset whose shape
# drifts from its cited config (a d_ff off by one) fails below. Two are also transformers' own
# defaults (LlamaConfig() is Llama-2-7B's shape, MistralConfig() Mistral-7B-v0.1's), checked too.
FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
          "num_key_value_heads", "vocab_size")
CONFIG_JSON = {   # name: (HF class, hidden, intermediate, layers, heads, kv heads, vocab)
    "llama-2-7b": ("llama", 4096, 11008, 32, 32, 32, 32000),
    "llama-2-13b": ("llama", 5120, 13824, 40, 40, 40, 32000),
    "llama-2-70b": ("llama", 8192, 28672, 80, 64, 8, 32000),
    "llama-3-8b": ("llama", 4096, 14336, 32, 32, 8, 128256),
    "llama-3-70b": ("llama", 8192, 28672, 80, 64, 8, 128256),
    "llama-3.1-8b": ("llama", 4096, 14336, 32, 32, 8, 128256),
    "llama-3.1-405b": ("llama", 16384, 53248, 126, 128, 8, 128256),
    "mistral-7b-v0.1": ("mistral", 4096, 14336, 32, 32, 8, 32000),
    "qwen2.5-7b": ("qwen2", 3584, 18944, 28, 28, 4, 152064),
    "qwen2.5-72b": ("qwen2", 8192, 29568, 80, 64, 8, 152064),
}


def cited(name: str):
    """The HF config of ``name``'s config.json fields (CONFIG_JSON); GPT-3 has no HF class and no
    config.json: GPT2Config of Brown et al.'s Table 2.1 shape (96 × 12288, 96 heads, context
    2048) on GPT-2's vocabulary and block, the reading presets.py states."""
    import transformers as tf
    if name == "gpt-3-175b":
        return tf.GPT2Config(vocab_size=50257, n_positions=2048, n_embd=12288, n_layer=96, n_head=96)
    cls, *values = CONFIG_JSON[name]
    kw = dict(zip(FIELDS, values))
    return {"llama": tf.LlamaConfig, "mistral": tf.MistralConfig,
            "qwen2": tf.Qwen2Config}[cls](tie_word_embeddings=False, **kw)


def test_every_published_preset_has_its_config_json_written_down():
    """CONFIG_JSON covers the published presets (GPT-3 aside), and transformers' own defaults agree
    with it for the two models they describe."""
    import transformers as tf
    assert set(CONFIG_JSON) | {"gpt-3-175b"} == set(PUBLISHED)
    for cls, name in ((tf.LlamaConfig, "llama-2-7b"), (tf.MistralConfig, "mistral-7b-v0.1")):
        assert tuple(getattr(cls(), f) for f in FIELDS) == CONFIG_JSON[name][1:]


@pytest.fixture(scope="module")
def published():
    """Each published preset's cited config built by HF on meta (~4 s for the ten)."""
    return {name: on_meta(cited(name)) for name in PUBLISHED}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_hf_counts_each_published_presets_cited_config_as_its_psi(published, name):
    """HF's model of a published preset's cited config has exactly the preset's Ψ parameters, module
    by module (embeddings, a block, the final norm, the head) and, for the Llama family, tensor by
    tensor in a block; and HF's config of the preset itself is the cited one."""
    cfg, model = PUBLISHED[name].model, published[name]
    assert numel(model) == cfg.psi
    spec = dict(cfg.unit_spec())
    ours = {u: sum(math.prod(s) for _, s in spec[u]) for u in hf_units(model, cfg)}
    assert hf_units(model, cfg) == ours
    if family(name) != "gpt2":
        assert llama_block_shapes(model.base_model.layers[0], cfg) == dict(spec["h.0"])
        mine = hf_config(cfg, family(name))
        assert {f: getattr(mine, f) for f in FIELDS} == {f: getattr(cited(name), f) for f in FIELDS}


# -- tiny models: FLOPs and saved bytes ---------------------------------------------------------------
B, T = 2, 16
TINY = {
    "llama": GPTConfig(vocab_size=256, block_size=T, n_layer=2, n_head=4, n_embd=64, n_kv_head=2,
                       d_ff=160, norm="rmsnorm", mlp="swiglu", positions="rope",
                       tie_embeddings=False, bias=False),
    "gpt2": GPTConfig(vocab_size=256, block_size=T, n_layer=2, n_head=4, n_embd=64),
}
# GPT-2's own activation is the tanh approximation (gelu_new), zerospec's the exact erf GELU
# (F.gelu): HF is asked for "gelu"; the saved-bytes test measures what gelu_new costs
HF_EXTRA = {"llama": {}, "gpt2": {"activation_function": "gelu"}}


def flops(fn) -> dict[str, int]:
    with FlopCounterMode(display=False) as fc:
        fn()
    return {str(op): n for op, n in fc.get_flop_counts()["Global"].items()}


def zerospec_forward_flops(cfg: GPTConfig) -> dict[str, int]:
    params = gpt.init_params(cfg, 0)
    names = [u for u, _ in cfg.unit_spec()]

    @contextlib.contextmanager
    def fetch(i, last=False):
        yield params[names[i]]

    idx = torch.zeros(B, T, dtype=torch.long)
    return flops(lambda: gpt.forward(cfg, idx, idx, fetch))


def hf_forward_flops(name: str) -> dict[str, int]:
    """On CPU: transformers 4.x's Llama rotary embedding enters
    ``torch.autocast(device_type=x.device.type)``, which refuses "meta"; the shapes are tiny. Eager
    attention (SDPA has no FLOP formula on CPU) and an explicit attention mask, as on meta."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_config(hf_config(TINY[name], name, **HF_EXTRA[name]),
                                             attn_implementation="eager")
    idx = torch.zeros(B, T, dtype=torch.long)
    return flops(lambda: model(input_ids=idx, attention_mask=torch.ones_like(idx), labels=idx,
                               use_cache=False))


def transformers_major() -> int:
    import transformers
    return int(transformers.__version__.split(".")[0])


@pytest.mark.parametrize("name", list(TINY))
def test_forward_flops_per_token_equal_hfs_but_its_rope_table(name):
    """A forward's FLOPs per token, by torch's formulas, are HF's, op for op — but, in transformers
    4.x, HF's RoPE, which builds its angle table as a batched matmul (1, hd/2, 1) @ (1, 1, T): hd·T
    FLOPs more per forward (zerospec's ``torch.outer``, and 5.x's broadcast product, are no
    matmul); GPT-2 equal."""
    cfg = TINY[name]
    ours, theirs = zerospec_forward_flops(cfg), hf_forward_flops(name)
    rope = cfg.head_dim * T if cfg.positions == "rope" and transformers_major() < 5 else 0
    for op in ("aten.mm", "aten.addmm"):
        assert theirs.get(op) == ours.get(op)
    assert theirs["aten.bmm"] - ours["aten.bmm"] == rope
    assert sum(theirs.values()) - sum(ours.values()) == rope
    assert sum(ours.values()) % (B * T) == 0       # per token: an integer, the same for every token


def hf_block_saved_bytes(name: str, **extra) -> int:
    """Bytes one HF block saves for backward, fp16 on meta (as zerospec's meta steps), eval mode
    (no dropout: zerospec has none): every non-parameter storage the pack hook sees, once — the
    ledger's rule. RoPE's cos/sin are given as zerospec computes them (HF makes them once per
    forward, outside the blocks, on the same layout); the causal mask as an additive 4-D tensor."""
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer
    cfg = TINY[name]
    hcfg = hf_config(cfg, name, attn_implementation="eager", **{**HF_EXTRA[name], **extra})
    with torch.device("meta"):
        blk = (LlamaDecoderLayer(hcfg, 0) if name == "llama" else GPT2Block(hcfg, layer_idx=0))
        blk = blk.to(torch.float16).eval()
        x = torch.empty(B, T, cfg.n_embd, dtype=torch.float16, requires_grad=True)
        mask = torch.zeros(B, 1, T, T, dtype=torch.float16)
    kw = {"attention_mask": mask}
    if cfg.positions == "rope":
        cos, sin = rope_tables(T, cfg.head_dim, cfg.rope_theta, "meta", torch.float16)
        kw["position_embeddings"] = (cos[None], sin[None])
    params = {p.untyped_storage()._cdata for p in blk.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        s = t.untyped_storage()
        if s._cdata not in params:
            seen.setdefault(s._cdata, s.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        blk(x, **kw)
    return sum(seen.values())


def zerospec_block_saved_bytes(name: str) -> int:
    """zerospec's ledger: one block's recompute (a checkpoint per block, so every block's is one)."""
    run = measure(TrainConfig(stage=0, n_d=1, model=TINY[name],
                              zero_r=ZeroROptions(checkpoint_activations=1)), micro_batch=B)
    return run.memory(0).peak["recomputed"]


def test_one_llama_blocks_saved_bytes_are_hfs_less_its_fp32_upcasts():
    """One Llama block saves what HF's saves, but (fp16 compute, b = 2, s = 16, d = 64, 4 heads):
    HF's RMSNorm upcasts its input to fp32 and saves that copy (4·bsd), its fp32 rsqrt (4·bs) and the
    fp16 cast of the normalised x (2·bsd), where zerospec saves its fp16 input (2·bsd), rsqrt (2·bs)
    and product (2·bsd): +2·bsd + 2·bs per norm, two norms; HF's softmax runs in fp32 and is saved
    (4·b·h·s²) besides the fp16 cast the value matmul saves, which zerospec's fp16 softmax is:
    +4·b·h·s²;
    HF adds its causal mask (saves nothing) where zerospec's masked_fill saves the bool mask: −s²."""
    d, h = TINY["llama"].n_embd, TINY["llama"].n_head
    upcasts = 2 * (2 * B * T * d + 2 * B * T) + 4 * B * h * T * T
    assert hf_block_saved_bytes("llama") - zerospec_block_saved_bytes("llama") == upcasts - T * T


def test_one_gpt2_blocks_saved_bytes_are_hfs_but_its_mask_and_scale():
    """One GPT-2 block saves what HF's saves (erf GELU, no dropout), but for the attention scores'
    scale and mask. transformers 4.x: +2 bytes — HF divides by a 0-d fp16 tensor, which autograd
    saves (zerospec multiplies by a Python float), and masks with its own bool causal mask, s²
    bytes as zerospec's; 5.x: −s² — HF scales by a Python float and adds the additive mask (saves
    nothing). GPT-2's own tanh GELU (gelu_new, written as elementwise ops) saves 3 more (b, s, 4d)
    fp16 tensors: 0.5·x, tanh's result and 1 + tanh (x itself is saved by both)."""
    ff = TINY["gpt2"].ff
    scale_and_mask = 2 if transformers_major() < 5 else -T * T
    assert hf_block_saved_bytes("gpt2") - zerospec_block_saved_bytes("gpt2") == scale_and_mask
    assert hf_block_saved_bytes("gpt2", activation_function="gelu_new") - hf_block_saved_bytes("gpt2") \
        == 3 * 2 * B * T * ff
