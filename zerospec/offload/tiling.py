"""ZeRO-Infinity's memory-centric tiling (C-I3): a large operator split into T tiles, computed
tile by tile, each tile's fp16 weights fetched from the host just before its use and freed right
after, so the operator's model-state working memory (fp16 parameters + gradients, MSWM) is ÷ T.

The operator is the transformer MLP's pair of large linears, c_proj(gelu(c_fc(h))), split along
d_ff: tile k is rows [k·d_ff/T, (k+1)·d_ff/T) of c_fc's weight and bias and the same columns of
c_proj's weight. Forward keeps no tile (only h); backward fetches each tile again, recomputes its
slice of the hidden activation, computes the tile's weight gradients, sends them down to the host
and frees them before the next tile. Every fetch is booked ``from_host`` and every gradient
``to_host`` on the rank's PCIe link (``comm.book_link``); the device memory ledger counts the
tile's weights as ``gathered`` and its gradients as ``grad16``.

**What is exact and what is not.** Splitting c_fc along its *output* dim (and c_proj's weight
gradient along its output dim) leaves every dot product as it was: the hidden activation and
every weight gradient equal the untiled ones bit for bit (the kernels reduce each output over
the same hd in the same way whatever the number of outputs: checked, not assumed, in the tests).
c_proj's output y and the input gradient dh are sums over d_ff, which tiling regroups into T
partial sums: a different summation order. Their tolerance is derived, not tuned: two fp32
orderings of a K-term sum differ by at most 2·γ_K·Σ|xᵢyᵢ| with γ_K = K·u / (1 − K·u), u = 2⁻²⁴
(Higham, *Accuracy and Stability of Numerical Algorithms*, §3.1), K = d_ff + 1 (the bias):
:func:`reorder_bound`. c_proj's bias (hd elements) is not tiled; it is held whole.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..runtime.observe import off_device

U_FP32 = 2.0 ** -24     # unit roundoff of fp32


def check_tiles(d_ff: int, tiles) -> int:
    """``tiles`` as a tile count the MLP can be split into: an integer >= 1 dividing d_ff."""
    if not isinstance(tiles, int) or isinstance(tiles, bool) or tiles < 1 or d_ff % tiles:
        raise ValueError(f"tiles={tiles!r} cannot split the MLP's d_ff={d_ff} into equal tiles: "
                         f"accepted an integer >= 1 that divides {d_ff}")
    return tiles


def reorder_bound(terms_abs_sum: torch.Tensor, k: int) -> torch.Tensor:
    """The largest difference two fp32 summation orders of a ``k``-term sum can give, elementwise,
    from Σ|xᵢyᵢ| (module doc)."""
    gamma = k * U_FP32 / (1 - k * U_FP32)
    return 2 * gamma * terms_abs_sum


class TiledMLP:
    """The MLP's weights (fp16) on the host, as T tiles; ``mem``: the device's MemoryLedger;
    ``comm``: anything with ``book_link(op, tensor)`` (an Interconnect)."""

    def __init__(self, w_fc, b_fc, w_proj, b_proj, tiles: int, mem, comm):
        d_ff = w_fc.shape[0]
        self.tiles = check_tiles(d_ff, tiles)
        self.mem, self.comm, self.t = mem, comm, d_ff // tiles
        with off_device():
            self.host = [(w_fc[s].half().contiguous(), b_fc[s].half().contiguous(),
                          w_proj[:, s].half().contiguous()) for s in self.slices()]
            self.grad_host = [tuple(torch.zeros_like(x) for x in tile) for tile in self.host]
        self.b_proj = b_proj

    def slices(self):
        return [slice(k * self.t, (k + 1) * self.t) for k in range(self.tiles)]

    def fetch(self, k: int) -> list[torch.Tensor]:
        """Tile k's fp16 weights up to the device (host → device on PCIe), counted as gathered."""
        out = []
        for h in self.host[k]:
            d = self.mem.alloc("gathered", h.shape, h.dtype, zero=False)
            d.copy_(h)
            self.comm.book_link("from_host", h)
            out.append(d)
        return out

    def release(self, tensors) -> None:
        for t in tensors:
            self.mem.free(t)

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        # c_proj's bias outside the Function: autograd gives it its gradient as usual
        return _Tiled.apply(h, self) + self.b_proj


def _tile_out(h, wfc, bfc, wproj):
    return F.linear(F.gelu(F.linear(h, wfc, bfc)), wproj)


class _Tiled(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, op: TiledMLP):
        ctx.op = op
        ctx.save_for_backward(h)
        y = None
        for k in range(op.tiles):
            w = op.fetch(k)
            part = _tile_out(h, *(x.float() for x in w))
            y = part if y is None else y + part
            op.release(w)
        return y

    @staticmethod
    def backward(ctx, dy):
        (h,), op = ctx.saved_tensors, ctx.op
        dh = None
        for k in range(op.tiles):
            w = op.fetch(k)
            with torch.enable_grad():
                leaves = [x.float().requires_grad_() for x in w]
                hl = h.detach().requires_grad_()
                grads = torch.autograd.grad(_tile_out(hl, *leaves), [hl, *leaves], dy)
            dh = grads[0] if dh is None else dh + grads[0]
            g16 = [op.mem.alloc("grad16", g.shape, torch.float16, zero=False) for g in grads[1:]]
            for dst, g, d in zip(op.grad_host[k], grads[1:], g16):
                d.copy_(g)
                with off_device():
                    dst.copy_(d)
                op.comm.book_link("to_host", d)
            op.release(g16)      # the tile's parameters and gradients go together: its MSWM
            op.release(w)
            del leaves, grads, hl, g16   # the fp32 casts too, before the next tile's exist
        return dh, None
