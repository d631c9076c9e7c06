"""ZeRO++'s block quantizer (comm/quantize.py): DeepSpeed's symmetric scheme, its error bounded
element by element, and the bytes it puts on the wire."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from zerospec.comm.quantize import TARGET_GROUP, dequantize, group_size, n_groups, quantize

SLACK = 1 + 2 ** -12      # the fp32 products' relative rounding (2^−24 each), derived in quantize.py


def _tensor(rows: int, row: int, g: int, seed: int, spread: int) -> torch.Tensor:
    """fp16 rows whose groups differ in magnitude by up to 2^spread (so a scale taken from the
    wrong group shows), with a few exact ±max and zero groups."""
    gen = torch.Generator().manual_seed(seed)
    k = -(-row // g)
    x = torch.randn(rows, k * g, generator=gen)
    mag = 2.0 ** torch.randint(-spread, spread + 1, (rows, k, 1), generator=gen)
    x = (x.view(rows, k, g) * mag).view(rows, k * g)[:, :row]
    if seed % 5 == 0:
        x[:, :g] = 0                                      # an all-zero group: scale 1
    return x.contiguous().to(torch.float16).reshape(-1)


def _bound(w: torch.Tensor, rows: int, row: int, g: int, bits: int) -> torch.Tensor:
    """Per element: m/2^b, or 2m/2^b where w·s rounds to 2^(b−1) and is clamped (w ≥ m(1 − 2^−b)),
    m = max|w| over the element's group, found here group by group, apart from the quantizer."""
    w = w.to(torch.float32).view(rows, row)
    out = torch.empty_like(w)
    for a in range(0, row, g):
        grp = w[:, a:a + g]
        m = grp.abs().amax(dim=1, keepdim=True)
        clamped = grp >= m * (1 - 2.0 ** -bits)
        out[:, a:a + g] = torch.where(clamped, 2 * m, m) / 2 ** bits * SLACK
    return out.reshape(-1)


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 4), half_row=st.integers(1, 40), g_frac=st.floats(0.01, 1.0),
       bits=st.sampled_from([8, 4]), seed=st.integers(0, 2 ** 16), spread=st.integers(0, 12))
def test_every_element_is_within_its_groups_bound(rows, half_row, g_frac, bits, seed, spread):
    """|dequantize(quantize(w)) − w| ≤ m/2^b per element (m/256 in int8, m/16 in int4), and
    2m/2^b where +max is clamped to 2^(b−1) − 1 (m/128 in int8): the bound derived in
    comm/quantize.py, m its group's max|w|, every group its own scale."""
    row = 2 * half_row
    g = max(1, int(row * g_frac))
    w = _tensor(rows, row, g, seed, spread)
    codes, inv = quantize(w, g, bits, row)
    back = dequantize(codes, inv, g, bits, row)
    err = (back - w.to(torch.float32)).abs()
    assert bool((err <= _bound(w, rows, row, g, bits)).all())


@pytest.mark.parametrize("bits,clamped,half", [(8, 127, 64), (4, 7, 4)])
def test_the_scale_is_deepspeeds_2_to_the_b_over_twice_the_max(bits, clamped, half):
    """w = (1, −1/2, −1): s = 2^b/2 = 128 (int8) or 8 (int4); +max lands at 2^b/2 and is
    clamped to 2^(b−1) − 1, −max is kept exactly; 1/s travels as fp32."""
    w = torch.tensor([1.0, -0.5, -1.0, 0.0], dtype=torch.float16)
    codes, inv = quantize(w, 4, bits)
    assert inv.dtype == torch.float32 and inv.tolist() == [2.0 / 2 ** bits]
    q = codes if bits == 8 else torch.tensor([[int(b) & 15, int(b) >> 4] for b in codes]).view(-1)
    q = [v - 16 if bits == 4 and v >= 8 else int(v) for v in q.tolist()]
    assert q == [clamped, -half, -2 * half, 0]


def test_int4_codes_pack_two_to_a_byte_and_unpack_to_every_value():
    """All 16 int4 values survive packing, two per byte, in order."""
    w = torch.arange(-8, 8, dtype=torch.float32)                 # m = 8: s = 1, q = w (7 stays)
    codes, inv = quantize(w, 16, 4)
    assert codes.dtype == torch.uint8 and codes.numel() == 8
    assert dequantize(codes, inv, 16, 4).tolist() == list(range(-8, 7)) + [7]


@pytest.mark.parametrize("numel,row,g,bits", [(1000, 1000, 100, 8), (1000, 1000, 300, 8),
                                              (1200, 300, 128, 4)])
def test_wire_bytes_are_1_byte_or_half_a_byte_per_element_plus_4_per_group(numel, row, g, bits):
    """int8: numel bytes; int4: numel/2; plus one fp32 per group, ⌈row/g⌉ per row."""
    codes, inv = quantize(torch.randn(numel).half(), g, bits, row)
    assert codes.numel() * codes.element_size() == numel * bits // 8
    assert inv.numel() == n_groups(numel, g, row) == numel // row * -(-row // g)
    meta = quantize(torch.empty(numel, dtype=torch.float16, device="meta"), g, bits, row)
    assert [(t.shape, t.dtype) for t in meta] == [(codes.shape, codes.dtype), (inv.shape, inv.dtype)]


def test_group_size_defaults_to_deepspeeds_target_and_refuses_what_a_shard_cannot_hold():
    """None: the fewest near-equal groups of at most 8000; a size outside 1..row is refused,
    naming it and the accepted range."""
    assert group_size(8000, None) == TARGET_GROUP and group_size(8001, None) == 4001
    assert group_size(100, None) == 100 and group_size(100, 7) == 7
    with pytest.raises(ValueError, match=r"group size 101 cannot be used on the shard of 100 "
                                         r"elements.*accepted: an integer in 1\.\.100"):
        group_size(100, 101, "shard")
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="quantization group size"):
            group_size(100, bad)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_quantize_leaves_the_tensor_it_reads_unchanged(dtype):
    """The caller's tensor is read, never scaled in place: an fp32 input too, which ``.to(float32)``
    alone would hand back itself rather than a copy."""
    w = torch.linspace(-1, 1, 64, dtype=dtype)
    before = w.clone()
    quantize(w, 16, 8)
    assert torch.equal(w, before)
