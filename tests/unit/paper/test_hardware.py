"""The spec-sheet machines of zerospec/paper/hardware.py: each one's figures are its datasheet's, and
the link classes (inside a node, across nodes, PCIe) give the bandwidths a ring and a plan use."""
from __future__ import annotations

from fractions import Fraction

import pytest

from zerospec.paper.hardware import DGX2, MACHINES, Machine

G = 10**9

# The datasheets' figures, written once here (per GPU; NVLink as printed: both directions added):
#   NVIDIA A100 Tensor Core GPU datasheet (SXM): 312 TFLOPS bf16/fp16 dense (624 with sparsity),
#     40GB HBM2 at 1,555 GB/s or 80GB HBM2e at 2,039 GB/s, NVLink 600 GB/s;
#   NVIDIA DGX A100 datasheet: 8 GPUs, 8 × single-port ConnectX-6 200 Gb/s HDR InfiniBand; PCIe Gen4;
#   NVIDIA H100 Tensor Core GPU datasheet (H100 SXM): 1,979 TFLOPS bf16/fp16 with sparsity,
#     80GB at 3.35 TB/s, NVLink 900 GB/s;
#   NVIDIA DGX H100 datasheet: 8 GPUs, 8 × single-port ConnectX-7 400 Gb/s; PCIe Gen5.
DATASHEET = {   # key: (GPUs, memory GB, HBM GB/s, dense TFLOPS, NVLink GB/s both ways, NIC Gb/s, PCIe gen)
    "dgx-a100-40gb": (8, 40, 1555, 312, 600, 200, 4),
    "dgx-a100-80gb": (8, 80, 2039, 312, 600, 200, 4),
    "dgx-h100": (8, 80, 3350, Fraction(1979, 2), 900, 400, 5),
}
TODAYS = list(DATASHEET)


def pcie_x16_bytes_per_s(gen: int) -> Fraction:
    """PCIe x16, one direction: GT/s per lane × 16 lanes × 128b/130b encoding, in bytes/s."""
    return Fraction({3: 8, 4: 16, 5: 32}[gen] * G * 16 * 128, 130 * 8)


@pytest.mark.parametrize("key", TODAYS)
def test_each_dgx_is_its_datasheet(key):
    """GPUs, memory, HBM and dense peak as the datasheet prints them; NVLink's printed figure is
    twice the per-direction field; the node's across-node aggregate is its 8 NICs' Gb/s in bytes."""
    gpus, mem_gb, hbm_gb, tflops, nvlink_gb, nic_gbit, _ = DATASHEET[key]
    m = MACHINES[key]
    assert (m.gpus_per_node, m.memory_bytes, m.hbm_bytes_per_s) == (gpus, mem_gb * G, hbm_gb * G)
    assert m.peak_flops == tflops * 10**12
    assert m.intra_bytes_per_s * 2 == nvlink_gb * G
    assert m.inter_bytes_per_s == gpus * nic_gbit * G / 8          # bits → bytes, per node


@pytest.mark.parametrize("key", TODAYS)
def test_each_gpu_of_a_dgx_has_one_nic_across_nodes(key):
    """One NIC per GPU: a NIC's bytes/s (200 Gb/s = 25 GB/s, 400 Gb/s = 50 GB/s) is the node's
    aggregate over its GPUs, and a ring that leaves the node runs at it."""
    m, nic_gbit = MACHINES[key], DATASHEET[key][5]
    assert m.nics_per_node == m.gpus_per_node
    assert m.nic_bytes_per_s == nic_gbit * G / 8 == Fraction(m.inter_bytes_per_s, m.gpus_per_node)
    assert m.ring_bytes_per_s(m.gpus_per_node + 1) == nic_gbit * G / 8


@pytest.mark.parametrize("key", TODAYS)
def test_each_dgx_reaches_the_host_over_pcie_x16_of_its_generation(key):
    """The host link is PCIe Gen4 (A100) or Gen5 (H100) x16, one direction, to within 0.1%
    (the field rounds to 31.5 and 63 GB/s as the DGX-2's rounds Gen3 to 15.75)."""
    m = MACHINES[key]
    assert m.host_bytes_per_s == pytest.approx(pcie_x16_bytes_per_s(DATASHEET[key][6]), rel=1e-3)
    assert DGX2.host_bytes_per_s == pytest.approx(pcie_x16_bytes_per_s(3), rel=1e-3)


def test_a_ring_inside_a_node_runs_at_nvlink_and_one_leaving_it_at_one_nic():
    """The link class follows the GPUs a ring spans: the DGX-2's 16 GPUs at 150 GB/s a direction,
    the 17th puts it on one 100 Gb/s link (C42's 12.5 GB/s); a DGX H100's 8 at 450, then 50."""
    h100 = MACHINES["dgx-h100"]
    assert [DGX2.ring_bytes_per_s(n) for n in (2, 16, 17, 400)] == [150 * G, 150 * G, 12.5 * G, 12.5 * G]
    assert [h100.ring_bytes_per_s(n) for n in (8, 9)] == [450 * G, 50 * G]


@pytest.mark.parametrize("key", TODAYS)
def test_todays_gpus_run_gemms_at_their_spec_sheet_peak_an_upper_bound(key):
    """No published GEMM efficiency is cited for the A100 or H100: the field is 1, so a GEMM is
    timed at the datasheet's dense peak (an upper bound on speed); only the V100's 83/125 is measured."""
    from zerospec.evaluation.timing import op_seconds
    from zerospec.runtime.opcount import Op
    m = MACHINES[key]
    gemm = Op("aten.mm", flops=2 * 8192**3, read=2 * 2 * 8192**2, written=2 * 8192**2)   # bf16
    assert m.gemm_efficiency == 1 and DGX2.gemm_efficiency < 1
    assert op_seconds(m, gemm) == (2 * 8192**3 / float(DATASHEET[key][3] * 10**12), False)


def test_the_machine_keys_are_the_accepted_names():
    """`--machine` accepts the two machines that were there, today's three DGX nodes and the
    H100 of torchtitan's benchmark."""
    assert list(MACHINES) == ["dgx2", "h200", "dgx-a100-40gb", "dgx-a100-80gb", "dgx-h100",
                              "grand-teton-h100"]
    assert all(isinstance(m, Machine) for m in MACHINES.values())


def test_torchtitans_h100_is_its_benchmark_pages_96_gb_hbm2e_part():
    """torchtitan's benchmarks/llama3_h100_202412_torchtitan.md: 8 H100s a host, 96 GB HBM2e
    (decimal: 96e9 B, 89.4 GiB) at 2.4 TB/s, 400 Gb/s RDMA per GPU; its peak is bounded above by
    the H100 SXM's dense 989.5 TFLOPS (the page: "between SXM and NVL")."""
    m = MACHINES["grand-teton-h100"]
    assert (m.gpus_per_node, m.memory_bytes, m.hbm_bytes_per_s) == (8, 96 * G, 2400 * G)
    assert m.inter_bytes_per_s == 8 * 400 * G / 8 and m.nics_per_node == 8
    assert 835 * 10**12 < m.peak_flops <= MACHINES["dgx-h100"].peak_flops
    assert Fraction(m.memory_bytes, 2**30) == Fraction(96 * G, 2**30) < 90
