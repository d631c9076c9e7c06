"""The machines of the evaluation, from spec sheets: a GPU node and how its GPUs talk (C40, C42).

Every constant names its source; none is fitted to the paper's results. A :class:`Machine` is
frozen data, so describing another cluster is one constructor call (``H200_NODE`` below is the
second example). Bandwidths are **per direction**: a ring moves data one way around, and every
link of it sends and receives at once, so a ring step is paced by one direction's bandwidth.
Spec sheets often print the two directions added up (NVLink's "300 GB/s" is 150 GB/s each way).
Units are SI throughout: bytes/s, FLOP/s, seconds (the paper's GB and TFlops are decimal too).

The timing model that uses these lives in zerospec/evaluation/timing.py.
"""
from __future__ import annotations

import dataclasses
from fractions import Fraction

GB = 10**9
TERA = 10**12
GBIT = 10**9 // 8        # bytes/s in one Gbit/s


@dataclasses.dataclass(frozen=True)
class Machine:
    """One kind of node, repeated: its GPUs, their memory, and the three links a byte can take."""

    name: str
    gpus_per_node: int
    memory_bytes: int              # per GPU
    peak_flops: int                # per GPU, fp16 dense tensor-core FLOP/s
    hbm_bytes_per_s: int           # per GPU
    intra_bytes_per_s: int         # per GPU, per direction, to any GPU of its node (switched)
    inter_bytes_per_s: int         # per NODE, per direction: all its NICs together
    host_bytes_per_s: int          # per GPU, per direction, GPU <-> host memory (P_a+cpu)
    alpha_base_s: float            # a collective's fixed launch latency
    alpha_intra_s: float           # per ring step inside a node
    alpha_inter_s: float           # per ring step when the ring leaves the node
    gemm_efficiency: Fraction      # achieved / peak FLOP/s of large fp16 GEMMs (published)
    nics_per_node: int = 1         # the links inter_bytes_per_s adds up (one IB link: inter / nics)
    sources: tuple[str, ...] = ()  # where the numbers come from

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, (int, float, Fraction)) and not isinstance(v, bool) and v <= 0:
                raise ValueError(f"Machine.{f.name} must be > 0, got {v!r}")
        if not 0 < self.gemm_efficiency <= 1:
            raise ValueError(f"gemm_efficiency must be in (0, 1], got {self.gemm_efficiency}")

    def nodes(self, gpus: int) -> int:
        """Nodes ``gpus`` GPUs occupy, filling nodes in rank order."""
        return -(-gpus // self.gpus_per_node)


# -- the paper's cluster: 25 NVIDIA DGX-2 (C40) ------------------------------------------------------
# [V100] NVIDIA Tesla V100 GPU datasheet (2018, V100 SXM2/SXM3): "Tensor Performance 125 TFLOPS",
#        "Memory Bandwidth 900 GB/sec", "Interconnect Bandwidth NVLink 300 GB/sec" (both directions
#        of its 6 NVLink2 links, 6 × 25 GB/s each way).
# [DGX-2] NVIDIA DGX-2 datasheet (2019): 16 × V100 32 GB, 12 NVSwitches "2.4 TB/s bisection",
#        "8X 100Gb/sec Infiniband/100GigE"; [C40]/[SC] AE: 8 × 100 Gbps ConnectX-5 per node.
# [PCIe] PCI Express 3.0 x16: 8 GT/s × 16 lanes × 128b/130b = 15.75 GB/s per direction.
# [NCCL] NCCL 2.5 src/graph/tuning.cc (2019): Ring/Simple baseLat 8.4 us, hwLat per ring step
#        NVLink 5.7 us, NET 6.6 us (the release of the paper's time; it ran NCCL 2.4.8, C40).
# [GEMM] S. Markidis et al., "NVIDIA Tensor Core Programmability, Performance & Precision",
#        IPDPSW 2018 (arXiv:1803.04014): cuBLAS mixed-precision GEMM reaches up to 83 TFLOPS on a
#        V100 of 125 TFLOPS peak. Not a fit to ZeRO's numbers: published two years before them.
V100_GEMM_EFFICIENCY = Fraction(83, 125)

DGX2 = Machine(
    name="DGX-2 (16 × V100-SXM3-32GB)",
    gpus_per_node=16,                                  # [DGX-2]
    memory_bytes=32 * GB,                              # [DGX-2], Table 1's 32 GB
    peak_flops=125 * TERA,                             # [V100]
    hbm_bytes_per_s=900 * GB,                          # [V100]
    intra_bytes_per_s=150 * GB,                        # [V100] 300 GB/s counts both directions
    inter_bytes_per_s=8 * 100 * GBIT,                  # [DGX-2] 8 × 100 Gbps = 100 GB/s per node
    host_bytes_per_s=15_750_000_000,                   # [PCIe] Gen3 x16
    alpha_base_s=8.4e-6, alpha_intra_s=5.7e-6, alpha_inter_s=6.6e-6,   # [NCCL]
    gemm_efficiency=V100_GEMM_EFFICIENCY,              # [GEMM]
    nics_per_node=8,                                   # [DGX-2] 8 × 100 Gbps: 12.5 GB/s a link (C42)
    sources=("NVIDIA Tesla V100 datasheet", "NVIDIA DGX-2 datasheet", "PCIe 3.0 spec",
             "NCCL 2.5 src/graph/tuning.cc", "Markidis et al. IPDPSW 2018"),
)

# -- a second example: an HGX H200 node ----------------------------------------------------------------
# [H200] NVIDIA H200 Tensor Core GPU datasheet (2024, SXM): FP16 tensor 1,979 TFLOPS *with
#        sparsity* = 989.5 dense; 141 GB HBM3e at 4.8 TB/s; NVLink 900 GB/s (both directions).
# [DGX-H] NVIDIA DGX H200/H100 user guide: 8 GPUs, 8 × 400 Gb/s ConnectX-7 for the compute fabric.
# [PCIe5] PCI Express 5.0 x16: 32 GT/s × 16 × 128b/130b = 63 GB/s per direction.
# Its GEMM efficiency has no source of the V100's kind here: the V100's fraction is reused and
# marked so; replace it with a measured one (issue #16's device check) before reading much into it.
H200_NODE = Machine(
    name="HGX H200 (8 × H200-SXM-141GB)",
    gpus_per_node=8,                                   # [DGX-H]
    memory_bytes=141 * GB,                             # [H200]
    peak_flops=989_500 * 10**9,                        # [H200] dense
    hbm_bytes_per_s=4800 * GB,                         # [H200]
    intra_bytes_per_s=450 * GB,                        # [H200] 900 GB/s counts both directions
    inter_bytes_per_s=8 * 400 * GBIT,                  # [DGX-H] 8 × 400 Gbps = 400 GB/s per node
    host_bytes_per_s=63 * GB,                          # [PCIe5]
    alpha_base_s=8.4e-6, alpha_intra_s=5.7e-6, alpha_inter_s=6.6e-6,   # [NCCL], as for DGX-2
    gemm_efficiency=V100_GEMM_EFFICIENCY,              # reused, see above
    nics_per_node=8,                                   # [DGX-H]
    sources=("NVIDIA H200 datasheet", "NVIDIA DGX H200 user guide", "PCIe 5.0 spec",
             "NCCL 2.5 src/graph/tuning.cc", "V100 GEMM efficiency reused"),
)

MACHINES = {"dgx2": DGX2, "h200": H200_NODE}
