"""The FSDP2 flavour's collectives and their buffers (zero/fsdp2.py holds the stage): how a group
of units is all-gathered and reduce-scattered, each buffer made when, on which stream and in
which dtype FSDP2's code makes it (torch's ``distributed/fsdp/_fully_shard``, cited by file and
function).

* **All-gather** (``_fsdp_collectives.py::foreach_all_gather``): the shard cast to param_dtype
  into a flat copy-in buffer (``flat_foreach_copy_input``, 1/N of the group), one flat output of
  the whole padded group (``all_gather_comm.allocate``), then ``foreach_all_gather_copy_out``
  copies it into per-parameter unsharded tensors (``alloc_all_gather_outputs``: the group's real
  elements, ``gathered``). In forward the flat output is freed only at the next group's
  ``wait_for_unshard`` (implicit prefetch, ``_fsdp_param_group.py``), in backward right after the
  copy-out. The flat buffers are ``ag_buffer``. How a shard gets into the copy-in is
  :meth:`Collectives._copy_in` (CPUOffloadPolicy's H2D copy first: zero/fsdp2_offload.py).
* **Reduce-scatter** (``_fsdp_collectives.py::foreach_reduce``): autograd's unsharded gradients
  are param_dtype (``grad16``); one fp32 ``reduce_scatter_input`` of the padded group
  (``rs_buffer``) takes their cast, the unsharded gradients are freed (``unsharded_grads.clear()``),
  the output (1/N, fp32) becomes the sharded gradient (:meth:`Collectives._grad_out`). The input
  is kept until the next group's post-backward (``reduce_scatter_max_input_buffers`` = 1,
  ``_fsdp_param_group.py::post_backward``), the last one until the final callback
  (``_fsdp_state.py::_root_post_backward_final_callback``). With HSDP (MiCS's replicas) the
  all-reduced output is held by its group (``_all_reduce_state``) until that callback too.
* **Streams** (``_fsdp_param_group.py::FSDPCommContext.lazy_init`` makes them): the flat
  all-gather buffers are made on the all-gather copy-in stream, the reduce-scatter outputs on the
  reduce-scatter stream, everything else on the default stream; the caching allocator reuses a
  block only on its own stream, so the allocator model replays each on its stream
  (``RankContext.on_stream``, spec/allocator.md).
* **Custom comms** (``FSDPModule.set_custom_all_gather`` / ``set_custom_reduce_scatter``:
  qwZ, qgZ, zero/fsdp2_quant.py): one call per group on its flat buffers, laid out rank major as
  FSDP2 lays them (row r: every unit's r-th chunk; ``foreach_all_gather_copy_out``'s
  ``view(world_size, -1)``, ``foreach_reduce_scatter_copy_in``); without them each unit is
  gathered and reduced on its own, in the same bytes (a group of one unit is the same layout).
* **hpZ**'s post-forward shard (``_fsdp_param.py::to_sharded_post_forward``): a 1/h clone of the
  padded unit in param_dtype (``secondary16``), all-gathered over the h ranks at the unshard that
  frees it, through the group's custom comm if it has one (``FSDPParamGroup.unshard`` hands
  ``foreach_all_gather`` its ``_all_gather_comm`` whichever mesh it gathers over).
"""
from __future__ import annotations

import torch


class Collectives:
    """The flavour's all-gathers and reduce-scatters over groups of units (module doc); the stage
    (zero/fsdp2.py) keeps the state they read and write: ``param32``, ``grad32``, ``_ag_prev``,
    ``_prefetched``, ``_post_forward``, ``_rs_prev``."""

    # where each reduce-scatter's output lives on the device: kept as the sharded gradient
    rs_output = "shard_grad32"
    # FSDP2's set_custom_all_gather / set_custom_reduce_scatter (zero/fsdp2_quant.py: qwZ, qgZ);
    # None: its default collectives, booked unit by unit
    all_gather_comm = None
    reduce_scatter_comm = None

    def _all_gather(self, group: list[int]) -> torch.Tensor:
        """The group's flat all-gather output: the copy-in cast of its shards (1/N), then one
        output of the whole padded group, each unit gathered into its part; a unit resharded
        to 1/h after forward is gathered from that shard over the post-forward mesh."""
        if len(group) == 1 and group[0] in self._post_forward:
            return self._all_gather_post_forward(group[0])
        units = [self.units[j] for j in group]
        copy_in = self._ag_buffer(sum(u.chunk for u in units))
        a = 0
        for j, u in zip(group, units):
            with self.ctx.on_stream("all_gather_copy_in"):
                self._copy_in(j, copy_in[a:a + u.chunk])
            a += u.chunk
        out, a, b = self._ag_buffer(sum(u.padded for u in units)), 0, 0
        if self.all_gather_comm is not None:   # set_custom_all_gather: one call on the group's
            self.all_gather_comm(out, copy_in, self.comm, self.memory)   # flat buffers, rank major
        else:
            for j, u in zip(group, units):
                self.gather_unit(j, out[b:b + u.padded], copy_in[a:a + u.chunk])
                a, b = a + u.chunk, b + u.padded
        self.memory.free(copy_in)
        return out

    def _copy_in(self, j: int, chunk: torch.Tensor) -> None:
        """Unit j's shard into its part of the copy-in, cast to param_dtype
        (``_get_param_all_gather_inputs``' foreach copy)."""
        chunk.copy_(self.param32[j])                                         # fp32 -> param_dtype

    def _all_gather_post_forward(self, i: int) -> torch.Tensor:
        """foreach_all_gather from the post-forward shard: its copy-in (1/h, already
        param_dtype), the padded unit's output, over the h ranks."""
        sec = self._post_forward[i]
        copy_in = self._ag_buffer(sec.numel())
        out = self._ag_buffer(self.units[i].padded)
        copy_in.copy_(sec)
        if self.all_gather_comm is not None:   # the group's comm, on the post-forward mesh too
            self.all_gather_comm(out, copy_in, self.hpz_comm, self.memory)
        else:
            self.hpz_comm.all_gather(out, copy_in)
        self.memory.free(copy_in)
        return out

    def _ag_buffer(self, n: int) -> torch.Tensor:
        """One of foreach_all_gather's flat buffers, made on the all-gather copy-in stream (its
        `with device_handle.stream(all_gather_copy_in_stream)`): the allocator reuses its block
        only for that stream's requests (spec/allocator.md)."""
        with self.ctx.on_stream("all_gather_copy_in"):
            return self.memory.alloc("ag_buffer", (n,), self.dtype, zero=False)

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
            self._copy_out(full, flat, b, u, len(group) > 1)                 # copy-out
            fulls.append(full)
            b += u.chunk if self.all_gather_comm is not None else u.padded
            if j in self._post_forward:   # to_unsharded frees the post-forward shard
                self.memory.free(self._post_forward.pop(j))
        if self.ctx.phase_name == "forward":
            self._ag_prev = flat
        else:
            self.memory.free(flat)
        return fulls

    def _copy_out(self, full: torch.Tensor, flat: torch.Tensor, b: int, u, rank_major: bool):
        """Unit ``u``'s elements out of the flat output: from its ``u.padded`` at ``b``, or, from
        a custom comm's rank-major output (``foreach_all_gather_copy_out``: ``view(world_size,
        -1)``), from its chunk at column ``b`` of each rank's row (one unit: the same layout)."""
        if not (rank_major and self.all_gather_comm is not None):
            full.copy_(flat[b:b + u.numel])
            return
        row = flat.view(self.ctx.n_ranks, -1)
        for r in range(self.ctx.n_ranks):
            lo = r * u.chunk
            n = max(0, min(u.chunk, u.numel - lo))
            full[lo:lo + n].copy_(row[r, b:b + n])

    def _free_ag_prev(self) -> None:
        self.memory.free(self._ag_prev)
        self._ag_prev = None

    def _reshard(self, full16: torch.Tensor) -> None:
        self.memory.free(full16)
        full16.untyped_storage().resize_(0)      # _fsdp_param.py: free_storage

    def _reduce(self, group: list[int], slots: list[torch.Tensor]) -> None:
        """foreach_reduce for one group: fp32 input of the padded group, the unsharded gradients
        freed, each unit's 1/N fp32 output made the sharded gradient (:meth:`_grad_out`)."""
        if self._rs_prev is not None:    # at most one input in flight
            self.memory.free(self._rs_prev)
            self._rs_prev = None
        units = [self.units[j] for j in group]
        rs_in = self.memory.alloc("rs_buffer", (sum(u.padded for u in units),), torch.float32,
                                  zero=False)
        custom = self.reduce_scatter_comm is not None
        parts = self._copy_in_grads(rs_in, units, slots, custom)
        for s in slots:
            self.memory.free(s)
        outs = []
        for u in units:
            # made on the reduce-scatter stream (foreach_reduce's `with
            # device_handle.stream(reduce_scatter_stream)`); the input above, on the default one
            with self.ctx.on_stream("reduce_scatter"):
                outs.append(self.memory.alloc(self.rs_output, (u.chunk,), rs_in.dtype,
                                              zero=False))
        if custom:   # set_custom_reduce_scatter: one call on the group's rank-major input
            self.reduce_scatter_comm(outs, rs_in, self.comm, self.memory)
        done = []
        for j, out, part in zip(group, outs, parts):
            if not custom:
                self.reduce_unit(j, out, part)
            self.shard_ready(j, out, "mean")
            if not self._grad_out(j, out):
                done.append(out)
        if getattr(self, "replicas", None) is not None and self.replicas.n_ranks > 1:
            # HSDP: FSDPParamGroup._all_reduce_state keeps the all-reduced output until the
            # final callback's finalize_backward (_fsdp_param_group.py, post_backward)
            self._all_reduced.extend(done)
        else:
            for out in done:   # the group's reduce output goes once every view is used
                self.memory.free(out)
        self._rs_prev = rs_in

    def _copy_in_grads(self, rs_in, units, slots, rank_major: bool) -> list:
        """The unsharded gradients cast to fp32 into the reduce-scatter input, zero padded: each
        unit's padded part in turn, or rank major for a custom comm
        (``foreach_reduce_scatter_copy_in``: row r holds each unit's r-th chunk)."""
        if not rank_major:
            parts, at = [], 0
            for u, s in zip(units, slots):
                part = rs_in[at:at + u.padded]
                part[:u.numel].copy_(s[:u.numel])                            # param_dtype -> fp32
                part[u.numel:].zero_()
                parts.append(part)
                at += u.padded
            return parts
        row, at = rs_in.view(self.ctx.n_ranks, -1), 0
        for u, s in zip(units, slots):
            for r in range(self.ctx.n_ranks):
                lo = r * u.chunk
                n = max(0, min(u.chunk, u.numel - lo))
                row[r, at:at + n].copy_(s[lo:lo + n])                       # param_dtype -> fp32
                row[r, at + n:at + u.chunk].zero_()
            at += u.chunk
        return [None] * len(units)

    def _grad_out(self, j: int, out: torch.Tensor) -> bool:
        """Unit j's reduce-scatter output made its fp32 sharded gradient (True: ``out`` is kept
        as it), or a later micro-step's added into it (``foreach_reduce``:
        ``sharded_param.grad._local_tensor += new_sharded_grad``)."""
        if self.grad32[j] is None:
            self.grad32[j] = out
            return True
        self.grad32[j].add_(out)
        return False
