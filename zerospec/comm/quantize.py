"""Block-based symmetric quantization for the wire: ZeRO++'s qwZ (int8 weights) and qgZ (int4
gradients), arXiv:2306.10209 (claims D2, D3).

The arithmetic is DeepSpeed's kernel's (``csrc/includes/quantization_utils.h``,
``Params<Symmetric, numBits>``; read, not copied): a tensor is cut into groups of ``g`` consecutive
elements; each group's scale is s = 2^b / (2·max|w_g|) (1 when the group is all zeros), computed in
fp32; an element becomes q = round-to-nearest-even(w·s) clamped to [−2^(b−1), 2^(b−1) − 1]. What
travels is q (int8; int4 packed two to a byte) and, per group, the fp32 value 1/s, which the
receiver multiplies q by (DeepSpeed stores 1/s as a float: fp32 scales on the wire).

Error (derived, and checked by tests/unit/comm/test_quantize.py): with m = max|w_g|, 1/s = 2m/2^b.
Rounding moves w·s by at most 1/2, so |deq − w| ≤ (1/2)/s = m/2^b (m/256 in int8, m/16 in int4);
only elements with w·s ≥ 2^(b−1) − 1/2 are clamped to 2^(b−1) − 1, where the error is at most
w − (2^(b−1) − 1)/s ≤ m − m + 1/s = 2m/2^b (m/128 at +max in int8). The fp32 products add relative
errors of 2^−24 each: the tests allow a factor 1 + 2^−12 on these bounds, no more.

Groups: each row of the tensor (a rank's shard, or one destination's chunk in qgZ) is cut into
groups of ``g`` consecutive elements, the last one shorter when ``g`` does not divide the row (its
absmax ignores the zeros it is padded with): groups never straddle two rows, so a row travels with
its own scales. ``g`` None picks DeepSpeed's target (``CUDAQuantizer.target_group_size`` = 8000):
the fewest near-equal groups of at most 8000. (DeepSpeed's kernel needs ``g`` to divide the tensor
and searches a group count that does; for a shard with few divisors that search ends at groups of
8, whose fp32 scales would cost 0.5 B per element, so zerospec takes the ragged last group.)
"""
from __future__ import annotations

import torch

TARGET_GROUP = 8000     # DeepSpeed's CUDAQuantizer.target_group_size (elements per group)
SCALE_DTYPE = torch.float32   # what DeepSpeed's kernels write per group: 1/s as a float


def group_size(row: int, g: int | None, what: str = "tensor") -> int:
    """The group size used on rows of ``row`` elements: ``g`` when 1 <= g <= row (else a
    ValueError naming it and the accepted sizes), DeepSpeed's target when ``g`` is None."""
    if g is None:
        return -(-row // -(-row // TARGET_GROUP))
    if not isinstance(g, int) or isinstance(g, bool) or not 1 <= g <= row:
        raise ValueError(f"quantization group size {g!r} cannot be used on the {what} of {row} "
                         f"elements (a group lies inside it); accepted: an integer in 1..{row}, or "
                         f"None for DeepSpeed's choice")
    return g


def n_groups(numel: int, g: int, row: int | None = None) -> int:
    """Scales a tensor of ``numel`` elements in rows of ``row`` (default: one row) carries."""
    row = numel if row is None else row
    return numel // row * -(-row // g)


def quantize(w: torch.Tensor, g: int, bits: int, row: int | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, inverse scales) of the flat tensor ``w`` in rows of ``row`` elements (default: one
    row), each in groups of ``g``: int8 codes (``bits`` 8), or int4 codes packed two to a uint8
    (``bits`` 4, ``w.numel()`` even); one fp32 1/s per group."""
    numel = w.numel()
    row = numel if row is None else row
    k = -(-row // g)
    if w.device.type == "meta":   # no values: the shapes and dtypes the wire carries
        codes = torch.empty(numel * bits // 8, dtype=torch.int8 if bits == 8 else torch.uint8,
                            device="meta")
        return codes, torch.empty(n_groups(numel, g, row), dtype=SCALE_DTYPE, device="meta")
    x = w.reshape(-1, row).to(torch.float32, copy=True)   # a fresh fp32 copy: worked on in place
    if k * g != row:                             # the ragged last group, padded with zeros
        x = torch.nn.functional.pad(x, (0, k * g - row))
    x = x.view(-1, k, g)
    m = x.abs().amax(dim=2, keepdim=True)
    scale = torch.where(m == 0, 1.0, (1 << bits) / (2 * m))   # fp32, as the kernel
    half = 1 << (bits - 1)
    q = x.mul_(scale).round_().clamp_(-half, half - 1).to(torch.int8)
    q = q.view(-1, k * g)[:, :row].reshape(-1) if k * g != row else q.view(-1)
    inv = (1 / scale).reshape(-1)
    return (q if bits == 8 else _pack4(q)), inv


def dequantize(codes: torch.Tensor, inv: torch.Tensor, g: int, bits: int, row: int | None = None,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The values ``codes`` stand for (flat, ``dtype``): q · (1/s) in fp32, cast once."""
    numel = codes.numel() * 8 // bits
    row = numel if row is None else row
    k = -(-row // g)
    if codes.device.type == "meta":
        return torch.empty(numel, dtype=dtype, device="meta")
    q = (codes if bits == 8 else _unpack4(codes)).to(torch.float32).view(-1, row)
    if k * g != row:
        q = torch.nn.functional.pad(q, (0, k * g - row))
    out = q.view(-1, k, g).mul_(inv.view(-1, k, 1)).view(-1, k * g)
    return (out[:, :row] if k * g != row else out).reshape(-1).to(dtype)


def _pack4(q: torch.Tensor) -> torch.Tensor:
    """Signed int4 codes (int8 in [−8, 7]), two to a byte: element 2k low nibble, 2k+1 high."""
    n = q.to(torch.uint8) & 0xF
    return n[0::2] | (n[1::2] << 4)


def _unpack4(p: torch.Tensor) -> torch.Tensor:
    lo = (p & 0xF).to(torch.int8)
    hi = (p >> 4).to(torch.int8)
    out = torch.stack((lo, hi), dim=1).reshape(-1)
    return torch.where(out >= 8, out - 16, out)
