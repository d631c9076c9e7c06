"""ZeRO++'s qwZ and qgZ under the FSDP2 flavour: custom collectives, as FSDP2's owner lets a user
replace its two (torch 2.13, ``distributed/fsdp/_fully_shard``):
``FSDPModule.set_custom_all_gather(comm)`` and ``set_custom_reduce_scatter(comm)``
(``_fully_shard.py``) put ``comm`` where ``foreach_all_gather`` and ``foreach_reduce``
(``_fsdp_collectives.py``) call their ``DefaultAllGather`` / ``DefaultReduceScatter``; the
protocol (``_fsdp_api.py``: ``Comm.allocate``, ``AllGather.__call__``,
``ReduceScatter.__call__``) gives the comm the allocation of the flat buffers and the collective
call on them, nothing else. What the comm sees, and so where quantization groups lie:

* **All-gather** (qwZ): ``input_tensor`` is this rank's flat copy-in of the whole parameter group
  (``all_gather_copy_in``: each parameter's shard cast to param_dtype, concatenated), a view of
  row ``rank`` of ``output_tensor``, the ``(N, C)`` rank-major flat output
  (``foreach_all_gather_copy_out`` reads it as ``view(world_size, -1)``). So qwZ's groups run over
  the group's flat copy-in, a row of C elements, not per parameter: int8 codes and one fp32 scale
  per quantization group go on the wire, and every rank dequantizes all N rows into the output,
  its own too (comm/quantize.py's kernel, zero/zeropp.py's ``quantized_all_gather``).
* **Reduce-scatter** (qgZ): ``input_tensor`` is the group's fp32 ``reduce_scatter_input``, rank
  major too (``foreach_reduce_scatter_copy_in``: row r holds every parameter's r-th chunk), and
  ``output_tensor`` the group's 1/N output (``op`` AVG: FSDP2's fp32 reduce_dtype,
  ``_get_gradient_divide_factors``). qgZ's hierarchical int4 all-to-all
  (zero/zeropp.py's two hops) runs on those rows, groups inside each destination's row; the mean
  is taken once, in fp32, at the end. The comm's input is a one-dimensional flat tensor always,
  so DeepSpeed's fall-backs (a 1-D tensor, a size not a multiple of 2N: rules about its own
  buckets and kernel) have no object here; int4 codes go two to a byte, so a group whose row C
  is odd has each row padded with one zero (a transient, ``buffer``), and the padded row of
  C + 1 is what is quantized (its groups chosen over C + 1): a zero never raises a group's
  absmax, and half a byte per row more travels.

zerospec holds a group's reduce output unit by unit (the same bytes as FSDP2's one
``reduce_output``), so the reduce-scatter comm writes into that list of units' outputs, their
concatenation being FSDP2's output tensor. Wire buffers (codes, scales) are counted under
``buffer``, as zero/zeropp.py counts them; the fp32 dequantized sums are not (zero/zeropp.py).
"""
from __future__ import annotations

import torch

from ..comm.groups import Nodes
from ..comm.quantize import group_size
from .zeropp import quantized_all_gather, quantized_mean


class QuantizedAllGather:
    """qwZ as FSDP2's custom ``AllGather``: the group's flat copy-in quantized in groups of
    ``g`` (None: DeepSpeed's target over the row), gathered rank-major."""

    def __init__(self, g: int | None):
        self.g = g

    def __call__(self, output: torch.Tensor, input: torch.Tensor, comm, memory) -> torch.Tensor:
        return quantized_all_gather(output, input, comm, group_size(input.numel(), self.g),
                                    memory)


class QuantizedReduceScatter:
    """qgZ as FSDP2's custom ``ReduceScatter``: the group's rank-major fp32 input reduced by the
    two quantized all-to-alls (inside the node, across nodes) into the mean, in fp32."""

    def __init__(self, ctx, groups, g: int | None, gpus_per_node: int | None):
        local, across = groups
        self.local_comm, self.global_comm = ctx.comm.subgroup(local), ctx.comm.subgroup(across)
        self.n_nodes = Nodes(ctx.n_ranks, gpus_per_node).n_nodes
        self.g = g

    def __call__(self, outputs: list[torch.Tensor], input: torch.Tensor, comm, memory) -> None:
        c = sum(o.numel() for o in outputs)
        if c % 2:   # int4 codes two to a byte: each row padded with one zero to whole bytes
            x = memory.alloc("buffer", (comm.n_ranks, c + 1), input.dtype)
            x[:, :c].copy_(input.view(comm.n_ranks, c))
            total = quantized_mean(x.view(-1), self.local_comm, self.global_comm, self.n_nodes,
                                   group_size(c + 1, self.g), c + 1, memory)
            memory.free(x)
        else:
            total = quantized_mean(input, self.local_comm, self.global_comm, self.n_nodes,
                                   group_size(c, self.g), c, memory)
        a = 0
        for o in outputs:
            o.copy_(total[a:a + o.numel()])
            a += o.numel()

