"""GPT shapes of the paper's model sizes, for measuring them on meta tensors (:mod:`zerospec.training.scale`).

The paper names models by round sizes (7.5B, 128B, 1T) and gives layer/hidden shapes only for the
models it trained (Table 4, C50; heads from the appendix tables, C52). Every preset here is a
:class:`~zerospec.model.family.GPTConfig` — GPT-2's vocabulary (50257) and context (1024), LM head tied to
the token embedding — so its exact Ψ is

    Ψ = 12·L·d² + 13·L·d  (blocks: QKV, projection, MLP weights and biases, two LayerNorms)
      + (50257 + 1024)·d   (token and position embeddings)
      + 2·d                (final LayerNorm)

Paper-size presets and their exact Ψ (shapes chosen here; the paper gives none for them):

=======  ======  =====  =====  =================  ===============================================
name     layers  d      heads  Ψ                  why this shape
=======  ======  =====  =====  =================  ===============================================
1.5B     48      1600   16     1,557,611,200      GPT-2 1.5B as in Table 4 (C50, C52: 16 heads)
7.5B     23      5120   40     7,499,274,240      Ψ within 0.01% of 7.5e9, so Figure 1 (C14) and
                                                  Table 1 (C16) hold at the preset's own Ψ
128B     159     8192   64     128,480,755,712    the paper's 8192-wide family (Table 4: 100–212
                                                  layers); 159 layers is the nearest to 128B
1T       128     25600  160    1,007,988,403,200  Megatron-LM's 1T shape (Narayanan et al. 2021)
=======  ======  =====  =====  =================  ===============================================

Table 4 presets are named ``t4-<label>-<layers>x<d>``, e.g. ``t4-40B-88x6144``.

Published models (:data:`PUBLISHED`), from each Hugging Face repo's config.json (hidden_size,
intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads, vocab_size,
max_position_embeddings, rope_theta, rms_norm_eps, tie_word_embeddings; attention bias from the
architecture: Qwen2 has q/k/v biases, Llama and Mistral none). Their Ψ is the decoder family's
closed form (:attr:`GPTConfig.psi`), equal to the count of the published weights:

===============  ======  =====  =====  ===  =====  =======  ===================
name             layers  d      heads  kv   d_ff   vocab    Ψ
===============  ======  =====  =====  ===  =====  =======  ===================
llama-2-7b       32      4096   32     32   11008  32000    6,738,415,616
llama-2-13b      40      5120   40     40   13824  32000    13,015,864,320
llama-2-70b      80      8192   64     8    28672  32000    68,976,648,192
llama-3-8b       32      4096   32     8    14336  128256   8,030,261,248
llama-3-70b      80      8192   64     8    28672  128256   70,553,706,496
llama-3.1-8b     32      4096   32     8    14336  128256   8,030,261,248
llama-3.1-405b   126     16384  128    8    53248  128256   405,853,388,800
mistral-7b-v0.1  32      4096   32     8    14336  32000    7,241,732,096
qwen2.5-7b       28      3584   28     4    18944  152064   7,615,616,512
qwen2.5-72b      80      8192   64     8    29568  152064   72,706,203,648
gpt-3-175b       96      12288  96     96   49152  50257    174,604,259,328
===============  ======  =====  =====  ===  =====  =======  ===================

Published presets run attention as a memory-efficient kernel (``attention="sdpa"``,
zerospec/model/flash.py); the paper's and Table 4's keep it written out (``"eager"``).

What the family leaves out changes no parameter: Mistral's sliding window, Llama-3.1's RoPE
frequency scaling (``rope_scaling``), GPT-3's alternating sparse attention (Brown et al. 2020).
"""
from __future__ import annotations

import dataclasses

from .family import TODAY_ATTENTION, GPTConfig

GPT2_VOCAB = 50257
GPT2_CONTEXT = 1024


def gpt(layers: int, d: int, heads: int) -> GPTConfig:
    """A GPT-2-vocabulary, 1K-context model of ``layers`` blocks of width ``d``."""
    return GPTConfig(vocab_size=GPT2_VOCAB, block_size=GPT2_CONTEXT, n_positions=GPT2_CONTEXT,
                     n_layer=layers, n_head=heads, n_embd=d)


@dataclasses.dataclass(frozen=True)
class Preset:
    name: str
    label: float          # the paper's round size (parameters), e.g. 7.5e9
    model: GPTConfig
    source: str           # claim ids / where the shape comes from
    printed: bool = True  # Table 4 presets: the label is printed in Table 4 itself (not only C52)

    @property
    def psi(self) -> int:
        return self.model.psi


PAPER = {
    "1.5B": Preset("1.5B", 1.5e9, gpt(48, 1600, 16), "C27, C50, C52: GPT-2 1.5B"),
    "7.5B": Preset("7.5B", 7.5e9, gpt(23, 5120, 40), "C14, C15, C16: Figure 1, Table 1"),
    "128B": Preset("128B", 128e9, gpt(159, 8192, 64), "C15, C16: Table 1"),
    "1T": Preset("1T", 1e12, gpt(128, 25600, 160), "C12, C15, C16: Table 1"),
}

# Table 4 (SC'20 Table IV, C50) with heads from the appendix tables (C52): (column, label, layers,
# hidden, heads, printed). A range label ("40B–60B") names its first and last layer counts: those
# labels are printed in Table 4 (printed=True); middle layer counts (e.g. 125 in "80B–170B") take
# the label of their appendix row (C52, printed=False). 8B (72×3072) is in both columns.
TABLE4_ROWS = (
    ("Figure 2", "1.5B", 48, 1600, 16, True),
    ("Figure 2", "8B", 72, 3072, 24, True),
    ("Figure 2", "20B", 98, 4096, 32, True),
    ("Figure 2", "40B", 88, 6144, 32, True),
    ("Figure 2", "60B", 132, 6144, 32, True),
    ("Figure 2", "80B", 100, 8192, 64, True),
    ("Figure 2", "100B", 125, 8192, 64, False),
    ("Figure 2", "120B", 150, 8192, 64, False),
    ("Figure 2", "140B", 175, 8192, 64, False),
    ("Figure 2", "170B", 212, 8192, 64, True),
    ("Figures 3 and 8", "1.16B", 24, 1920, 16, True),
    ("Figures 3 and 8", "1.5B", 34, 1920, 16, False),
    ("Figures 3 and 8", "2.5B", 54, 1920, 16, True),
    ("Figures 3 and 8", "4B", 64, 2304, 24, True),
    ("Figures 3 and 8", "6B", 52, 3072, 24, True),
    ("Figures 3 and 8", "8B", 72, 3072, 24, True),
    ("Figures 3 and 8", "10B", 50, 4096, 32, True),
    ("Figures 3 and 8", "11B", 54, 4096, 32, False),
    ("Figures 3 and 8", "12B", 58, 4096, 32, False),
    ("Figures 3 and 8", "13B", 62, 4096, 32, True),
    ("Figures 3 and 8", "60B", 75, 8192, 32, True),
)


def _label_value(label: str) -> float:
    return float(label[:-1]) * {"B": 1e9, "T": 1e12}[label[-1]]


TABLE4 = {f"t4-{label}-{L}x{d}": Preset(f"t4-{label}-{L}x{d}", _label_value(label), gpt(L, d, h),
                                        f"C50{'' if printed else ', C52'}: Table 4, {col}", printed)
          for col, label, L, d, h, printed in TABLE4_ROWS}



def llama(layers: int, d: int, heads: int, kv_heads: int, d_ff: int, vocab: int, context: int,
          rope_theta: float, norm_eps: float = 1e-5, qkv_bias: bool = False) -> GPTConfig:
    """A Llama-architecture decoder: RMSNorm, SwiGLU, grouped-query attention, RoPE, an untied
    LM head, no biases (``qkv_bias``: Qwen2's q/k/v biases); attention by the memory-efficient
    kernel, as these models are trained today (:data:`TODAY_ATTENTION`)."""
    return GPTConfig(vocab_size=vocab, block_size=context, n_layer=layers, n_head=heads, n_embd=d,
                     n_kv_head=kv_heads, d_ff=d_ff, norm="rmsnorm", norm_eps=norm_eps, mlp="swiglu",
                     positions="rope", rope_theta=rope_theta, tie_embeddings=False, bias=False,
                     qkv_bias=qkv_bias, attention=TODAY_ATTENTION)


def _hf(repo: str, extra: str = "") -> str:
    """The source of a published preset: its Hugging Face repo's config.json (the fields the
    module docstring names)."""
    return f"huggingface.co/{repo} config.json{extra}"


PUBLISHED = {p.name: p for p in (
    Preset("llama-2-7b", 7e9, llama(32, 4096, 32, 32, 11008, 32000, 4096, 1e4),
           _hf("meta-llama/Llama-2-7b-hf")),
    Preset("llama-2-13b", 13e9, llama(40, 5120, 40, 40, 13824, 32000, 4096, 1e4),
           _hf("meta-llama/Llama-2-13b-hf")),
    Preset("llama-2-70b", 70e9, llama(80, 8192, 64, 8, 28672, 32000, 4096, 1e4),
           _hf("meta-llama/Llama-2-70b-hf")),
    Preset("llama-3-8b", 8e9, llama(32, 4096, 32, 8, 14336, 128256, 8192, 5e5),
           _hf("meta-llama/Meta-Llama-3-8B")),
    Preset("llama-3-70b", 70e9, llama(80, 8192, 64, 8, 28672, 128256, 8192, 5e5),
           _hf("meta-llama/Meta-Llama-3-70B")),
    Preset("llama-3.1-8b", 8e9, llama(32, 4096, 32, 8, 14336, 128256, 131072, 5e5),
           _hf("meta-llama/Llama-3.1-8B", "; rope_scaling (llama3) not modelled: no parameters; "
               "Llama 3 8B's shapes, context 131072")),
    Preset("llama-3.1-405b", 405e9, llama(126, 16384, 128, 8, 53248, 128256, 131072, 5e5),
           _hf("meta-llama/Llama-3.1-405B", "; rope_scaling (llama3) not modelled: no parameters")),
    Preset("mistral-7b-v0.1", 7.3e9, llama(32, 4096, 32, 8, 14336, 32000, 32768, 1e4),
           _hf("mistralai/Mistral-7B-v0.1", "; sliding_window 4096 not modelled: no parameters; "
                                                 "announced as 7.3B")),
    Preset("qwen2.5-7b", 7.61e9, llama(28, 3584, 28, 4, 18944, 152064, 131072, 1e6, 1e-6, True),
           _hf("Qwen/Qwen2.5-7B", "; q/k/v biases (Qwen2); model card: 7.61B parameters")),
    Preset("qwen2.5-72b", 72.7e9, llama(80, 8192, 64, 8, 29568, 152064, 131072, 1e6, 1e-5, True),
           _hf("Qwen/Qwen2.5-72B", "; q/k/v biases (Qwen2); model card: 72.7B parameters")),
    Preset("gpt-3-175b", 175e9, GPTConfig(vocab_size=GPT2_VOCAB, block_size=2048, n_positions=2048,
                                          n_layer=96, n_head=96, n_embd=12288,
                                          attention=TODAY_ATTENTION),
           "Brown et al. 2020, Table 2.1 (GPT-3 175B: 96 layers, d 12288, 96 heads, context 2048) "
           "with GPT-2's vocabulary and block (LayerNorm, GELU, learned positions, tied, biases)"),
)}

PRESETS = {**PAPER, **TABLE4, **PUBLISHED}


def preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; accepted: {', '.join(PRESETS)}")
    return PRESETS[name]
