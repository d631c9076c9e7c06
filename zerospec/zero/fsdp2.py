"""Stage 3 as FSDP2 and torchtitan run it: ``fully_shard`` with ``MixedPrecisionPolicy(param_dtype=
bf16, reduce_dtype=fp32)`` on every transformer block and on the root (spec/fsdp2.md); its
collectives and their buffers are zero/fsdp2_collectives.py's, its ``CPUOffloadPolicy``
zero/fsdp2_offload.py's.

What differs from the paper's P_os+g+p (zero/stage3_params.py), each from FSDP2's code (torch's
``distributed/fsdp/_fully_shard``, cited by file and function) or torchtitan's
(``torchtitan/parallelisms/parallelize_llama.py::apply_fsdp`` at 9dec370):

* **States.** The sharded parameters are fp32 and are what AdamW updates: no master apart
  (``_fsdp_api.py::MixedPrecisionPolicy``: "FSDP does not require any extra memory to keep a
  high-precision copy"). Per rank: fp32 parameters 4Ψ/N (``param32``), exp_avg and exp_avg_sq
  8Ψ/N, and fp32 sharded gradients 4Ψ/N (``shard_grad32``), which exist from the reduce-scatter
  that writes them to the next step's ``zero_grad`` (set to None: torchtitan calls it at the start
  of each step). 16Ψ/N once a backward has run, 12Ψ/N before.
* **What stays gathered.** The root group (embeddings, final norm, LM head) is all-gathered at
  the root's pre-forward and kept until its post-backward at the end of backward: FSDP2 does not
  reshard the root after forward (``_fsdp_state.py::_lazy_init``: ``post_forward_mesh_info =
  None``; unconditionally in the benchmark's torch, 1963fc8, for the default only in torch 2.13,
  while torchtitan passes True), and its gradients are reduce-scattered together, once the last
  of them (the embedding's) is complete. torchtitan keeps the last block gathered from forward
  to backward (``reshard_after_forward = int(layer_id) < len(model.layers) - 1``). Backward
  prefetches the previous group's all-gather (``_fsdp_param_group.py::_backward_prefetch``).
* **hpZ** (``hpz`` = h): ``reshard_after_forward = h`` on the blocks torchtitan reshards: a 1/h
  clone of the padded unit in param_dtype (``secondary16``) from post-forward to the backward
  unshard that gathers from it over h ranks (``_fsdp_param.py::to_sharded_post_forward``).
* **Gradient accumulation**: every micro-step reduce-scatters in fp32 and adds into the fp32
  sharded gradient (``foreach_reduce``); torchtitan divides each loss by G
  (``rescale_accumulated_loss``). Rounded sums, not zero/exact.py's (spec/fsdp2.md).
* **qwZ, qgZ**: FSDP2's ``set_custom_all_gather`` / ``set_custom_reduce_scatter``, quantizing
  each group's flat buffer (zero/fsdp2_quant.py).

Compute runs in param_dtype on every device (FSDP2 computes in it on a CPU too), so a CPU run is
bit-comparable with ``fully_shard`` on gloo (tests/engine/test_fsdp2_flavour.py).
"""
from __future__ import annotations

import torch

from ..comm.quantize import group_size
from ..model import gpt
from .fsdp2_collectives import Collectives
from .fsdp2_quant import QuantizedAllGather, QuantizedReduceScatter
from .stage3_params import Parameters


def groups(cfg, tiles: int = 1) -> tuple[frozenset[int], frozenset[int]]:
    """(the root group's units, the last block's units) of model ``cfg`` in fetch order
    (model/gpt.py ``fetch_order``: embeddings, blocks with their tiles, final norm, LM head)."""
    order = gpt.fetch_order(cfg, tiles)
    root = frozenset((order[0], order[-2], order[-1]))
    per_block = 1 + tiles if tiles > 1 else 1
    blocks = order[1:-2]
    return root, frozenset(blocks[-per_block:])


def quant_rows(cfg) -> list[int]:
    """The rows qwZ's and qgZ's custom comms quantize (zero/fsdp2_quant.py): each group's flat
    copy-in, in elements: the root group's units together, every other unit alone, and with hpZ
    each resharded block's post-forward shard."""
    units = cfg.units()
    root, keep = groups(cfg.model, cfg.tiles)
    h = cfg.hpz if 1 < cfg.hpz < cfg.n_d else 1   # hpZ: post-forward shards, gathered over h
    return [sum(units[i].chunk for i in sorted(root))] + [
        u.chunk for i, u in enumerate(units) if i not in root] + [
        u.padded // h for i, u in enumerate(units) if h > 1 and i not in root | keep]


def check(cfg) -> None:
    """qwZ's and qgZ's group size under the flavour: a group lies inside each row its comms
    quantize (ValueError naming the value, comm/quantize.py)."""
    if cfg.flavour == "fsdp2" and (cfg.qwz or cfg.qgz):
        for c in quant_rows(cfg):
            group_size(c, cfg.quant_group_size, f"flat copy-in of an FSDP2 group")


class FSDP2Parameters(Collectives, Parameters):
    """P_os+g+p with FSDP2's states, buffers and resharding as torchtitan sets them (module)."""

    master_apart = False       # the fp32 sharded parameters are what Adam updates
    computes_on_gathered = True   # autograd uses the unsharded parameters themselves
    # HSDP's replica all-reduce runs inside each reduce, every micro-step (foreach_reduce's
    # all_reduce_group): MiCS's hop is shard_ready's, not a second one at the boundary
    reduces_each_micro_step = True

    def __init__(self, ctx, units, init, adam, precision=None, buckets=None, grad_buffer=None, *,
                 root: frozenset = frozenset(), keep: frozenset = frozenset(), hpz: int = 1,
                 hpz_group=None, qwz: bool = False, qgz: bool = False,
                 quant_group_size: int | None = None, gpus_per_node: int | None = None,
                 qgz_groups=None, prefetch: bool = False):
        if buckets is not None or grad_buffer is not None:   # refused by training/combine.py
            raise ValueError("the FSDP2 flavour reduce-scatters each group's gradients through "
                             "its own fp32 buffer: C_B's buckets and M_D's gradient slot do not "
                             "apply (spec/combine.md)")
        self.root, self.keep = root, keep
        self.prefetch = prefetch   # explicit forward prefetch, one group ahead (acquire)
        # qwZ, qgZ: FSDP2's custom comms on each group's flat buffers (zero/fsdp2_quant.py)
        if qwz:
            self.all_gather_comm = QuantizedAllGather(quant_group_size)
        if qgz:
            self.reduce_scatter_comm = QuantizedReduceScatter(ctx, qgz_groups, quant_group_size,
                                                              gpus_per_node)
        # reshard_after_forward = h; h = N is FSDP2's True, its own mesh
        # (_fsdp_init.py::_get_post_forward_mesh_info)
        self.h = hpz if 1 < hpz < ctx.n_ranks else 1
        if self.h > 1:   # the post-forward mesh: h consecutive ranks, the run's mesh's (comm/mesh.py)
            self.hpz_comm = ctx.comm.subgroup(hpz_group)
        self._post_forward: dict[int, torch.Tensor] = {}   # 1/h shards, forward to unshard
        self._held: dict[int, torch.Tensor] = {}      # the root's unsharded units
        self._kept: dict[int, torch.Tensor] = {}      # the last block's, forward to post-backward
        self._ag_prev: torch.Tensor | None = None     # forward: the last group's flat AG output
        self._prefetched: dict[int, torch.Tensor] = {}   # backward: flat AG outputs ahead of use
        self._rs_prev: torch.Tensor | None = None     # the reduce-scatter input kept in flight
        self._all_reduced: list[torch.Tensor] = []    # HSDP: outputs held to the final callback
        self._root_grads: dict[int, torch.Tensor] = {}
        self._in_backward: dict[int, list[torch.Tensor]] = {}   # unsharded until post-backward
        self._lowest: int | None = None   # backward: the lowest unit unsharded so far
        super().__init__(ctx, units, init, adam, precision, buckets=buckets, grad_buffer=grad_buffer)

    # -- states ----------------------------------------------------------------------------------
    def _allocate_params(self, init) -> None:
        self.param32 = []
        for u, w in zip(self.units, init):
            p = self._alloc("param32", u.chunk, torch.float32)             # 4·padded/N B
            p.copy_(w[u.shard(self.ctx.rank)])
            self.param32.append(p)

    def _param_chunk(self, i: int) -> torch.Tensor:
        return self.param32[i]

    @property
    def param16(self) -> list[torch.Tensor]:
        """The working parameters a checkpoint saves and restores (its ``param16`` kind, as under
        the fp32 policy): here the fp32 shards themselves."""
        return self.param32

    def _allocate_gradients(self) -> None:
        self.grad32: list[torch.Tensor | None] = [None] * len(self.units)  # by each reduce-scatter

    def _allocate_optimizer(self, init) -> None:
        self.master = self.param32
        self.exp_avg = [self._alloc("exp_avg", p.numel(), torch.float32) for p in self.param32]
        self.exp_avg_sq = [self._alloc("exp_avg_sq", p.numel(), torch.float32)
                           for p in self.param32]

    def zero_grad(self) -> None:
        """torchtitan's ``optimizers.zero_grad()`` at the start of a step: set to None, so the
        sharded gradients' storage goes."""
        for i, g in enumerate(self.grad32):
            if g is not None:
                self.memory.free(g)
                self.grad32[i] = None

    def grad_for_step(self, i: int) -> torch.Tensor:
        return self.grad32[i]

    # -- parameters in ---------------------------------------------------------------------------
    def keep_for_backward(self, i: int) -> bool:
        return i in self.keep

    def acquire(self, i: int) -> torch.Tensor:
        if i in self._held:
            if self.ctx.phase_name == "forward" and self._ag_prev is not None:
                # the blocks are done: the last one's flat output goes (the root's post-forward
                # frees it, _fsdp_state.py::_post_forward)
                self._free_ag_prev()
            return self._held[i]
        if i in self.root:   # one unshard of the whole root group, kept to its post-backward
            group = sorted(self.root)
            self._held.update(zip(group, self._unshard(group)))
            return self._held[i]
        if i in self._kept:   # not resharded after forward (a checkpoint's recompute reads it)
            full = self._kept[i]
        else:
            full, = self._unshard([i])
            if i in self.keep and self.ctx.phase_name == "forward":
                self._kept[i] = full
            if self.prefetch and self.ctx.phase_name == "forward":
                self._forward_prefetch(i + 1)
        if self.ctx.phase_name == "backward":
            # _backward_prefetch: the group before, one ahead; backward runs the groups in
            # reverse, so only a unit below every one unsharded so far is still to come (a
            # checkpointed segment's recompute unshards its blocks in forward order)
            j = i - 1
            if (self._lowest is None or j < self._lowest) and j >= 0 and j not in self.root \
                    and j not in self.keep and j not in self._prefetched:
                self._prefetched[j] = self._all_gather([j])
            self._lowest = i if self._lowest is None else min(self._lowest, i)
        return full

    def _forward_prefetch(self, j: int) -> None:
        """``set_modules_to_forward_prefetch([next block])`` on every block: after this group's
        copy-out its pre-forward issues the next block's unshard (``_fsdp_state.py::
        _pre_forward``, ``FSDPParamGroup._prefetch_unshard``), whose flat output is held beside
        this group's until that block's copy-out; under CPUOffloadPolicy the shard's copy up is
        inside it (``FSDPParam.all_gather_inputs``). The root prefetches nothing: it is
        unsharded before the first block and after the last."""
        if j < len(self.units) and j not in self.root and j not in self._prefetched:
            self._prefetched[j] = self._all_gather([j])

    def release(self, i: int, full16: torch.Tensor) -> None:
        """A use is over. Forward: post_forward reshards (``free_storage``: the storage resized
        to 0, which autograd's view of it no longer holds). Backward: the unit stays unsharded
        until its post-backward, once its gradient is complete (:meth:`grad_ready`)."""
        if i in self._held or i in self._kept:
            return
        if self.ctx.phase_name == "backward":
            self._in_backward.setdefault(i, []).append(full16)
        else:
            if self.h > 1:   # reshard_after_forward = h
                self._to_sharded_post_forward(i, full16)
            self._reshard(full16)

    def grad_slot(self, i: int) -> torch.Tensor:
        # autograd's unsharded gradients: the parameters' own sizes, no padding
        return self.memory.alloc("grad16", (self.units[i].numel,), self.dtype, zero=False)

    def grad_ready(self, i: int, slot: torch.Tensor) -> None:
        if i not in self.root:
            unsharded = self._in_backward.pop(i, [])
            if i in self._kept:
                unsharded.append(self._kept.pop(i))
            for full in unsharded:                       # post_backward reshards first
                self._reshard(full)
            self._reduce([i], [slot])
            return
        self._root_grads[i] = slot
        if len(self._root_grads) == len(self.root):   # the root's post-backward: all at once
            for j in sorted(self.root):
                self._reshard(self._held.pop(j))         # reshard before the reduce
            group = sorted(self._root_grads)
            self._reduce(group, [self._root_grads.pop(j) for j in group])

    def end_backward(self) -> None:
        """The final callback: the last reduce-scatter input goes; anything prefetched or held
        that backward did not use is let go."""
        if self._rs_prev is not None:
            self.memory.free(self._rs_prev)
            self._rs_prev = None
        for out in self._all_reduced:   # finalize_backward drops _all_reduce_state
            self.memory.free(out)
        self._all_reduced.clear()
        for flat in self._prefetched.values():
            self.memory.free(flat)
        self._prefetched.clear()
        if self._ag_prev is not None:
            self._free_ag_prev()
        for full in [*self._held.values(), *self._kept.values(),
                     *(f for fs in self._in_backward.values() for f in fs)]:
            self._reshard(full)
        for sec in self._post_forward.values():
            self.memory.free(sec)
        self._post_forward.clear()
        self._held.clear()
        self._kept.clear()
        self._in_backward.clear()
        self._lowest = None
        super().end_backward()
