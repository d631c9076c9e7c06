"""Stage 3 as FSDP2 and torchtitan run it: ``fully_shard`` with ``MixedPrecisionPolicy(param_dtype=
bf16, reduce_dtype=fp32)`` on every transformer block and on the root (spec/fsdp2.md).

What differs from the paper's P_os+g+p (zero/stage3_params.py), each from FSDP2's code (torch's
``distributed/fsdp/_fully_shard``, cited by file and function) or torchtitan's
(``torchtitan/parallelisms/parallelize_llama.py::apply_fsdp`` at 9dec370):

* **States.** The sharded parameters are fp32 and are what AdamW updates: no master apart
  (``_fsdp_api.py::MixedPrecisionPolicy``: "FSDP does not require any extra memory to keep a
  high-precision copy"). Per rank: fp32 parameters 4Ψ/N (``param32``), exp_avg and exp_avg_sq
  8Ψ/N, and fp32 sharded gradients 4Ψ/N (``shard_grad32``), which exist from the reduce-scatter
  that writes them to the next step's ``zero_grad`` (set to None: torchtitan calls it at the start
  of each step). 16Ψ/N once a backward has run, 12Ψ/N before.
* **All-gather** (``_fsdp_collectives.py::foreach_all_gather``): the shard cast to param_dtype
  into a flat copy-in buffer (``flat_foreach_copy_input``, 1/N of the group), one flat output of
  the whole padded group (``all_gather_comm.allocate``), then ``foreach_all_gather_copy_out``
  copies it into per-parameter unsharded tensors (``alloc_all_gather_outputs``: the group's real
  elements, ``gathered``). In forward the flat output is freed only at the next group's
  ``wait_for_unshard`` (implicit prefetch, ``_fsdp_param_group.py``), in backward right after the
  copy-out; backward prefetches the previous group's all-gather (``_backward_prefetch``).
  The flat buffers are ``ag_buffer``.
* **Reduce-scatter** (``_fsdp_collectives.py::foreach_reduce``): autograd's unsharded gradients
  are param_dtype (``grad16``); one fp32 ``reduce_scatter_input`` of the padded group
  (``rs_buffer``) takes their cast, the unsharded gradients are freed (``unsharded_grads.clear()``),
  the output (1/N, fp32) becomes the sharded gradient. The input is kept until the next group's
  post-backward (``reduce_scatter_max_input_buffers`` = 1, ``_fsdp_param_group.py::post_backward``),
  the last one until the final callback (``_fsdp_state.py::_root_post_backward_final_callback``).
* **Streams** (``_fsdp_param_group.py::FSDPCommContext.lazy_init`` makes them): the flat
  all-gather buffers are made on the all-gather copy-in stream, the sharded gradients on the
  reduce-scatter stream, everything else on the default stream; the caching allocator reuses a
  block only on its own stream, so the allocator model replays each on its stream
  (``RankContext.on_stream``, spec/allocator.md).
* **What stays gathered.** The root group (embeddings, final norm, LM head) is all-gathered at
  the root's pre-forward and kept until its post-backward at the end of backward: FSDP2 does not
  reshard the root after forward (``_fsdp_state.py::_lazy_init``: ``post_forward_mesh_info =
  None``; unconditionally in the benchmark's torch, 1963fc8, for the default only in torch 2.13,
  while torchtitan passes True), and its gradients are reduce-scattered together, once the last of them (the
  embedding's) is complete. torchtitan keeps the last block gathered from forward to backward
  (``reshard_after_forward = int(layer_id) < len(model.layers) - 1``).
* **hpZ** (``hpz`` = h): ``reshard_after_forward = h`` on the blocks torchtitan reshards: a 1/h
  clone of the padded unit in param_dtype (``secondary16``) from post-forward to the backward
  unshard that gathers from it over h ranks (``_fsdp_param.py::to_sharded_post_forward``).
* **Gradient accumulation**: every micro-step reduce-scatters in fp32 and adds into the fp32
  sharded gradient (``foreach_reduce``); torchtitan divides each loss by G
  (``rescale_accumulated_loss``). Rounded sums, not zero/exact.py's (spec/fsdp2.md).

Compute runs in param_dtype on every device (FSDP2 computes in it on a CPU too), so a CPU run is
bit-comparable with ``fully_shard`` on gloo (tests/engine/test_fsdp2_flavour.py).
"""
from __future__ import annotations

import torch

from ..model import gpt
from .stage3_params import Parameters


def groups(cfg, tiles: int = 1) -> tuple[frozenset[int], frozenset[int]]:
    """(the root group's units, the last block's units) of model ``cfg`` in fetch order
    (model/gpt.py ``fetch_order``: embeddings, blocks with their tiles, final norm, LM head)."""
    order = gpt.fetch_order(cfg, tiles)
    root = frozenset((order[0], order[-2], order[-1]))
    per_block = 1 + tiles if tiles > 1 else 1
    blocks = order[1:-2]
    return root, frozenset(blocks[-per_block:])


class FSDP2Parameters(Parameters):
    """P_os+g+p with FSDP2's states, buffers and resharding as torchtitan sets them (module)."""

    master_apart = False       # the fp32 sharded parameters are what Adam updates
    computes_on_gathered = True   # autograd uses the unsharded parameters themselves
    # HSDP's replica all-reduce runs inside each reduce, every micro-step (foreach_reduce's
    # all_reduce_group): MiCS's hop is shard_ready's, not a second one at the boundary
    reduces_each_micro_step = True

    def __init__(self, ctx, units, init, adam, precision=None, buckets=None, grad_buffer=None, *,
                 root: frozenset = frozenset(), keep: frozenset = frozenset(), hpz: int = 1,
                 hpz_group=None):
        if buckets is not None or grad_buffer is not None:   # refused by training/combine.py
            raise ValueError("the FSDP2 flavour reduce-scatters each group's gradients through "
                             "its own fp32 buffer: C_B's buckets and M_D's gradient slot do not "
                             "apply (spec/combine.md)")
        self.root, self.keep = root, keep
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

    def _all_gather(self, group: list[int]) -> torch.Tensor:
        """The group's flat all-gather output: the copy-in cast of its shards (1/N), then one
        output of the whole padded group, each unit gathered into its part; a unit resharded
        to 1/h after forward is gathered from that shard over the post-forward mesh."""
        if len(group) == 1 and group[0] in self._post_forward:
            return self._all_gather_post_forward(group[0])
        units = [self.units[j] for j in group]
        copy_in, out = self._ag_buffers(sum(u.chunk for u in units), sum(u.padded for u in units))
        a = b = 0
        for j, u in zip(group, units):
            chunk = copy_in[a:a + u.chunk]
            chunk.copy_(self.param32[j])                                     # fp32 -> param_dtype
            self.gather_unit(j, out[b:b + u.padded], chunk)
            a, b = a + u.chunk, b + u.padded
        self.memory.free(copy_in)
        return out

    def _all_gather_post_forward(self, i: int) -> torch.Tensor:
        """foreach_all_gather from the post-forward shard: its copy-in (1/h, already
        param_dtype), the padded unit's output, over the h ranks."""
        sec = self._post_forward[i]
        copy_in, out = self._ag_buffers(sec.numel(), self.units[i].padded)
        self.hpz_comm.all_gather(out, copy_in.copy_(sec))
        self.memory.free(copy_in)
        return out

    def _ag_buffers(self, n_in: int, n_out: int) -> tuple[torch.Tensor, torch.Tensor]:
        """foreach_all_gather's copy-in and output, both made on the all-gather copy-in stream
        (its `with device_handle.stream(all_gather_copy_in_stream)`): the allocator reuses their
        blocks only for that stream's requests (spec/allocator.md)."""
        with self.ctx.on_stream("all_gather_copy_in"):
            return (self.memory.alloc("ag_buffer", (n_in,), self.dtype, zero=False),
                    self.memory.alloc("ag_buffer", (n_out,), self.dtype, zero=False))

    def _to_sharded_post_forward(self, i: int, full16: torch.Tensor) -> None:
        """to_sharded_post_forward: a clone of this rank's 1/h of the padded unit (its padding
        zero, as the sharded parameters' is), kept until backward's unshard."""
        u = self.units[i]
        c = u.padded // self.h
        lo = self.hpz_comm.rank * c
        n = max(0, min(c, u.numel - lo))
        sec = self.memory.alloc("secondary16", (c,), self.dtype, zero=False)   # 2·padded/h B
        sec[:n].copy_(full16[lo:lo + n])
        sec[n:].zero_()
        self._post_forward[i] = sec

    def _unshard(self, group: list[int]) -> list[torch.Tensor]:
        """unshard + wait_for_unshard: each unit's unsharded tensor, copied out of the flat
        output (prefetched, or gathered now)."""
        flat = self._prefetched.pop(group[0], None) if len(group) == 1 else None
        if flat is None:
            flat = self._all_gather(group)
        if self._ag_prev is not None:   # wait_for_unshard frees the previous group's output
            self._free_ag_prev()
        fulls, b = [], 0
        for j in group:
            u = self.units[j]
            full = self.memory.alloc("gathered", (u.numel,), self.dtype, zero=False)
            full.copy_(flat[b:b + u.numel])                                  # copy-out
            fulls.append(full)
            b += u.padded
            if j in self._post_forward:   # to_unsharded frees the post-forward shard
                self.memory.free(self._post_forward.pop(j))
        if self.ctx.phase_name == "forward":
            self._ag_prev = flat
        else:
            self.memory.free(flat)
        return fulls

    def _free_ag_prev(self) -> None:
        self.memory.free(self._ag_prev)
        self._ag_prev = None

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

    def _reshard(self, full16: torch.Tensor) -> None:
        self.memory.free(full16)
        full16.untyped_storage().resize_(0)      # _fsdp_param.py: free_storage

    # -- gradients out ---------------------------------------------------------------------------
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

    def _reduce(self, group: list[int], slots: list[torch.Tensor]) -> None:
        """foreach_reduce for one group: fp32 input of the padded group, the unsharded gradients
        freed, each unit's 1/N fp32 output kept as its sharded gradient."""
        if self._rs_prev is not None:    # at most one input in flight
            self.memory.free(self._rs_prev)
            self._rs_prev = None
        units = [self.units[j] for j in group]
        rs_in = self.memory.alloc("rs_buffer", (sum(u.padded for u in units),), torch.float32,
                                  zero=False)
        parts, at = [], 0
        for u, s in zip(units, slots):
            part = rs_in[at:at + u.padded]
            part[:u.numel].copy_(s[:u.numel])                                # param_dtype -> fp32
            part[u.numel:].zero_()
            parts.append(part)
            at += u.padded
        for s in slots:
            self.memory.free(s)
        added = []
        for j, u, part in zip(group, units, parts):
            # made on the reduce-scatter stream (foreach_reduce's `with
            # device_handle.stream(reduce_scatter_stream)`); the input above, on the default one
            with self.ctx.on_stream("reduce_scatter"):
                out = self.memory.alloc("shard_grad32", (u.chunk,), rs_in.dtype, zero=False)
            self.reduce_unit(j, out, part)
            self.shard_ready(j, out, "mean")
            if self.grad32[j] is None:
                self.grad32[j] = out
            else:   # a later micro-step: added into the fp32 sharded gradient
                self.grad32[j].add_(out)
                added.append(out)
        for out in added:   # the group's reduce output goes once every view is added
            self.memory.free(out)
        self._rs_prev = rs_in

    def end_backward(self) -> None:
        """The final callback: the last reduce-scatter input goes; anything prefetched or held
        that backward did not use is let go."""
        if self._rs_prev is not None:
            self.memory.free(self._rs_prev)
            self._rs_prev = None
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
