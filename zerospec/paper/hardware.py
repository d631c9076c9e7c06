"""The machines of the evaluation, from spec sheets: a GPU node and how its GPUs talk (C40, C42).

Every constant names its source; none is fitted to the paper's results. A :class:`Machine` is
frozen data, so describing another cluster is one constructor call (``H200_NODE`` below is the
second example). Bandwidths are **per direction**: a ring moves data one way around, and every
link of it sends and receives at once, so a ring step is paced by one direction's bandwidth.
Spec sheets often print the two directions added up (NVLink's "300 GB/s" is 150 GB/s each way).
Units are SI throughout: bytes/s, FLOP/s, seconds (the paper's GB and TFlops are decimal too).

**Link classes**, one taxonomy for every user (the time model, the planner, later ZeRO++ and
offload): *inside a node* (``intra``: the GPU's NVLink/NVSwitch port), *across nodes* (``inter``:
the node's NICs together, ``nics_per_node`` of them; :attr:`Machine.nic_bytes_per_s` is one) and
*PCIe* (``host``: the GPU's link to host memory) and *NVMe* (``nvme``: the host's link to its
swap directory, ZeRO-Offload's and ZeRO-Infinity's third tier; no bandwidth field yet).
:data:`LINKS` names them; the communication ledger books every transfer under one
(zerospec/comm/ledger.py), rank r sitting on node r // gpus_per_node (spec/nodes.md).

The timing model that uses these lives in zerospec/evaluation/timing.py.
"""
from __future__ import annotations

import dataclasses
from fractions import Fraction

GB = 10**9
TERA = 10**12
GBIT = 10**9 // 8        # bytes/s in one Gbit/s
LINKS = ("intra", "inter", "host", "nvme")   # inside a node, across nodes, PCIe, NVMe (module doc)


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

    @property
    def nic_bytes_per_s(self) -> Fraction:
        """One NIC, per direction: the node's across-node bandwidth over its NICs."""
        return Fraction(self.inter_bytes_per_s, self.nics_per_node)

    def ring_bytes_per_s(self, gpus: int) -> Fraction:
        """Per GPU, per direction, for one ring over ``gpus`` consecutive GPUs: the switch's
        inside a node; one NIC once it leaves the node, the slower of timing.py's two readings
        (C42's: a ring that spreads over all the node's NICs gets up to ``inter``)."""
        if gpus <= self.gpus_per_node:
            return Fraction(self.intra_bytes_per_s)
        return min(Fraction(self.intra_bytes_per_s), self.nic_bytes_per_s)

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

# -- today's DGX nodes, from NVIDIA's datasheets -------------------------------------------------------
# [A100] NVIDIA A100 Tensor Core GPU datasheet (2021, SXM): "BF16 Tensor Core 312 TFLOPS | 624
#        TFLOPS*" and the same for FP16 (* with sparsity: 312 dense); "GPU Memory 40GB HBM2 | 80GB
#        HBM2e", "GPU Memory Bandwidth 1,555GB/s | 2,039GB/s"; "Interconnect NVLink: 600GB/s"
#        (both directions of 12 NVLink3 links, 12 × 25 GB/s each way = 300 GB/s).
# [DGX-A] NVIDIA DGX A100 datasheet (2020, the 320GB and 640GB systems): 8 × A100 40GB / 80GB,
#        6 NVSwitches; "8x Single-Port Mellanox ConnectX-6 VPI 200Gb/s HDR InfiniBand" for the
#        compute fabric (the storage NICs are not counted): one 200 Gb/s NIC per GPU.
# [PCIe4] PCI Express 4.0 x16: 16 GT/s × 16 × 128b/130b = 31.5 GB/s per direction.
# [H100] NVIDIA H100 Tensor Core GPU datasheet (2023, H100 SXM): "GPU memory 80GB", "GPU memory
#        bandwidth 3.35TB/s", "BF16 Tensor Core 1,979 teraFLOPS*" and FP16 the same (* with
#        sparsity: 989.5 dense, printed 989 elsewhere), "NVIDIA NVLink: 900GB/s" (both directions
#        of 18 NVLink4 links, 18 × 25 GB/s each way = 450 GB/s).
# [DGX-H100] NVIDIA DGX H100 datasheet (2023): 8 × H100 80GB, 4 NVSwitches; 4 OSFP ports serving
#        8 single-port ConnectX-7 VPI at 400 Gb/s InfiniBand/Ethernet for the compute fabric (the
#        storage NICs are not counted): one 400 Gb/s NIC per GPU; PCIe Gen5 to the host ([PCIe5]).
# GEMM efficiency: no published measurement of the Markidis kind (cuBLAS, large GEMMs, peak
# named) is cited here for A100 or H100, and reusing the V100's fraction would be a guess that
# looks like data. So these machines run at the spec sheet's dense peak (efficiency 1): an UPPER
# BOUND on compute speed, and modelled compute times on them are lower bounds. (The H200 node
# above keeps its reused V100 fraction, as it was introduced.)
SPEC_SHEET_PEAK = Fraction(1)


def _dgx(name: str, memory_bytes: int, hbm_bytes_per_s: int, peak_flops: int,
         nvlink_both_ways: int, nic_gbit: int, host_bytes_per_s: int, sources) -> Machine:
    """A DGX node of 8 GPUs with one compute NIC per GPU, NCCL's latencies as for the DGX-2."""
    return Machine(
        name=name, gpus_per_node=8, memory_bytes=memory_bytes, peak_flops=peak_flops,
        hbm_bytes_per_s=hbm_bytes_per_s,
        intra_bytes_per_s=nvlink_both_ways // 2,          # the datasheet counts both directions
        inter_bytes_per_s=8 * nic_gbit * GBIT,            # 8 NICs × Gb/s, as bytes/s per node
        host_bytes_per_s=host_bytes_per_s,
        alpha_base_s=8.4e-6, alpha_intra_s=5.7e-6, alpha_inter_s=6.6e-6,   # [NCCL], as for DGX-2
        gemm_efficiency=SPEC_SHEET_PEAK, nics_per_node=8,
        sources=(*sources, "NCCL 2.5 src/graph/tuning.cc", "GEMM at spec-sheet peak (upper bound)"))


DGX_A100_40GB = _dgx("DGX A100 (8 × A100-SXM4-40GB)", memory_bytes=40 * GB,            # [A100]
                     hbm_bytes_per_s=1555 * GB, peak_flops=312 * TERA,                  # [A100]
                     nvlink_both_ways=600 * GB, nic_gbit=200,                           # [A100] [DGX-A]
                     host_bytes_per_s=31_500_000_000,                                   # [PCIe4]
                     sources=("NVIDIA A100 datasheet", "NVIDIA DGX A100 datasheet", "PCIe 4.0 spec"))
DGX_A100_80GB = _dgx("DGX A100 (8 × A100-SXM4-80GB)", memory_bytes=80 * GB,            # [A100]
                     hbm_bytes_per_s=2039 * GB, peak_flops=312 * TERA,                  # [A100]
                     nvlink_both_ways=600 * GB, nic_gbit=200,                           # [A100] [DGX-A]
                     host_bytes_per_s=31_500_000_000,                                   # [PCIe4]
                     sources=("NVIDIA A100 datasheet", "NVIDIA DGX A100 datasheet", "PCIe 4.0 spec"))
DGX_H100 = _dgx("DGX H100 (8 × H100-SXM5-80GB)", memory_bytes=80 * GB,                 # [H100]
                hbm_bytes_per_s=3350 * GB, peak_flops=989_500 * 10**9,                  # [H100] dense
                nvlink_both_ways=900 * GB, nic_gbit=400,                                # [H100] [DGX-H100]
                host_bytes_per_s=63 * GB,                                               # [PCIe5]
                sources=("NVIDIA H100 datasheet", "NVIDIA DGX H100 datasheet", "PCIe 5.0 spec"))

# -- the H100 of torchtitan's published benchmark (spec/validation.md) -------------------------------
# [TT-bench] pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md (added in 820504e2;
#        runs of torchtitan 9dec370): "Grand Teton platform", "8 NVIDIA H100 GPUs fully connected
#        with NVLink", "96GB HBM2e with 2.4 TB/sec peak memory bandwidth", "400 Gb/s per GPU"
#        RDMA, "default 500W power limit"; footnote: an "HBM2e-based SXM H100 with lower TDP, the
#        actual peak TFLOPs number is between SXM and NVL, and we don't know its exact value".
# Its "96GB" is the spec sheet's (decimal, as every memory_bytes here); torchtitan prints memory
# in GiB = 2^30 B (torchtitan/metrics.py, _to_gib), so 82.4 GiB is 88.5 GB. No NVIDIA datasheet
# lists this part. The peak is the H100 SXM's dense 989.5 TFLOPS ([H100]), an UPPER bound by the
# footnote (the NVL's 835 is the lower one); NVLink is the HGX H100 baseboard's 900 GB/s both ways
# ([H100]), an inference from "fully connected with NVLink" on an SXM part; PCIe Gen5 to the host
# as every H100 SXM ([PCIe5]).
GRAND_TETON_H100 = _dgx("Grand Teton (8 × H100-SXM-96GB-HBM2e)", memory_bytes=96 * GB,   # [TT-bench]
                        hbm_bytes_per_s=2400 * GB,                                      # [TT-bench]
                        peak_flops=989_500 * 10**9,                  # [H100] upper bound, see above
                        nvlink_both_ways=900 * GB,                   # [H100] inferred, see above
                        nic_gbit=400,                                                   # [TT-bench]
                        host_bytes_per_s=63 * GB,                                       # [PCIe5]
                        sources=("torchtitan benchmarks/llama3_h100_202412_torchtitan.md",
                                 "NVIDIA H100 datasheet (peak, NVLink: bounds)", "PCIe 5.0 spec"))

# the names --machine accepts (zerospec plan, zerospec scale); `paper` keeps the DGX-2
MACHINES = {"dgx2": DGX2, "h200": H200_NODE, "dgx-a100-40gb": DGX_A100_40GB,
            "dgx-a100-80gb": DGX_A100_80GB, "dgx-h100": DGX_H100,
            "grand-teton-h100": GRAND_TETON_H100}


# -- ZeRO-Infinity's three tiers on a DGX-2 node (C-I7) ------------------------------------------------
# [DGX-2] NVIDIA DGX-2 datasheet (2019): "System Memory 1.5TB", "Storage ... Internal Storage: 30TB
#        (8X 3.84TB) NVMe SSDs"; 16 × 32 GB of GPU memory ([DGX-2], as DGX2 above).
# [PCIe] each U.2 NVMe drive hangs off PCI Express 3.0 x4: 8 GT/s × 4 × 128b/130b = 3.94 GB/s
#        per direction. That is the link's bound on a drive, not the drive's own rate (not
#        sourced here): the node's NVMe bandwidth below is an UPPER bound.
@dataclasses.dataclass(frozen=True)
class Tiers:
    """One node's memory tiers, capacities and the NVMe link (bytes, bytes/s per direction)."""

    name: str
    gpu_bytes: int            # per node: its GPUs' memory together
    host_bytes: int           # per node: CPU memory
    nvme_bytes: int           # per node: NVMe capacity
    nvme_bytes_per_s: int     # per node, per direction: all its drives' links together
    sources: tuple[str, ...] = ()


DGX2_TIERS = Tiers(
    name="DGX-2 tiers", gpu_bytes=16 * 32 * GB,           # [DGX-2]
    host_bytes=1500 * GB,                                 # [DGX-2] 1.5 TB
    nvme_bytes=8 * 3840 * GB,                             # [DGX-2] 8 × 3.84 TB
    nvme_bytes_per_s=8 * 3_938_461_538,                   # [PCIe] 8 drives × Gen3 x4 (upper bound)
    sources=("NVIDIA DGX-2 datasheet", "PCIe 3.0 spec"))
