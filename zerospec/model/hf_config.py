"""A Hugging Face ``config.json`` as a decoder shape (``plan --explain --hf-config``), and back.

Four architectures map onto :class:`~zerospec.model.config.GPTConfig`: LlamaForCausalLM,
MistralForCausalLM and Qwen2ForCausalLM (RMSNorm, SwiGLU, grouped-query attention, RoPE; Qwen2
with q/k/v biases) and GPT2LMHeadModel (LayerNorm, GELU, learned positions, tied head, biases).
Every field a shape needs must be in the file: a missing one is refused by name, never guessed;
only those whose absence Hugging Face itself defaults are optional (num_key_value_heads:
multi-head; tie_word_embeddings: false for Llama's family, true for GPT-2; attention_bias: false).
Attention is the memory-efficient kernel (``TODAY_ATTENTION``: transformers' default
attn_implementation is "sdpa"). Torch-free.
"""
from __future__ import annotations

import json

from .config import TODAY_ATTENTION, GPTConfig

LLAMA_FAMILY = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
ARCHITECTURES = (*LLAMA_FAMILY, "GPT2LMHeadModel")
_LLAMA_REQUIRED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                   "vocab_size", "max_position_embeddings", "rms_norm_eps", "rope_theta")
_GPT2_REQUIRED = ("n_embd", "n_layer", "n_head", "n_positions", "vocab_size", "layer_norm_epsilon")


def architecture(doc: dict, where: str = "config.json") -> str:
    archs = doc.get("architectures")
    if not isinstance(archs, list) or len(archs) != 1 or archs[0] not in ARCHITECTURES:
        raise ValueError(f"{where}: architectures = {archs!r}; accepted: one of "
                         f"{', '.join(ARCHITECTURES)}")
    return archs[0]


def _field(doc: dict, key: str, where: str, arch: str):
    if key not in doc or doc[key] is None:
        raise ValueError(f"{where}: {arch} needs the field {key!r}, which is missing")
    return doc[key]


def from_hf(doc, where: str = "config.json") -> GPTConfig:
    try:
        return _from_hf(doc, where)
    except ValueError as exc:      # GPTConfig's own refusals, said of the file
        msg = str(exc)
        raise ValueError(msg if msg.startswith(where) else f"{where}: {msg}") from None


def _from_hf(doc, where: str) -> GPTConfig:
    """A config.json object → GPTConfig; ValueError naming a missing field or an unknown
    architecture (and GPTConfig's own refusals: heads not divisible by kv heads, ...)."""
    if not isinstance(doc, dict):
        raise ValueError(f"{where}: a config.json is a JSON object, got a {type(doc).__name__}")
    arch = architecture(doc, where)
    if arch == "GPT2LMHeadModel":
        f = {k: _field(doc, k, where, arch) for k in _GPT2_REQUIRED}
        inner = doc.get("n_inner")
        return GPTConfig(vocab_size=f["vocab_size"], block_size=f["n_positions"],
                         n_layer=f["n_layer"], n_head=f["n_head"], n_embd=f["n_embd"],
                         d_ff=None if inner is None or inner == 4 * f["n_embd"] else inner,
                         norm_eps=f["layer_norm_epsilon"],
                         tie_embeddings=doc.get("tie_word_embeddings", True),
                         attention=TODAY_ATTENTION)
    f = {k: _field(doc, k, where, arch) for k in _LLAMA_REQUIRED}
    kv = doc.get("num_key_value_heads")          # absent: multi-head (Hugging Face's default)
    heads = f["num_attention_heads"]
    if isinstance(kv, int) and isinstance(heads, int) and kv > 0 and heads % kv:
        raise ValueError(f"{where}: num_attention_heads {heads} is not divisible by "
                         f"num_key_value_heads {kv} (each kv head serves the same number of "
                         f"query heads)")
    qkv_bias = True if arch == "Qwen2ForCausalLM" else doc.get("attention_bias", False)
    return GPTConfig(vocab_size=f["vocab_size"], block_size=f["max_position_embeddings"],
                     n_layer=f["num_hidden_layers"], n_head=f["num_attention_heads"],
                     n_embd=f["hidden_size"], n_kv_head=kv, d_ff=f["intermediate_size"],
                     norm="rmsnorm", norm_eps=f["rms_norm_eps"], mlp="swiglu", positions="rope",
                     rope_theta=f["rope_theta"], tie_embeddings=doc.get("tie_word_embeddings", False),
                     bias=False, qkv_bias=qkv_bias, attention=TODAY_ATTENTION)


def to_hf(cfg: GPTConfig, arch: str) -> dict:
    """The config.json fields of ``cfg`` for ``arch`` (what :func:`from_hf` reads)."""
    if arch == "GPT2LMHeadModel":
        return {"architectures": [arch], "vocab_size": cfg.vocab_size, "n_positions": cfg.block_size,
                "n_layer": cfg.n_layer, "n_head": cfg.n_head, "n_embd": cfg.n_embd,
                "n_inner": cfg.d_ff, "layer_norm_epsilon": cfg.norm_eps,
                "tie_word_embeddings": cfg.tie_embeddings}
    doc = {"architectures": [arch], "hidden_size": cfg.n_embd, "intermediate_size": cfg.ff,
           "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
           "num_key_value_heads": cfg.kv_heads, "vocab_size": cfg.vocab_size,
           "max_position_embeddings": cfg.block_size, "rms_norm_eps": cfg.norm_eps,
           "rope_theta": cfg.rope_theta, "tie_word_embeddings": cfg.tie_embeddings}
    if arch != "Qwen2ForCausalLM":
        doc["attention_bias"] = bool(cfg.qkv_bias)
    return doc


def read(path: str) -> tuple[str, GPTConfig]:
    """The config.json at ``path`` → (a name for tables: its architecture and path, the shape)."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read Hugging Face config {path!r} ({exc}); accepted: a "
                         f"config.json of {', '.join(ARCHITECTURES)}") from None
    cfg = from_hf(doc, path)
    return f"{path} ({architecture(doc, path)})", cfg
