"""The custom quantized collectives tests/engine/test_fsdp2_quant_peer.py hands ``fully_shard``
(its module docstring says why and from which owner's code): a module of their own, imported by the
test that runs them, so that collecting the tests, which every default run does, does not import
FSDP2 (torch.distributed.fsdp and the DTensor and sympy modules under it: 0.6 s of CPU a process)."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter


def quantize(x: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each element its own group: (codes as int8, 1/s in fp32)."""
    x = x.float()
    m = x.abs()
    s = torch.where(m == 0, torch.tensor(1.0), torch.tensor(2.0 ** bits) / (2 * m))
    half = 2 ** (bits - 1)
    return torch.clamp(torch.round(x * s), -half, half - 1).to(torch.int8), 1 / s


class Int8AllGather(AllGather):
    """qwZ: each rank's flat copy-in as int8 codes and fp32 scales, all gathered, every row
    (this rank's too) dequantized into the output in its dtype."""

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        codes, inv = quantize(input_tensor, 8)
        all_codes = torch.empty(output_tensor.numel(), dtype=torch.int8)
        all_inv = torch.empty(output_tensor.numel(), dtype=torch.float32)
        dist.all_gather_into_tensor(all_codes, codes, group=group)
        dist.all_gather_into_tensor(all_inv, inv, group=group)
        output_tensor.copy_((all_codes.float() * all_inv).to(output_tensor.dtype))
        return None


class Int4ReduceScatter(ReduceScatter):
    """qgZ on one node: row j of each rank's input, as int4 codes (unpacked here: the values
    are the codes') and fp32 scales, to rank j; the rows received dequantized, summed in rank
    order in fp32, divided by N (the op, AVG, taken as the mean)."""

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        codes, inv = quantize(input_tensor, 4)
        got_codes, got_inv = torch.empty_like(codes), torch.empty_like(inv)
        dist.all_to_all_single(got_codes, codes, group=group)
        dist.all_to_all_single(got_inv, inv, group=group)
        rows = (got_codes.float() * got_inv).view(group.size(), -1)
        total = rows[0]
        for row in rows[1:]:
            total = total + row
        output_tensor.copy_(total / group.size())
        return None
