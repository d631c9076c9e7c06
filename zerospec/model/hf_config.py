"""A Hugging Face ``config.json`` as a decoder shape (``plan --explain --hf-config``), and back.

Four architectures map onto :class:`~zerospec.model.family.GPTConfig`, each read as transformers
builds it (transformers 5.x, models/<arch>/configuration_<arch>.py and modeling_<arch>.py):

* LlamaForCausalLM (modeling_llama.py): q/k/v/o_proj of ``head_dim`` (absent: hidden_size /
  num_attention_heads, LlamaConfig.__post_init__), all four with a bias when ``attention_bias``
  (LlamaAttention); gate/up/down_proj with a bias when ``mlp_bias`` (LlamaMLP).
* MistralForCausalLM (modeling_mistral.py): ``head_dim`` as Llama; every projection built with
  bias=False whatever the file says (MistralAttention, MistralMLP); num_key_value_heads absent is
  MistralConfig's 8.
* Qwen2ForCausalLM (modeling_qwen2.py): q/k/v_proj bias=True, o_proj and the MLP bias=False;
  ``head_dim`` read by getattr as Llama; num_key_value_heads absent is Qwen2Config's 32, None is
  num_attention_heads (Qwen2Config.__post_init__).
* GPT2LMHeadModel (modeling_gpt2.py): fused c_attn, biases everywhere, a learned position table of
  ``n_positions`` rows, inner size ``n_inner`` (None: 4·n_embd), head tied unless the file says not.

A shape key (hidden_size, layers, heads, intermediate size, vocabulary) must be in the file: a
missing one is refused by name, never taken from a class default that describes some other model.
Keys whose absence transformers fills with a value that does not depend on the model (rope_theta's
RotaryEmbeddingConfigMixin.default_theta 10000, rms_norm_eps, the biases' False, the tied head, the
context) take transformers' default, listed in :attr:`HFConfig.defaulted`. Every other key of the
file is in :attr:`HFConfig.not_modelled`, with why. Attention is the memory-efficient kernel
(``TODAY_ATTENTION``: transformers' default attn_implementation is "sdpa"). Torch-free.
"""
from __future__ import annotations

import dataclasses
import json
import math

from .family import TODAY_ATTENTION, GPTConfig

LLAMA_FAMILY = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
ARCHITECTURES = (*LLAMA_FAMILY, "GPT2LMHeadModel")
_LLAMA_REQUIRED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                   "vocab_size")
_GPT2_REQUIRED = ("n_embd", "n_layer", "n_head", "vocab_size")
# what a None default stands for, as the config classes resolve it
_NONE_MEANS = {"num_key_value_heads": "num_attention_heads", "n_inner": "4 * n_embd",
               "head_dim": "hidden_size // num_attention_heads"}
# defaults of keys the reader models, by architecture (transformers' config classes)
DEFAULTS = {
    "LlamaForCausalLM": {"num_key_value_heads": None, "head_dim": None, "rms_norm_eps": 1e-6,
                         "rope_theta": 10000.0, "attention_bias": False, "mlp_bias": False,
                         "tie_word_embeddings": False, "max_position_embeddings": 2048},
    "MistralForCausalLM": {"num_key_value_heads": 8, "head_dim": None, "rms_norm_eps": 1e-6,
                           "rope_theta": 10000.0, "tie_word_embeddings": False,
                           "max_position_embeddings": 4096 * 32},
    "Qwen2ForCausalLM": {"num_key_value_heads": 32, "head_dim": None, "rms_norm_eps": 1e-6,
                         "rope_theta": 10000.0, "tie_word_embeddings": False,
                         "max_position_embeddings": 32768},
    "GPT2LMHeadModel": {"n_inner": None, "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True,
                        "n_positions": 1024},
}
# keys read only to be refused when they build something the family does not have
_REFUSED = {("GPT2LMHeadModel", "add_cross_attention"): "adds a cross-attention block per layer"}
# why each key the reader does not model changes no parameter (or is not modelled)
WHY = {
    "rope_scaling": "rescales RoPE's frequencies: no parameter, the same tensors",
    "rope_parameters": "RoPE's type and scaling (its rope_theta is read): no parameter",
    "sliding_window": "masks scores beyond the window: no parameter; the step attends causally "
                      "over the whole sequence",
    "use_sliding_window": "see sliding_window", "max_window_layers": "see sliding_window",
    "layer_types": "full or sliding attention per layer: no parameter",
    "hidden_act": "the MLP's nonlinearity: the same tensor shapes (SiLU modelled)",
    "activation_function": "the MLP's nonlinearity: the same tensor shapes (GELU modelled)",
    "torch_dtype": "the checkpoint's storage dtype: the step's precision is the run's choice",
    "dtype": "the checkpoint's storage dtype: the step's precision is the run's choice",
    "use_cache": "the inference KV cache: none in a training step",
    "pretraining_tp": "splits Llama's linears during pretraining reproduction: same parameters",
    "n_ctx": "a legacy copy of n_positions, not read by GPT2Model",
    "attention_dropout": "dropout masks: the step runs without dropout",
    "attn_pdrop": "dropout masks: the step runs without dropout",
    "embd_pdrop": "dropout masks: the step runs without dropout",
    "resid_pdrop": "dropout masks: the step runs without dropout",
    "initializer_range": "initial values, not sizes",
    "use_mrope": "multimodal RoPE sections: no parameter",
    "scale_attn_weights": "a constant factor on the scores",
    "scale_attn_by_inverse_layer_idx": "a constant factor on the scores",
    "reorder_and_upcast_attn": "the scores' dtype in GPT-2's eager kernel: not modelled",
}
_META = ("_name_or_path", "_commit_hash", "model_type", "transformers_version", "bos_token_id",
         "eos_token_id", "pad_token_id", "task_specific_params", "summary_type", "summary_use_proj",
         "summary_activation", "summary_proj_to_labels", "summary_first_dropout")


@dataclasses.dataclass(frozen=True)
class HFConfig:
    """A config.json as read: the shape, the defaults transformers supplied, every key not
    modelled (with why). Unpacks as (name, model), the command line's pair."""

    name: str
    arch: str
    model: GPTConfig
    defaulted: tuple[tuple[str, object], ...]    # (key, transformers' default used)
    not_modelled: tuple[tuple[str, str], ...]    # (key, why)

    def __iter__(self):
        return iter((self.name, self.model))

    def __getitem__(self, i: int):
        return (self.name, self.model)[i]


def architecture(doc: dict, where: str = "config.json") -> str:
    archs = doc.get("architectures")
    if not isinstance(archs, list) or len(archs) != 1 or archs[0] not in ARCHITECTURES:
        raise ValueError(f"{where}: architectures = {archs!r}; accepted: one of "
                         f"{', '.join(ARCHITECTURES)}")
    return archs[0]


def _field(doc: dict, key: str, where: str, arch: str):
    if key not in doc or doc[key] is None:
        raise ValueError(f"{where}: {arch} needs the field {key!r}, which is missing")
    return _finite(doc[key], key, where)


def _finite(v, key: str, where: str):
    if isinstance(v, float) and not math.isfinite(v):
        raise ValueError(f"{where}: {key} = {v!r}; accepted: a finite number")
    return v


def from_hf(doc, where: str = "config.json") -> GPTConfig:
    """A config.json object → GPTConfig (:func:`parse`'s model)."""
    return parse(doc, where).model


def parse(doc, where: str = "config.json") -> HFConfig:
    """A config.json object → :class:`HFConfig`; ValueError naming a missing field, an unknown
    architecture or GPTConfig's own refusal (heads not divisible by kv heads, ...)."""
    try:
        return _parse(doc, where)
    except ValueError as exc:      # GPTConfig's own refusals, said of the file
        msg = str(exc)
        raise ValueError(msg if msg.startswith(where) else f"{where}: {msg}") from None


def _get(doc: dict, arch: str, key: str, where: str, defaulted: list):
    """A key transformers defaults: the file's value, else the config class's (recorded)."""
    if key in doc:
        value = _finite(doc[key], key, where)
        if isinstance(DEFAULTS[arch][key], bool) and not isinstance(value, bool):
            raise ValueError(f"{where}: {key} = {value!r}; accepted: true or false")
        return value
    default = DEFAULTS[arch][key]
    defaulted.append((key, _NONE_MEANS.get(key, default) if default is None else default))
    return default


def _parse(doc, where: str) -> HFConfig:
    if not isinstance(doc, dict):
        raise ValueError(f"{where}: a config.json is a JSON object, got a {type(doc).__name__}")
    arch = architecture(doc, where)
    for (a, key), why in _REFUSED.items():
        if a == arch and doc.get(key):
            raise ValueError(f"{where}: {key} = {doc[key]!r} {why}, which zerospec does not "
                             f"model; accepted: false")
    defaulted: list = []
    get = lambda key: _get(doc, arch, key, where, defaulted)      # noqa: E731
    if arch == "GPT2LMHeadModel":
        f = {k: _field(doc, k, where, arch) for k in _GPT2_REQUIRED}
        inner, positions = get("n_inner"), get("n_positions")
        model = GPTConfig(vocab_size=f["vocab_size"], block_size=positions, n_positions=positions,
                          n_layer=f["n_layer"], n_head=f["n_head"], n_embd=f["n_embd"],
                          d_ff=None if inner is None or inner == 4 * f["n_embd"] else inner,
                          norm_eps=get("layer_norm_epsilon"),
                          tie_embeddings=get("tie_word_embeddings"), attention=TODAY_ATTENTION)
        read = {*_GPT2_REQUIRED, *DEFAULTS[arch], "architectures"}
    else:
        f = {k: _field(doc, k, where, arch) for k in _LLAMA_REQUIRED}
        heads = f["num_attention_heads"]
        kv = get("num_key_value_heads")
        if kv is None:                       # LlamaConfig / Qwen2Config: multi-head
            kv = heads
        if isinstance(kv, int) and isinstance(heads, int) and kv > 0 and heads % kv:
            raise ValueError(f"{where}: num_attention_heads {heads} is not divisible by "
                             f"num_key_value_heads {kv} (each kv head serves the same number of "
                             f"query heads)")
        head_dim = get("head_dim")
        if isinstance(head_dim, int) and isinstance(heads, int) and heads and \
                head_dim * heads == f["hidden_size"]:
            head_dim = None                  # the default's own value: no field of its own
        rope = doc.get("rope_parameters")
        if isinstance(rope, dict) and "rope_theta" in rope and "rope_theta" not in doc:
            theta = _finite(rope["rope_theta"], "rope_parameters.rope_theta", where)
        else:
            theta = get("rope_theta")
        if arch == "LlamaForCausalLM":      # q, k, v AND o_proj; gate, up, down
            qkv = o = get("attention_bias")
            mlp = get("mlp_bias")
        else:                               # Qwen2: q/k/v only; Mistral: none, whatever the file
            qkv, o, mlp = arch == "Qwen2ForCausalLM", False, False
        context = get("max_position_embeddings")
        model = GPTConfig(vocab_size=f["vocab_size"], block_size=context, n_layer=f["num_hidden_layers"],
                          n_head=heads, n_embd=f["hidden_size"], n_kv_head=kv,
                          d_ff=f["intermediate_size"], norm="rmsnorm", norm_eps=get("rms_norm_eps"),
                          mlp="swiglu", positions="rope", rope_theta=theta, d_head=head_dim,
                          tie_embeddings=get("tie_word_embeddings"), bias=False, qkv_bias=qkv,
                          o_bias=o or None, mlp_bias=mlp or None,   # None: bias's False
                          attention=TODAY_ATTENTION)
        read = {*_LLAMA_REQUIRED, *DEFAULTS[arch], "architectures"}
    left = [(k, _why(arch, k)) for k in doc if k not in read]
    name = f"{where} ({arch})"
    return HFConfig(name, arch, model, tuple(defaulted), tuple(left))


def _why(arch: str, key: str) -> str:
    if key in WHY:
        return WHY[key]
    if key in _META:
        return "metadata: no parameter, no byte of the step"
    if key in ("attention_bias", "mlp_bias") and arch != "LlamaForCausalLM":
        return (f"{arch}'s modelling code builds its projections' biases regardless "
                f"(q/k/v only for Qwen2, none for Mistral)")
    return f"not read by zerospec: not one of the keys it models for {arch}"


def to_hf(cfg: GPTConfig, arch: str) -> dict:
    """The config.json fields of ``cfg`` for ``arch`` (what :func:`from_hf` reads)."""
    if arch == "GPT2LMHeadModel":
        return {"architectures": [arch], "vocab_size": cfg.vocab_size,
                "n_positions": cfg.position_rows, "n_layer": cfg.n_layer, "n_head": cfg.n_head,
                "n_embd": cfg.n_embd, "n_inner": cfg.d_ff, "layer_norm_epsilon": cfg.norm_eps,
                "tie_word_embeddings": cfg.tie_embeddings}
    doc = {"architectures": [arch], "hidden_size": cfg.n_embd, "intermediate_size": cfg.ff,
           "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
           "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim,
           "vocab_size": cfg.vocab_size, "max_position_embeddings": cfg.block_size,
           "rms_norm_eps": cfg.norm_eps, "rope_theta": cfg.rope_theta,
           "tie_word_embeddings": cfg.tie_embeddings}
    if arch == "LlamaForCausalLM":
        doc["attention_bias"] = bool(cfg.qkv_bias)
        doc["mlp_bias"] = bool(cfg.mlp_bias)
    return doc


def read(path: str) -> HFConfig:
    """The config.json at ``path`` → :class:`HFConfig` (named by its path and architecture)."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read Hugging Face config {path!r} ({exc}); accepted: a "
                         f"config.json of {', '.join(ARCHITECTURES)}") from None
    return parse(doc, path)
