"""The paper's closed forms, each once, with its claim id (docs/claims.md).

Notation as in the paper: ``psi`` (Ψ) parameters, ``k`` (K) optimizer-state bytes per parameter,
``n_d`` (N_d) data-parallel degree, ``n_m`` (N_m) model-parallel degree. Memory is in bytes,
communication in *elements* (C20). Results are exact :class:`fractions.Fraction` where a division
can leave a remainder, so tests compare with ``==``; callers round only for display.
:data:`STAGES` is the one stage table: every stage label, formula text and claim id in zerospec
(the stage classes, the report's and plan's rows, the tests' ids and claim marks) is read from it.
"""
from __future__ import annotations

import dataclasses
from fractions import Fraction

K_ADAM = 12          # C2: fp32 master + momentum + variance = 4 + 4 + 4 bytes per parameter
FP16 = 2             # bytes per fp16 parameter or gradient (C2)
GB = 10**9           # the paper's tables use decimal units


# -- the stage table: every stage label, formula text and claim id derives from here ----------------
@dataclasses.dataclass(frozen=True)
class Stage:
    """One ZeRO-DP stage as §5 names it, with the claim ids its memory and communication tests carry."""
    index: int             # 0..3, the DeepSpeed stage number
    label: str             # the paper's notation: DP, P_os, P_os+g, P_os+g+p
    partitioned: str       # what the stage partitions on top of the previous one
    formula: str           # per-GPU model states at K = 12 (C6–C9), as the paper writes it
    memory_claim: str      # the claim id of ``formula``
    comm_claim: str        # the claim id of the stage's communication volume (C21–C24)

    @property
    def name(self) -> str:
        """``ZeRO-2 (P_os+g)``: the DeepSpeed number people search for, then the paper's label."""
        return f"ZeRO-{self.index} ({self.label})"


STAGES = (
    Stage(0, "DP", "nothing", "16Ψ", "C6", "C21"),
    Stage(1, "P_os", "optimizer states", "4Ψ+12Ψ/N", "C7", "C23"),  # C23: 2Ψ, as DP, not 3Ψ
    Stage(2, "P_os+g", "+ gradients", "2Ψ+14Ψ/N", "C8", "C22"),
    Stage(3, "P_os+g+p", "+ parameters", "16Ψ/N", "C9", "C24"),
)


def stage(index: int) -> Stage:
    """The row of :data:`STAGES` for stage ``index`` (0, 1, 2 or 3)."""
    if index not in range(len(STAGES)):
        raise ValueError(f"stage must be one of 0, 1, 2, 3, got {index!r}")
    return STAGES[int(index)]


def check(psi, n_d, index=None) -> None:
    """Raise ValueError naming the bad value unless Ψ > 0, N_d is an integer >= 1 and the stage
    ``index`` is 0..3 (or None: no stage)."""
    if psi <= 0:
        raise ValueError(f"psi (parameter count) must be > 0, got {psi!r}")
    if n_d < 1 or int(n_d) != n_d:
        raise ValueError(f"n_d must be an integer >= 1, got {n_d!r}")
    if index is not None:
        stage(index)


def model_state_bytes(stage: int, psi, n_d: int, k: int = K_ADAM, p: int = FP16) -> Fraction:
    """Per-device model-state bytes of ZeRO-DP stage ``stage``.

    C6 (DP): (2+2+K)Ψ.  C7 (P_os): 4Ψ + KΨ/N_d.  C8 (P_os+g): 2Ψ + (2+K)Ψ/N_d.
    C9 (P_os+g+p): (2+2+K)Ψ/N_d.  ``p`` generalises the 2 bytes of each fp16 parameter and
    gradient to other precision policies (fp32 without a master copy: p = 4, K = 8).
    """
    check(psi, n_d, stage)
    psi = Fraction(psi)
    if stage == 0:
        return (2 * p + k) * psi
    if stage == 1:
        return 2 * p * psi + k * psi / n_d
    if stage == 2:
        return p * psi + (p + k) * psi / n_d
    return (2 * p + k) * psi / n_d


def ring_factor(n_d: int) -> Fraction:
    """(N_d − 1)/N_d: what one reduce-scatter or all-gather moves per Ψ per rank (C21, SC'20)."""
    return Fraction(n_d - 1, n_d)


# ZeRO-1's two gradient syncs: the paper's reduce-scatter (2Ψ, C22) and DeepSpeed's first
# all-reduce (3Ψ, C23); the stage (zerospec/zero/stage1_os.py) and the command line accept these
ZERO1_COMM = ("reduce_scatter", "all_reduce")


def comm_elements(stage: int, psi, n_d: int, zero1_comm: str = "reduce_scatter") -> Fraction:
    """Elements each rank sends per step under the ring model.

    C21: DP all-reduce = RS + AG = 2Ψ(N−1)/N.  C22: P_os+g = RS(Ψ) + AG(Ψ) = 2Ψ(N−1)/N.
    C23: P_os adds nothing over DP with a reduce-scatter (2Ψ); DeepSpeed's first version all-reduced
    the gradients, then all-gathered the parameters: 3Ψ(N−1)/N (1.5×).
    C24/C57: P_os+g+p = AG forward (Ψ) + AG backward (Ψ) + RS (Ψ) = 3Ψ(N−1)/N.
    """
    check(psi, n_d, stage)
    passes = 2
    if stage == 3 or (stage == 1 and zero1_comm == "all_reduce"):
        passes = 3
    return passes * Fraction(psi) * ring_factor(n_d)


def comm_in_psi(stage: int, zero1_comm: str = "reduce_scatter") -> int:
    """The paper's large-N volumes in units of Ψ: 2, 2, 2, 3 (C21–C25)."""
    check(1, 1, stage)
    return 3 if stage == 3 or (stage == 1 and zero1_comm == "all_reduce") else 2


def reduction_factor(stage: int, n_d: int, k: int = K_ADAM) -> Fraction:
    """Memory reduction over DP: → 4×, 8×, N_d as N_d grows (C7, C8, C9, C13)."""
    return model_state_bytes(0, 1, n_d, k) / model_state_bytes(stage, 1, n_d, k)


def max_params(stage: int, gpu_bytes, n_d: int, n_m: int = 1, k: int = K_ADAM) -> Fraction:
    """Largest Ψ whose model states fit in ``gpu_bytes`` per GPU, with MP dividing every term (C17)."""
    check(1, n_d, stage)
    return Fraction(gpu_bytes) * n_m / model_state_bytes(stage, 1, n_d, k)


def activation_elements(hd: int, batch: int, seq: int, layers: int) -> int:
    """Total transformer activations ≈ 12 × hd × batch × seq × layers elements (C27 footnote)."""
    return 12 * hd * batch * seq * layers


def transformer_params(layers: int, hd: int) -> int:
    """Parameters of the transformer blocks ≈ 12 × layers × hd² (C26, C50; embeddings excluded)."""
    return 12 * layers * hd * hd


def optimizer_elements(stage: int, psi, n_d: int) -> Fraction:
    """Elements one rank's optimizer step updates: all Ψ in DP, its 1/N_d partition from P_os on
    (C7: rank i updates only partition i)."""
    check(psi, n_d, stage)
    return Fraction(psi) if stage == 0 else Fraction(psi) / n_d


def forward_flops(psi, tokens: int) -> int:
    """Dense-model rule: forward ≈ 2Ψ FLOPs per token, backward twice that (C-I5: 2 × 4 × bsz × seq
    × params per iteration, the 4 = forward + 2 × backward + recompute)."""
    return 2 * int(psi) * tokens


# -- the paper's printed tables ----------------------------------------------------------------------
TABLE1_PSI = {"7.5B": 7.5e9, "128B": 128e9, "1T": 1e12}
TABLE1_ND = (1, 4, 16, 64, 256, 1024)
TABLE2_MP = (1, 2, 4, 8, 16)
V100_BYTES = 32 * GB   # Table 1 caption: 32 GB V100s


def table1(psi: float, n_d: int) -> dict[int, Fraction]:
    """Table 1 cells for one model and N_d: per-device GB for P_os, P_os+g, P_os+g+p (C15, C16)."""
    return {s: model_state_bytes(s, Fraction(psi), n_d) / GB for s in (1, 2, 3)}


def table1_bold(psi: float) -> dict[int, int | None]:
    """C15: per stage, the smallest N_d of Table 1 whose cell fits 32 GB (inclusive), or None."""
    out = {}
    for s in (1, 2, 3):
        fits = [n for n in TABLE1_ND if model_state_bytes(s, Fraction(psi), n) <= V100_BYTES]
        out[s] = fits[0] if fits else None
    return out


def table2_row(n_m: int, n_d: int = 64, gpu_bytes=V100_BYTES) -> dict[int, Fraction]:
    """Table 2 theoretical maximum model sizes (parameters) for MP degree ``n_m`` (C17)."""
    return {s: max_params(s, gpu_bytes, n_d, n_m) for s in range(4)}


def gpt_forward_flops(n_layer: int, d: int, vocab: int, batch: int, seq: int) -> int:
    """Forward FLOPs of a GPT on ``batch × seq`` tokens: 2 FLOPs per multiply-add of every matmul.

    Blocks: 12·d² weights per layer (C26's 4 + 8) → 2·tokens·12·d²·L; attention scores and the
    weighted sum 2 × 2·batch·seq²·d per layer; tied LM head 2·tokens·vocab·d. Embedding lookups,
    LayerNorm and softmax are not matmuls (torch's FLOP formulas count them as 0, as the paper does).
    Backward is twice this: one matmul for the input gradient, one for the weight gradient.
    """
    tokens = batch * seq
    return 2 * tokens * (12 * d * d * n_layer + vocab * d) + 4 * batch * seq * seq * d * n_layer


def mp_over_zero_comm(batch: int, seq: int, hd: int) -> Fraction:
    """MP / ZeRO-DP communication per batch = batch·seq / (3·hd) (C26, SC'20 §VII-C)."""
    return Fraction(batch * seq, 3 * hd)


def fused_buffer_bytes(psi, dtype_bytes: int = 4):
    """A flat fused buffer over all Ψ gradients: 4Ψ bytes in fp32 (C29: 6 GB at 1.5B; C36: 12 GB at 3B)."""
    return dtype_bytes * psi


def bucket_collectives(columns: int, bucket_elements: int, rows: int = 1) -> int:
    """C_B (C36): collectives for one stream of ``columns`` columns of ``rows`` rows reduced (or
    gathered) through buckets of at most B elements: ⌈columns / ⌊B/rows⌋⌉. An all-reduce is one row
    of Σ padded columns; a reduce-scatter or all-gather is N rows of Σ chunk (zero_r/buffers.py)."""
    width = bucket_elements // rows
    if width < 1:
        raise ValueError(f"a bucket of {bucket_elements} elements holds no column of {rows} rows")
    return -(-columns // width)


# -- ZeRO++ (arXiv:2306.10209): what crosses nodes, and hpZ's memory (spec/nodes.md) --------------
def stage3_node_crossing(psi, n_d: int, hpz: bool = False) -> dict[str, Fraction]:
    """Elements that leave one node per step in stage 3, per collective, for a flat ring over
    nodes in rank order (each node's last GPU sends its whole share to the next node).

    D1: forward all-gather M + backward all-gather M + gradient reduce-scatter M = 3M, each times
    the ring factor (N−1)/N. D2's hpZ row: the backward all-gather stays inside the node: 0."""
    m = psi * ring_factor(n_d)
    return {"forward all-gather": m, "backward all-gather": Fraction(0) if hpz else m,
            "reduce-scatter": m}


def hpz_secondary_bytes(psi, h: int) -> Fraction:
    """D6: hpZ's fp16 secondary shard, 1/h of every unit per GPU, held from forward to backward:
    2Ψ/h bytes (2M/(GPUs per node) when h is the GPUs per node)."""
    return Fraction(2 * psi, h)


def offload_gpu_bytes(m, g16_on: str, update_on: str):
    """B4 (ZeRO-Offload Table 1): GPU model-state bytes of a communication-minimal split of M
    parameters; p16 and FWD-BWD stay on the GPU (2M), g16 adds 2M where it sits, the update's
    fp32 master, momentum and variance 12M. ("cpu", "cpu"): 2M, the 8x row ([ZO-n]: not 4M)."""
    for name, v in (("g16_on", g16_on), ("update_on", update_on)):
        if v not in ("gpu", "cpu"):
            raise ValueError(f"{name} must be 'gpu' or 'cpu', got {v!r}")
    return (2 + (2 if g16_on == "gpu" else 0) + (12 if update_on == "gpu" else 0)) * m
# -- MiCS (arXiv:2205.00119): p GPUs shard, N/p groups replicate (spec/mics.md) --------------------
def mics_model_state_bytes(stage: int, psi, p: int, k: int = K_ADAM) -> Fraction:
    """M1: each GPU holds stage ``stage``'s model states at N_d = p, whatever N is: 16Ψ/p in
    stage 3 (C9 with the partition group for N_d)."""
    return model_state_bytes(stage, psi, p, k)


def mics_replica_all_reduce(psi, n: int, p: int) -> Fraction:
    """M2, M3: elements each GPU sends per step in the replication all-reduce of its Ψ/p
    gradient shard, once per step whatever the number of micro-steps: 2(R − 1)/R · Ψ/p, R = N/p.
    With the partition group inside a node, the only traffic that crosses nodes."""
    return 2 * Fraction(psi, p) * ring_factor(n // p)
def zeropp_node_crossing(psi, n_d: int, per_node: int, *, hpz: bool = False, qwz: bool = False,
                         qgz: bool = False) -> dict[str, Fraction]:
    """D2: what leaves one node per step, per collective, in fp16 elements (bytes / 2), counting
    the quantized payloads only (their fp32 scales, and units qgZ sends unquantized, come on top:
    spec/zeropp.md). qwZ: int8, half of fp16's bytes (M → 0.5M); hpZ: backward inside the node
    (M → 0); qgZ: int4 through a hierarchical all-to-all, a quarter of fp16's bytes, and only
    the n_d/G nodes' (n−1)/n of it leaves a node, not the ring's (N−1)/N (M → 0.25M)."""
    m, nodes = psi * ring_factor(n_d), n_d // per_node
    w = Fraction(1, 2) if qwz else Fraction(1)
    return {"forward all-gather": m * w, "backward all-gather": Fraction(0) if hpz else m * w,
            "reduce-scatter": psi * Fraction(nodes - 1, nodes) / 4 if qgz else m}


def qgz_crossing_per_gpu(psi, n_d: int, per_node: int, hierarchical: bool = True) -> Fraction:
    """D3: fp16 elements (bytes / 2) of int4 gradient codes one GPU sends across nodes per step,
    Z = 4 (fp16 → int4). Hierarchical (intra-node all-to-all first): M/(Z·G)·(n−1)/n, every GPU
    of a node alike, M/Z·(n−1)/n per node. One hop (every GPU to every other): a GPU sends
    M/Z·(N − G)/N across, M·G/Z·(n−1)/n per node, G times as much (D3's M·N/Z, its N being G)."""
    nodes = n_d // per_node
    share = Fraction(1, per_node) if hierarchical else Fraction(1)
    return psi * share * Fraction(nodes - 1, nodes) / 4
