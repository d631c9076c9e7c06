"""The tiny GPT's shape (:class:`GPTConfig`) and the two shapes the tests train, without torch:
the command line's ``plan`` and the presets read shapes and Ψ only (:mod:`zerospec.model.gpt` is
the model itself)."""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .units import Unit


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 1024
    block_size: int = 64      # sequence length T
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 128

    def __post_init__(self):
        for f in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            v = getattr(self, f)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"GPTConfig.{f} must be an integer >= 1, got {v!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} must be divisible by n_head={self.n_head}")

    def unit_spec(self, n_m: int = 1) -> list[tuple[str, list[tuple[str, tuple[int, ...]]]]]:
        """Sharding units in forward order: embeddings, one per block, final LayerNorm — as one
        of ``n_m`` model-parallel ranks holds them (Megatron-LM's slicing, zerospec/model/megatron.py:
        QKV and MLP-up split by rows, attention-out and MLP-down by columns; the rest replicated)."""
        check_mp(self, n_m)
        d, e, blocks = self.n_embd, self.n_embd // n_m, []
        for i in range(self.n_layer):
            blocks.append((f"h.{i}", [
                ("ln_1.weight", (d,)), ("ln_1.bias", (d,)),
                ("attn.c_attn.weight", (3 * e, d)), ("attn.c_attn.bias", (3 * e,)),
                ("attn.c_proj.weight", (d, e)), ("attn.c_proj.bias", (d,)),
                ("ln_2.weight", (d,)), ("ln_2.bias", (d,)),
                ("mlp.c_fc.weight", (4 * e, d)), ("mlp.c_fc.bias", (4 * e,)),
                ("mlp.c_proj.weight", (d, 4 * e)), ("mlp.c_proj.bias", (d,)),
            ]))
        return ([("embed", [("wte", (self.vocab_size, d)), ("wpe", (self.block_size, d))])]
                + blocks + [("ln_f", [("weight", (d,)), ("bias", (d,))])])

    def units(self, n_d: int, pad: bool = True, n_m: int = 1) -> tuple[Unit, ...]:
        from .units import make_units   # here: units.py lays tensors out, and imports torch
        return make_units(self.unit_spec(n_m), n_d, pad)

    @property
    def psi(self) -> int:
        """Parameter count Ψ (LM head tied to wte, so counted once)."""
        d, L = self.n_embd, self.n_layer
        return (self.vocab_size + self.block_size) * d + L * (12 * d * d + 13 * d) + 2 * d


def check_mp(cfg: GPTConfig, n_m) -> None:
    """ValueError unless ``n_m`` model-parallel ranks can split ``cfg``'s heads evenly."""
    if not isinstance(n_m, int) or isinstance(n_m, bool) or n_m < 1:
        raise ValueError(f"n_m (model-parallel degree) must be an integer >= 1, got {n_m!r}")
    if cfg.n_head % n_m:
        raise ValueError(f"n_m={n_m} must divide n_head={cfg.n_head} (Megatron-LM splits attention "
                         f"by heads; n_embd={cfg.n_embd} and 4·n_embd then split too)")


SMALL = GPTConfig()
ODD = GPTConfig(vocab_size=37, block_size=12, n_layer=2, n_head=3, n_embd=15)  # units divide by no N
