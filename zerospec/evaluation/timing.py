"""A step's time on a :class:`~zerospec.paper.hardware.Machine`, from what a meta step measured.

Nothing here is fitted to the paper: the inputs are one rank's measured collectives (the ledger's
records: op, group, ring size n, bytes sent under the ring model) and its measured ops
(``count_flops=True``: forward, and backward with the recompute; each op's FLOPs and bytes), and the
outputs follow from the machine's spec-sheet constants by the formulas below.

**Where a group sits.** Ranks are numbered ``rank = dp_index · N_m + mp_index`` (comm/groups.py)
and fill nodes of g GPUs in order. A group of n ranks with stride s (MP: s = 1; DP: s = N_m;
"world": s = 1) spans n·s consecutive GPUs. If n·s ≤ g it lies inside one node and every ring
link is the switch's (NVSwitch: ``intra``, per GPU per direction). Otherwise the ring leaves the
node; the node's InfiniBand (``inter``, per node per direction) is shared by the rings of this
kind that cross it at the same time: all groups of a kind run together, and k = min(s, g) of
them cross each node (MP over nodes: 1; DP with N_m < g: N_m, one per MP index; DP with
N_m ≥ g: g, one per GPU; MiCS's partition group of p: s = 1, its replication group: s = p). Each ring crosses a node boundary once per node, and every link of a
ring carries the same bytes, so the slowest link sets the pace:

    bw = intra                      if n·s ≤ g
    bw = min(intra, inter / k)      otherwise, k = min(s, g)          (inter="node", the default)
    bw = min(intra, inter / k, inter / nics)                         (inter="link")

Two readings of "the node's InfiniBand", both from the spec sheet and neither fitted: ``"node"``
spreads all the node's NICs over the rings crossing it (an upper bound: a lone ring gets
8 × 12.5 GB/s); ``"link"`` paces a ring that leaves the node by one NIC, 100 Gbps = 12.5 GB/s
per direction — the paper's own account of the Megatron baseline's slowdown (C42: "300 GB/s
per link (NVSwitch) to 12.5 GB/s per link (InfiniBand EDR)").

**Per collective** (α–β over the ring; B = the rank's bytes sent, as the ledger books them):

    all_reduce       t = α0 + 2(n−1)·α + B / bw      B = 2(n−1)/n · S · bytes per element
    reduce_scatter   t = α0 +  (n−1)·α + B / bw      B =  (n−1)/n · S · …
    all_gather       t = α0 +  (n−1)·α + B / bw      B =  (n−1)/n · S · …
    broadcast        t = α0 +  (n−1)·α + B / bw      B = S (pipelined chain)
    to_host / from_host   t = bytes / host link      (the rank's own PCIe link, P_a+cpu)

with α0 the launch latency and α the per-step latency inside a node or across nodes (NCCL's own
ring model, paper/hardware.py). A collective over one rank costs nothing.

**Compute** is a per-op roofline over the ops the step ran (forward, and backward with the
recompute), each observed with its FLOPs and bytes (:mod:`zerospec.runtime.opcount`: FLOPs from
torch's ``flop_registry``, so they sum to FlopCounterMode's total; bytes read and written per op,
views free, no fusion). Per phase, with ``count`` the calls of each distinct op:

    t_phase = Σ_ops count · max(flops / (peak · gemm_efficiency), bytes / hbm)
    memory-bound seconds = that sum over the ops whose second term is the larger

Matrix products are mostly bound by the first term; elementwise work, layer norms, softmax,
casts and copies (0 FLOPs in torch's table) by the second. The second term holds two bounds
that pull opposite ways: ``hbm`` is the spec sheet's peak (no achieved-bandwidth constant is
used; a real kernel gets less, so a memory-bound op is timed optimistically), and its bytes are
unfused traffic, an upper bound on what a fused kernel would move. Kernel launches and the gaps
between them cost nothing. The optimizer step stays a fused, memory-bound kernel:
28 bytes of HBM traffic per owned parameter (read fp16 gradient 2, read and write fp32 master,
m, v 24, write fp16 parameter 2) at ``hbm``; it is all memory-bound.

**Overlap.** ``"none"``: every collective waits for compute and compute for it. ``"backward"``:
the DP (and world) collectives issued during backward run beside backward's compute, as ZeRO's
implementation overlaps gradient reduction with backward (C40); the backward phase takes the
longer of the two. MP all-reduces (Megatron's) and host copies stay on the critical path: the
next GEMM needs their result. Both the overlapped and the exposed communication are reported.
"""
from __future__ import annotations

import dataclasses
from collections import defaultdict

from ..paper.hardware import Machine
from ..runtime.opcount import Op

OVERLAP = ("none", "backward")
INTER = ("node", "link")
OPTIM_BYTES_PER_PARAM = 2 + 24 + 2          # fp16 grad in, fp32 master/m/v in and out, fp16 param out
RING_STEPS = {"all_reduce": lambda n: 2 * (n - 1), "reduce_scatter": lambda n: n - 1,
              "all_gather": lambda n: n - 1, "broadcast": lambda n: n - 1, "barrier": lambda n: 0}


def group_bandwidth(m: Machine, n: int, stride: int, inter: str = "node") -> tuple[float, bool]:
    """(bytes/s per direction a ring of ``n`` ranks ``stride`` apart runs at, whether it leaves
    the node); ``inter``: "node" or "link", see the module doc."""
    if inter not in INTER:
        raise ValueError(f"inter must be one of {INTER}, got {inter!r}")
    g = m.gpus_per_node
    if n * stride <= g:
        return float(m.intra_bytes_per_s), False
    k = min(stride, g)
    per_ring = m.inter_bytes_per_s / k
    if inter == "link":                        # one NIC at most, however few rings share the node
        per_ring = min(per_ring, float(m.nic_bytes_per_s))
    return min(float(m.intra_bytes_per_s), per_ring), True


def collective_seconds(m: Machine, op: str, n: int, stride: int, bytes_sent: int,
                       bytes_recv: int = 0, inter: str = "node") -> float:
    """One collective's time on ``m``: α–β over its ring (module doc)."""
    if op in ("to_host", "from_host"):
        return (bytes_sent + bytes_recv) / m.host_bytes_per_s
    if op not in RING_STEPS:
        raise ValueError(f"unknown collective {op!r}; accepted: {', '.join(RING_STEPS)}, "
                         f"to_host, from_host")
    if n <= 1:
        return 0.0
    bw, crosses = group_bandwidth(m, n, stride, inter)
    alpha = m.alpha_inter_s if crosses else m.alpha_intra_s
    return m.alpha_base_s + RING_STEPS[op](n) * alpha + bytes_sent / bw


def op_seconds(m: Machine, op: Op) -> tuple[float, bool]:
    """One call of ``op`` on ``m``: (seconds, whether its bytes rather than its FLOPs set them),
    the roofline of the module doc."""
    gemm = op.flops / (m.peak_flops * float(m.gemm_efficiency))
    memory = op.bytes / m.hbm_bytes_per_s
    return max(gemm, memory), memory > gemm


def ops_seconds(m: Machine, ops) -> tuple[float, float]:
    """A Counter of ops (one phase's) on ``m``: (seconds, the memory-bound ops' seconds)."""
    total = bound = 0.0
    for op, n in ops.items():
        t, memory = op_seconds(m, op)
        total += n * t
        bound += n * t if memory else 0.0
    return total, bound


@dataclasses.dataclass(frozen=True)
class StepTime:
    """One step of one GPU on a machine (seconds, FLOPs per GPU)."""

    compute_s: dict[str, float]       # per phase: forward, backward (with recompute), step
    memory_bound_s: dict[str, float]  # per phase: the part of compute_s in memory-bound ops
    comm_s: dict[str, float]          # per group: dp, mp, world, host (all of it, overlapped or not)
    hidden_s: float                   # communication that ran beside backward's compute
    step_s: float
    flops: int                        # measured forward + backward FLOPs of this GPU
    overlap: str
    inter: str = "node"

    @property
    def tflops_per_gpu(self) -> float:
        """Model FLOPs (measured, recompute included) per second, in TFLOPS."""
        return self.flops / self.step_s / 1e12

    @property
    def memory_bound_share(self) -> float:
        """The fraction of compute time spent in memory-bound ops (the optimizer step included)."""
        return sum(self.memory_bound_s.values()) / sum(self.compute_s.values())

    @property
    def exposed_comm_s(self) -> float:
        return sum(self.comm_s.values()) - self.hidden_s


def step_time(result, machine: Machine, overlap: str = "none", rank: int = 0,
              inter: str = "node") -> StepTime:
    """The time of ``result``'s (a :class:`~zerospec.training.scale.ScaleResult` measured with
    ``count_flops=True``) one step on ``machine`` for global rank ``rank``; ``inter``: how a ring
    leaving the node uses its InfiniBand ("node" or "link", module doc)."""
    if overlap not in OVERLAP:
        raise ValueError(f"overlap must be one of {OVERLAP}, got {overlap!r}")
    if getattr(result.config, "qgz", False):
        raise ValueError("step_time cannot time qgZ's all-to-alls (zero/zeropp.py): the time "
                         "model has ring collectives only; accepted: a step with qgz=False")
    out = result.rank_class(rank).output
    if out is None or not out.ops or not (out.flops[0]["forward"] or out.flops[0]["backward"]):
        raise ValueError("step_time needs a whole step measured with count_flops=True "
                         "(setup_only=False); got no FLOPs")
    flops, compute, bound = out.flops[0], {}, {}
    for phase in ("forward", "backward"):
        compute[phase], bound[phase] = ops_seconds(machine, out.ops[0][phase])
    compute["step"] = bound["step"] = (out.optim_elements[0] * OPTIM_BYTES_PER_PARAM
                                       / machine.hbm_bytes_per_s)
    # hpZ's secondary partition: consecutive ranks inside a node (zero/hpz.py); MiCS's partition
    # group p consecutive ranks, its replication group every p-th rank (comm/groups.py)
    p = getattr(result.config, "shard_group", None) or 1
    stride = {"mp": 1, "world": 1, "dp": result.config.n_m, "host": 1, "hpz": 1, "shard": 1,
              "replica": p}
    comm: dict[str, float] = defaultdict(float)
    overlappable = 0.0
    for rec in result.comm_ledger([rank]).records(rank):
        t = collective_seconds(machine, rec.op, rec.group_size, stride[rec.group],
                               rec.bytes_sent, rec.bytes_recv, inter)
        comm[rec.group] += t
        if overlap == "backward" and rec.phase == "backward" and rec.group in ("dp", "world", "hpz",
                                                                               "shard", "replica"):
            overlappable += t
    hidden = min(overlappable, compute["backward"])
    step = sum(compute.values()) + sum(comm.values()) - hidden
    return StepTime(compute, bound, dict(comm), hidden, step, flops["forward"] + flops["backward"],
                    overlap, inter)
