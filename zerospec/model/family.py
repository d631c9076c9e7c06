"""The tiny GPT's shape (:class:`GPTConfig`) and the two shapes the tests train, without torch:
the command line's ``plan`` and the presets read shapes and Ψ only (:mod:`zerospec.model.gpt` is
the model itself)."""
from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .units import Unit


_CHOICES = {"norm": ("layernorm", "rmsnorm"), "mlp": ("gelu", "swiglu"),
            "positions": ("learned", "rope"), "attention": ("eager", "sdpa")}
ATTENTION = _CHOICES["attention"]
# the attention kernel of today's models (the published presets, a config.json's): a
# memory-efficient one, as transformers (its default attn_implementation, "sdpa") and torchtitan
# (SDPA or flex attention) train them; the paper's models keep the written-out attention of 2019
# (the default, "eager"), so none of the paper's figures moves
TODAY_ATTENTION = "sdpa"


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    """A decoder-only transformer: GPT-2 by default (every new field's default is GPT-2's), and
    by its fields the Llama family (RMSNorm, SwiGLU, grouped-query attention, RoPE, untied head,
    no biases) and Qwen2 (the same with q/k/v biases)."""

    vocab_size: int = 1024
    block_size: int = 64      # sequence length T of a step (with RoPE only a bound: no position table)
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 128
    norm: str = "layernorm"   # "layernorm" | "rmsnorm" (RMSNorm has no bias)
    norm_eps: float = 1e-5
    mlp: str = "gelu"         # "gelu": c_proj(gelu(c_fc(x))); "swiglu": c_proj(silu(c_gate(x)) * c_fc(x))
    d_ff: int | None = None   # intermediate size; None: 4·n_embd
    n_kv_head: int | None = None   # grouped-query attention; None: n_head (multi-head)
    positions: str = "learned"     # "learned" (a wpe table) | "rope" (rotary, no table)
    rope_theta: float = 10000.0
    tie_embeddings: bool = True    # untied: an lm_head unit of its own after the final norm
    bias: bool = True              # biases of every linear and of LayerNorm
    qkv_bias: bool | None = None   # q/k/v biases (Qwen2: True with bias=False); None: bias
    o_bias: bool | None = None     # the attention output's bias (Llama's attention_bias); None: bias
    mlp_bias: bool | None = None   # the MLP's biases (Llama's mlp_bias); None: bias
    d_head: int | None = None      # head dim (config.json's head_dim); None: n_embd / n_head
    n_positions: int | None = None  # rows of the learned position table, the model's own
    #                                (GPT-2's n_positions): Ψ whatever the step's block_size T <= it;
    #                                None: block_size
    attention: str = "eager"       # "eager": written out, B·H·T² scores and probabilities kept;
    #                                "sdpa": a memory-efficient kernel keeping q, k, v, the output
    #                                and the log-sum-exp per row (zerospec/model/flash.py)
    vocab_divisor: int = 128       # Megatron-LM's make-vocab-size-divisible-by: with N_m > 1 the
    #                                vocabulary pads to a multiple of vocab_divisor·N_m (padded_vocab)

    def __post_init__(self):
        for f in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "vocab_divisor"):
            _positive(f, getattr(self, f))
        for f in ("d_ff", "n_kv_head", "d_head", "n_positions"):
            if getattr(self, f) is not None:
                _positive(f, getattr(self, f))
        for f, accepted in _CHOICES.items():
            if getattr(self, f) not in accepted:
                raise ValueError(f"GPTConfig.{f} must be one of {', '.join(map(repr, accepted))}, "
                                 f"got {getattr(self, f)!r}")
        for f in ("norm_eps", "rope_theta"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"GPTConfig.{f} must be a number > 0, got {v!r}")
            if v == float("inf"):
                raise ValueError(f"GPTConfig.{f} must be finite, got {v!r}")
        for f in ("tie_embeddings", "bias", "qkv_bias", "o_bias", "mlp_bias"):
            v = getattr(self, f)
            optional = f in ("qkv_bias", "o_bias", "mlp_bias")
            if not isinstance(v, bool) and not (optional and v is None):
                raise ValueError(f"GPTConfig.{f} must be True or False"
                                 f"{' or None (= bias)' if optional else ''}, got {v!r}")
        if self.positions == "learned" and self.block_size > self.position_rows:
            raise ValueError(f"block_size={self.block_size} exceeds the position table's "
                             f"n_positions={self.n_positions} rows")
        if self.d_head is None and self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} must be divisible by n_head={self.n_head}")
        if self.n_head % self.kv_heads:
            raise ValueError(f"n_head={self.n_head} must be divisible by n_kv_head={self.n_kv_head} "
                             f"(each kv head serves n_head/n_kv_head query heads)")
        if self.positions == "rope" and self.head_dim % 2:
            raise ValueError(f"positions='rope' needs an even head dim, got n_embd/n_head = "
                             f"{self.n_embd}/{self.n_head} = {self.head_dim}")

    # -- resolved defaults ---------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head if self.d_head is None else self.d_head

    @property
    def position_rows(self) -> int:
        """Rows of the learned position table: n_positions, else block_size."""
        return self.block_size if self.n_positions is None else self.n_positions

    @property
    def kv_heads(self) -> int:
        return self.n_head if self.n_kv_head is None else self.n_kv_head

    @property
    def ff(self) -> int:
        return 4 * self.n_embd if self.d_ff is None else self.d_ff

    @property
    def has_qkv_bias(self) -> bool:
        return self.bias if self.qkv_bias is None else self.qkv_bias

    @property
    def has_o_bias(self) -> bool:
        return self.bias if self.o_bias is None else self.o_bias

    @property
    def has_mlp_bias(self) -> bool:
        return self.bias if self.mlp_bias is None else self.mlp_bias

    @property
    def norm_params(self) -> tuple[str, ...]:
        """A norm's parameters: LayerNorm's gain and (with biases) bias; RMSNorm's gain."""
        return ("weight", "bias") if self.norm == "layernorm" and self.bias else ("weight",)

    @property
    def gpt2_only(self) -> list[str]:
        """The fields set away from GPT-2's block (each one sliced by model parallelism too:
        zerospec/model/megatron.py)."""
        return [f"{f}={getattr(self, f)!r}" for f in ("norm", "mlp", "n_kv_head", "positions",
                                                     "tie_embeddings", "bias", "qkv_bias", "o_bias",
                                                     "mlp_bias", "d_head", "d_ff")
                if getattr(self, f) != GPTConfig.__dataclass_fields__[f].default]

    def padded_vocab(self, n_m: int = 1) -> int:
        """V_p: the vocabulary as N_m model-parallel ranks hold it, split by rows
        (zerospec/model/megatron.py). With N_m > 1, V rounded up to a multiple of
        vocab_divisor·N_m, as Megatron-LM pads it (GPT-2's 50,257 → 50,432 at N_m = 2, 51,200 at
        N_m = 8 or 16); the padded rows are memory, not parameters (Ψ leaves them out). At N_m = 1
        V itself: nothing is split, and Megatron's own padding there (to 50,304) would change every
        single-rank figure for rows no token uses."""
        check_mp(self, n_m)
        if n_m == 1:
            return self.vocab_size
        q = self.vocab_divisor * n_m
        return -(-self.vocab_size // q) * q

    # -- shapes ----------------------------------------------------------------------------------
    def unit_spec(self, n_m: int = 1, tiles: int = 1) -> list[tuple[str, list[tuple[str, tuple[int, ...]]]]]:
        """Sharding units in forward order: embeddings, one per block, the final norm, and (untied)
        the LM head — as one of ``n_m`` model-parallel ranks holds them (Megatron-LM's slicing,
        zerospec/model/megatron.py: QKV and MLP-up (and gate) split by rows, attention-out and
        MLP-down by columns, wte and an untied head by rows of the padded vocabulary
        (:meth:`padded_vocab`); the rest replicated). GPT-2's names and order; a parameter the
        config leaves out (a bias, the position table) is absent, not zero.

        ``tiles`` T > 1 (ZeRO-Infinity's memory-centric tiling, C-I3): each block's MLP weights
        leave its unit for T units ``h.<i>.mlp<k>`` right after it, tile k holding rows
        [k·f/T, (k+1)·f/T) of c_gate and c_fc (weights and biases) and the same columns of
        c_proj's weight; c_proj's bias stays in the block (:func:`check_tiles`)."""
        check_mp(self, n_m)
        check_tiles(self, tiles, n_m)
        d, hd, f = self.n_embd, self.head_dim, self.ff // n_m
        q, kv = self.n_head * hd // n_m, self.kv_heads * hd // n_m
        ob, mb, norm = self.has_o_bias, self.has_mlp_bias, self.norm_params

        def linear(name, out, inp, bias):
            return [(f"{name}.weight", (out, inp))] + ([(f"{name}.bias", (out,))] if bias else [])

        mlp_in = (linear("mlp.c_gate", f, d, mb) if self.mlp == "swiglu" else []) + linear("mlp.c_fc", f, d, mb)
        block = ([(f"ln_1.{n}", (d,)) for n in norm]
                 + linear("attn.c_attn", q + 2 * kv, d, self.has_qkv_bias)
                 + linear("attn.c_proj", d, q, False) + ([("attn.c_proj.bias", (d,))] if ob else [])
                 + [(f"ln_2.{n}", (d,)) for n in norm]
                 + mlp_in + linear("mlp.c_proj", d, f, False) + ([("mlp.c_proj.bias", (d,))] if mb else []))
        v = self.padded_vocab(n_m) // n_m                   # this rank's rows of the vocabulary
        embed = [("wte", (v, d))] + ([("wpe", (self.position_rows, d))]
                                                   if self.positions == "learned" else [])
        head = [] if self.tie_embeddings else [("lm_head", [("weight", (v, d))])]
        blocks = [(f"h.{i}", list(block)) for i in range(self.n_layer)]
        if tiles > 1:
            ft = f // tiles
            tile = ((linear("mlp.c_gate", ft, d, mb) if self.mlp == "swiglu" else [])
                    + linear("mlp.c_fc", ft, d, mb) + linear("mlp.c_proj", d, ft, False))
            moved = {n for n, _ in mlp_in} | {"mlp.c_proj.weight"}
            blocks = [u for i in range(self.n_layer)
                      for u in [(f"h.{i}", [(n, s) for n, s in block if n not in moved])]
                      + [(f"h.{i}.mlp{k}", list(tile)) for k in range(tiles)]]
        return [("embed", embed)] + blocks + [("ln_f", [(n, (d,)) for n in norm])] + head

    def largest_module(self, n_m: int = 1) -> int:
        """The parameters of the largest single module, as DeepSpeed's ``model_to_params``
        (deepspeed/runtime/zero/stage3.py, feeding estimate_zero3_model_states_mem_needs) takes
        it: each module's own parameters (recurse=False), the largest. Modules as transformers
        builds them: GPT-2's fused c_attn; the Llama family's q_proj, k_proj, v_proj apart."""
        sizes: dict[str, int] = {}
        q, kv = self.n_head * self.head_dim // n_m, self.kv_heads * self.head_dim // n_m
        for unit, params in self.unit_spec(n_m):
            for name, shape in params:
                module, _, _ = name.rpartition(".")
                n = 1
                for x in shape:
                    n *= x
                if module == "attn.c_attn" and self.positions == "rope":
                    part = shape[-1] if name.endswith("weight") else 1
                    for m, rows in (("q", q), ("k", kv), ("v", kv)):
                        key = f"{unit}.{m}_proj"
                        sizes[key] = sizes.get(key, 0) + rows * part
                    continue
                key = f"{unit}.{module or name}"
                sizes[key] = sizes.get(key, 0) + n
        return max(sizes.values())

    def units(self, n_d: int, pad: bool = True, n_m: int = 1, tiles: int = 1) -> tuple[Unit, ...]:
        return _units(self, n_d, pad, n_m, tiles)

    @property
    def psi(self) -> int:
        """Parameter count Ψ, exact, from the shapes (a tied LM head is wte, counted once):

            Ψ = L·[d·(q + 2·kv) + q·d + m·d·f            (QKV, attention out, MLP weights)
                   + β_qkv·(q + 2·kv) + β_o·d + β_mlp·((m−1)·f + d)  (biases)
                   + 2·ν·d]                               (two norms)
              + V·d·(2 − tied) + λ·P·d + ν·d              (embeddings, LM head, final norm)

        with q = n_head·head_dim (d unless head_dim is set), kv = n_kv_head·head_dim, f = d_ff,
        m = 2 (GELU) or 3 (SwiGLU's gate, up and down), β_qkv / β_o / β_mlp = 1 with q-k-v /
        attention-output / MLP biases, ν = 2 for a LayerNorm with bias else 1, λ = 1 for a
        learned position table of P = n_positions rows (the model's, not the step's sequence).
        GPT-2 (kv = q = d,
        f = 4d, m = 2, β = β_qkv = 1, ν = 2, λ = 1, tied): 12·L·d² + 13·L·d + (V + T)·d + 2·d."""
        d, L, V, T = self.n_embd, self.n_layer, self.vocab_size, self.position_rows
        q, kv, f = self.n_head * self.head_dim, self.kv_heads * self.head_dim, self.ff
        m = 3 if self.mlp == "swiglu" else 2
        nu, beta_qkv = len(self.norm_params), int(self.has_qkv_bias)
        beta_o, beta_mlp = int(self.has_o_bias), int(self.has_mlp_bias)
        lam = int(self.positions == "learned")
        block = (d * (q + 2 * kv) + q * d + m * d * f + beta_qkv * (q + 2 * kv)
                 + beta_o * d + beta_mlp * ((m - 1) * f + d) + 2 * nu * d)
        return L * block + V * d * (2 - self.tie_embeddings) + lam * T * d + nu * d


DecoderConfig = GPTConfig


def _positive(name: str, v) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ValueError(f"GPTConfig.{name} must be an integer >= 1, got {v!r}")


def check_mp(cfg: GPTConfig, n_m) -> None:
    """ValueError unless ``n_m`` model-parallel ranks can slice ``cfg`` evenly (Megatron-LM,
    zerospec/model/megatron.py): ``n_m`` must divide the query heads, the kv heads (grouped-query
    attention: rank j holds kv heads j·KV/N_m …, as Megatron-core requires) and the MLP's
    intermediate size d_ff. Every member of the family is sliced: norms are replicated, RoPE is
    per head, and the vocabulary is padded to divide (:meth:`GPTConfig.padded_vocab`), never
    refused."""
    if not isinstance(n_m, int) or isinstance(n_m, bool) or n_m < 1:
        raise ValueError(f"n_m (model-parallel degree) must be an integer >= 1, got {n_m!r}")
    if cfg.n_head % n_m:
        raise ValueError(f"n_m={n_m} must divide n_head={cfg.n_head} (Megatron-LM splits attention "
                         f"by heads; n_embd={cfg.n_embd} and 4·n_embd then split too)")
    if cfg.kv_heads % n_m:
        raise ValueError(f"n_m={n_m} must divide n_kv_head={cfg.kv_heads} (each model-parallel "
                         f"rank holds whole kv heads; Megatron-core refuses the same)")
    if cfg.ff % n_m:
        raise ValueError(f"n_m={n_m} must divide d_ff={cfg.ff} (the MLP's intermediate size, "
                         f"split by rows of up/gate and columns of down)")


def check_tiles(cfg: GPTConfig, tiles, n_m: int = 1) -> None:
    """ValueError unless ``tiles`` T splits each rank's MLP into equal tiles along d_ff: an
    integer >= 1 dividing d_ff / N_m."""
    f = cfg.ff // n_m
    if not isinstance(tiles, int) or isinstance(tiles, bool) or tiles < 1 or f % tiles:
        raise ValueError(f"tiles must be an integer >= 1 dividing the MLP's d_ff"
                         f"{f' / n_m = {cfg.ff}/{n_m}' if n_m > 1 else ''} = {f}, got {tiles!r}")


SMALL = GPTConfig()
ODD = GPTConfig(vocab_size=37, block_size=12, n_layer=2, n_head=3, n_embd=15)  # units divide by no N


@functools.lru_cache(maxsize=256)
def _units(cfg: GPTConfig, n_d: int, pad: bool, n_m: int, tiles: int) -> tuple[Unit, ...]:
    # a pure function of a frozen config, asked for several times a run (train, its result, each
    # meta step of a search): once per process, with the units' cached sizes (numel, padded), which
    # a paper-scale model's thousands of parameters sum again on every fresh tuple. Units are
    # frozen, so the runs that share them cannot change them.
    from .units import make_units   # here: units.py lays tensors out, and imports torch
    return make_units(cfg.unit_spec(n_m, tiles), n_d, pad)
