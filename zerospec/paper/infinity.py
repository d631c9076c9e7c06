"""ZeRO-Infinity's closed forms (arXiv:2104.07857 §3–4), each once, with its claim id.

hd: hidden size, nl: transformer blocks, ci: blocks between activation checkpoints, bsz: batch
per GPU, seq: sequence length. Bytes, FLOPs and FLOP/s; exact Fractions where a division is.
"""
from __future__ import annotations

from fractions import Fraction

BYTES_PER_PARAM = 20       # C-I1: fp16 p + g (4), fp32 p, g, momentum, variance (16)
PEAK_TP = 70 * 10**12      # C-I6: Fig. 3's achievable peak per GPU, 70 TFLOPS


def params(nl: int, hd: int) -> int:
    """C-I1: ≈ 12·nl·hd², the four linears of each block (hd×3hd, hd×hd, hd×4hd, 4hd×hd)."""
    return 12 * nl * hd * hd


def model_state_bytes(nl: int, hd: int) -> int:
    """C-I1: 20 bytes per parameter, 240·nl·hd²."""
    return BYTES_PER_PARAM * params(nl, hd)


def checkpoint_bytes(bsz: int, seq: int, hd: int, nl: int, ci: int) -> Fraction:
    """C-I2: one fp16 hidden state per checkpoint, nl/ci of them: 2·bsz·seq·hd·nl/ci."""
    return Fraction(2 * bsz * seq * hd * nl, ci)


def mswm_bytes(hd: int) -> int:
    """C-I3: fp16 parameter and gradient of the largest operator, the hd→4hd linear: 4·hd·4hd."""
    return 4 * hd * 4 * hd


def awm_bytes(bsz: int, seq: int, ci: int, hd: int, heads: int) -> int:
    """C-I4: bsz·seq·ci·(16·hd + 2·heads·seq)."""
    return bsz * seq * ci * (16 * hd + 2 * heads * seq)


def ait(data: str, *, seq: int = 0, bsz: int = 0, hd: int = 0, ci: int = 1) -> Fraction:
    """C-I5's arithmetic intensity per data type: parameters and gradients (8 bytes per parameter
    moved: loaded 3 times, gradients stored once) seq·bsz; optimizer states (32 bytes: read and
    written once) seq·bsz/4; activation checkpoints (4·nl/ci·hd·seq·bsz bytes) 24·hd·ci."""
    forms = {"params": lambda: Fraction(seq * bsz), "optimizer": lambda: Fraction(seq * bsz, 4),
             "checkpoints": lambda: Fraction(24 * hd * ci)}
    if data not in forms:
        raise ValueError(f"data must be one of {', '.join(forms)}, got {data!r}")
    return forms[data]()


def efficiency(ait_, bw, peak_tp=PEAK_TP) -> Fraction:
    """C-I5: compute time over compute plus transfer time, no overlap: ait·bw / (ait·bw + peak)."""
    return Fraction(ait_) * Fraction(bw) / (Fraction(ait_) * Fraction(bw) + Fraction(peak_tp))


def bandwidth_for(eff, ait_, peak_tp=PEAK_TP) -> Fraction:
    """C-I6: the bandwidth that reaches efficiency ``eff``, C-I5 solved for bw."""
    eff = Fraction(eff)
    return eff * Fraction(peak_tp) / (Fraction(ait_) * (1 - eff))
